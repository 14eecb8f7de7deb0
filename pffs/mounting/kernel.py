"""Mountpoint checks and kernel mount table helpers.

Before mounting, a mountpoint must exist, be a directory and be empty, or be a dead pffs mount
("Transport endpoint is not connected" after a crash), which is cleared. Unmounting goes
through fusermount3 so that it works for the user who mounted, root or not.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from pffs.errors import MountFailed, MountpointError

log = logging.getLogger("pffs.mounting.kernel")
FSTYPE = "fuse.pffs"


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_table() -> list[MountEntry]:
    entries = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 2:
                entries.append(
                    MountEntry(_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[2])
                )
    return entries


def find_mount(mountpoint: str) -> MountEntry | None:
    """The mount table entry at `mountpoint` (the topmost, if stacked), or None."""
    path = os.path.abspath(mountpoint)
    found = None
    for entry in mount_table():
        if entry.mountpoint == path:
            found = entry
    return found


def is_dead(mountpoint: str) -> bool:
    """True when `mountpoint` is a FUSE mount whose daemon is gone.

    The probe is statfs: the kernel forwards every statfs to the daemon, while a stat is
    answered from its attribute cache for the mount's attribute TTL, and so reports a mount
    whose daemon was killed as alive for up to a minute.
    """
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def fusermount(mountpoint: str, lazy: bool = False) -> None:
    """Unmount a FUSE filesystem; a one-line MountFailed when the kernel refuses."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountFailed("fusermount3 not found: install the fuse3 package")
    argv = [tool, "-u", *(["-z"] if lazy else []), mountpoint]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["fusermount3 failed"])[-1]
        if "busy" in detail.lower():
            raise MountpointError(f"{mountpoint} is busy: close the files open there or use --lazy")
        raise MountFailed(f"cannot unmount {mountpoint}: {detail}")


def prepare_mountpoint(mountpoint: str) -> str:
    """Check `mountpoint` and clear a dead pffs mount there. Returns the absolute path."""
    path = os.path.abspath(mountpoint)
    entry = find_mount(path)
    if entry is not None and entry.fstype.startswith("fuse"):
        if is_dead(path):
            if entry.fstype != FSTYPE:
                raise MountpointError(
                    f"{path} is a dead {entry.fstype} mount: run fusermount3 -u {path}"
                )
            log.warning("clearing dead pffs mount at %s (%s)", path, entry.source)
            fusermount(path, lazy=True)
            if not wait_unmounted(path, timeout=5.0):
                raise MountFailed(f"the dead mount at {path} could not be cleared")
        elif entry.fstype == FSTYPE:
            raise MountpointError(f"{path} is already a pffs mount of {entry.source}")
    try:
        os.stat(path)
    except FileNotFoundError:
        raise MountpointError(f"mountpoint {path} does not exist") from None
    except OSError as exc:
        raise MountpointError(f"mountpoint {path}: {exc.strerror}") from None
    if not os.path.isdir(path):
        raise MountpointError(f"mountpoint {path} is not a directory")
    try:
        with os.scandir(path) as it:
            if next(it, None) is not None:
                raise MountpointError(f"mountpoint {path} is not empty")
    except PermissionError:
        raise MountpointError(f"mountpoint {path} is not readable") from None
    return path


def wait_unmounted(path: str, timeout: float = 10.0) -> bool:
    """Wait until no pffs mount sits at `path`; False if one is still there after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        entry = find_mount(path)
        if entry is None or entry.fstype != FSTYPE:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def set_kernel_readahead(mountpoint: str, size: int) -> bool:
    """Raise the kernel's readahead for a FUSE mount (its backing device info in sysfs).

    The default 128 KiB makes the kernel send 128 KiB reads one after another; 1 MiB or more
    lets it send the largest FUSE requests (1 MiB) several at a time. Needs root; without it
    the default stays and reads are merely slower. Reads the device from the mount table, not
    with stat(), which would ask this very file system before it serves requests.
    """
    entry = find_mount(mountpoint)
    if entry is None or size <= 0:
        return False
    try:
        with open(f"/sys/class/bdi/{entry.device}/read_ahead_kb", "w") as f:
            f.write(str(max(4, size // 1024)))
    except OSError as exc:
        log.debug("kernel readahead left at its default: %s", exc)
        return False
    return True

"""FUSE mounts probed and cleared without a way to hang the tests.

A request the kernel has handed to a FUSE daemon is waited for uninterruptibly: if the daemon
took it and never answers (stuck, or gone while the connection somehow stays open), the
caller sleeps until the connection is aborted, and not even SIGKILL frees it. So a test never
stats a possibly dead mount itself: it asks a child process (`os_errno`, `is_dead`), bounded in
time, and on no answer the mount's connection is aborted through the fusectl file system
(/sys/fs/fuse/connections/<minor>/abort), which ends every request waiting on it, and the test
fails with what held /dev/fuse. Teardown (`clear_mount`) aborts a left mount's connection, then
detaches it; nothing in it waits on the file system. `HangGuard` does the same, as a last
resort, to the mounts under the tests' directories when one test runs far past any test's
length, so that even a hang nobody foresaw ends in a failure rather than a stuck run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from pffs.mounting.kernel import FSTYPE, MountEntry, find_mount, mount_table

# How long a probe may go unanswered before the mount is taken as hung: far longer than a live
# pffs takes (it answers statfs from memory), short enough that a hang fails the test promptly.
PROBE_TIMEOUT_S = 30.0
CONNECTIONS = Path("/sys/fs/fuse/connections")
# How long one test (its fixtures included) may run before HangGuard takes it as hung: past the
# longest test's own bound (the quick bench's 15 minutes).
TEST_HANG_S = 20 * 60.0
# One call of `os` on a path in a child without site-packages (a fast start): prints 0 or the
# errno it failed with.
_PROBE = (
    "import os, sys\n"
    "try:\n    getattr(os, sys.argv[1])(sys.argv[2])\nexcept OSError as exc:\n"
    "    print(exc.errno)\nelse:\n    print(0)\n"
)


class MountHung(AssertionError):
    """A mount did not answer in time; its connection was aborted."""


def os_errno(call: str, path: Path | str, timeout: float = PROBE_TIMEOUT_S) -> int:
    """`os.<call>(path)` (statvfs, listdir, stat) in a child process: 0 when it answers, else
    its errno. No answer within `timeout` aborts the connection of the mount at `path` and
    raises MountHung, saying which processes held /dev/fuse."""
    probe = subprocess.Popen(
        [sys.executable, "-S", "-c", _PROBE, call, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        out, _ = probe.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        holders = fuse_holders()
        aborted = abort_connection(str(path))
        probe.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            probe.wait(timeout=10)  # freed by the abort; if not, left rather than waited on
        raise MountHung(
            f"os.{call}({path}) unanswered after {timeout:.0f}s; its connection "
            f"{'aborted' if aborted else 'not found to abort'}; /dev/fuse held by {holders}"
        ) from None
    return int(out)


def is_dead(mountpoint: Path | str) -> bool:
    """Whether the FUSE mount at `mountpoint` has lost its daemon. Asked with statfs, which the
    kernel always forwards (a stat may be answered from its attribute cache), in a child."""
    return os_errno("statvfs", mountpoint) in (errno.ENOTCONN, errno.ECONNABORTED)


def serves(mountpoint: Path | str, fstype: str = FSTYPE) -> bool:
    """Whether a live mount of `fstype` is at `mountpoint`: the same one in the mount table
    before and after a statfs it answered (one replaced meanwhile, as a restarted daemon
    replaces a dead mount, is not taken for it: the statfs may have reached the directory
    beneath)."""
    before = find_mount(str(mountpoint))
    if before is None or before.fstype != fstype or is_dead(mountpoint):
        return False
    return find_mount(str(mountpoint)) == before


def connection(entry: MountEntry) -> Path | None:
    """The fusectl directory of a FUSE mount's connection (named by its device's minor)."""
    if not entry.fstype.startswith("fuse"):
        return None
    path = CONNECTIONS / entry.device.partition(":")[2]
    return path if path.is_dir() else None


def abort_connection(mountpoint: str) -> bool:
    """Abort the FUSE connection of the mount at `mountpoint`: every request waiting on it ends
    (ECONNABORTED), and so does its daemon's loop. False when there is none to abort."""
    entry = find_mount(mountpoint)
    conn = connection(entry) if entry is not None else None
    if conn is None:
        return False
    try:
        (conn / "abort").write_text("1")
    except OSError:
        return False
    return True


def clear_mount(mountpoint: Path | str) -> None:
    """Remove a FUSE mount left at `mountpoint` (teardown, once its daemon was stopped or
    killed) without touching its file system: its connection aborted, so that no request on it
    can wait forever (a daemon still running then ends), then detached (fusermount3 -u -z),
    bounded in time too."""
    entry = find_mount(str(mountpoint))
    if entry is None or not entry.fstype.startswith("fuse"):
        return
    abort_connection(str(mountpoint))
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ["fusermount3", "-u", "-z", str(mountpoint)],
            capture_output=True,
            check=False,
            timeout=30,
        )


def fuse_mounts_under(directory: Path | str) -> list[str]:
    """FUSE mountpoints at or under `directory`, from this mount namespace's mount table."""
    root = os.path.join(os.path.abspath(directory), "")
    return [
        e.mountpoint
        for e in mount_table()
        if e.fstype.startswith("fuse") and os.path.join(e.mountpoint, "").startswith(root)
    ]


def fuse_holders() -> dict[int, str]:
    """Every process with /dev/fuse open: pid -> command line (for a hang's message)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
            if not any(_is_fuse(f"/proc/{name}/fd/{fd}") for fd in fds):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _is_fuse(fd_link: str) -> bool:
    try:
        return os.readlink(fd_link) == "/dev/fuse"
    except OSError:
        return False


class HangGuard:
    """The last resort against a test stuck on a FUSE request: when one test has run for over
    `limit` seconds, the mounts under `roots` (the tests' directories) are cleared, which ends
    every request waiting on them (ECONNABORTED), so the test fails with its traceback instead
    of holding the run until CI's time is up. On exit, mounts left under `roots` are cleared
    and named."""

    def __init__(self, roots: list[Path], limit: float = TEST_HANG_S, poll: float = 5.0) -> None:
        self.roots, self.limit, self._poll = roots, limit, poll
        self._test = ""
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fuse-hang-guard", daemon=True)

    def __enter__(self) -> HangGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        left = self.clear()
        if left:
            print(f"\nFUSE mounts left by the tests, cleared: {left}", file=sys.stderr)

    def begin(self, test: str) -> None:
        self._test, self._started = test, time.monotonic()

    def end(self) -> None:
        self._started = None

    def clear(self) -> list[str]:
        left = [m for root in self.roots for m in fuse_mounts_under(root)]
        for mountpoint in left:
            clear_mount(mountpoint)
        return left

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            started = self._started
            if started is None or time.monotonic() - started < self.limit:
                continue
            self._started = None
            cleared = self.clear()
            print(
                f"\n{self._test} ran over {self.limit:.0f}s: FUSE mounts cleared: {cleared}",
                file=sys.stderr,
            )

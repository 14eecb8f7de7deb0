"""FUSE mounts probed and cleared without a way to hang the tests.

A request the kernel has handed to a FUSE daemon is waited for uninterruptibly: if the daemon
took it and never answers (stuck, or gone while the connection somehow stays open), the
caller sleeps until the connection ends, and not even SIGKILL frees it. So a test never stats a
possibly dead mount itself: it asks a child process (`os_errno`, `is_dead`), bounded in time,
and on no answer the mount's connection is ended (`end_connection`), which ends every request
waiting on it, and the test fails with what held /dev/fuse. A connection is ended through the
fusectl file system (/sys/fs/fuse/connections/<minor>/abort) where it is mounted (`./dev.sh`
mounts it), else by killing the processes that hold its /dev/fuse descriptor: the last one
closed aborts it too. Teardown (`clear_mount`) ends a left mount's connection, then detaches
it; nothing in it waits on the file system. `HangGuard` does the same, as a last resort, to the
mounts under the tests' directories when a test runs past its time limit (pytest-timeout's,
which then fails it with the traceback of where it waited), so that even a hang nobody foresaw
ends in a failure rather than a stuck run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from pffs.mounting.kernel import FSTYPE, MountEntry, find_mount, mount_table
from tests.processes import marked_processes, wait_exited

# How long a probe may go unanswered before the mount is taken as hung: far longer than a live
# pffs takes (it answers statfs from memory), short enough that a hang fails the test promptly.
PROBE_TIMEOUT_S = 30.0
# Where the fusectl file system is mounted; PFFS_TEST_FUSECTL names another directory (an empty
# one stands for a machine without fusectl, as tests/mount/test_hang_guard.py does).
CONNECTIONS = Path(os.environ.get("PFFS_TEST_FUSECTL", "/sys/fs/fuse/connections"))
# How long HangGuard waits, past a test's own time limit, before it takes the test as hung:
# pytest-timeout's alarm comes first, and its failure shows where the test waited once the
# guard has freed that wait.
HANG_GRACE_S = 5.0
# How long the processes of a connection, killed, may take to exit.
KILL_WAIT_S = 10.0
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
        ended = end_connection(_mount_of(path))
        probe.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            probe.wait(timeout=10)  # freed by the end; if not, left rather than waited on
        raise MountHung(
            f"os.{call}({path}) unanswered after {timeout:.0f}s; its connection "
            f"{ended or 'not found to end'}; /dev/fuse held by {holders}"
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


def fusectl_missing() -> str | None:
    """Why the fusectl file system cannot abort connections here, or None when it can."""
    entry = find_mount(str(CONNECTIONS))
    if entry is None or entry.fstype != "fusectl":
        return f"fusectl is not mounted at {CONNECTIONS} (./dev.sh mounts it, as root)"
    return None


def connection(entry: MountEntry) -> Path | None:
    """The fusectl directory of a FUSE mount's connection (named by its device's minor)."""
    if not entry.fstype.startswith("fuse"):
        return None
    path = CONNECTIONS / _minor(entry)
    return path if path.is_dir() else None


def abort_connection(mountpoint: str) -> bool:
    """Abort the FUSE connection of the mount at `mountpoint` through fusectl: every request
    waiting on it ends (ECONNABORTED), and so does its daemon's loop. False when there is none
    to abort, or no fusectl to abort it with."""
    entry = find_mount(mountpoint)
    conn = connection(entry) if entry is not None else None
    if conn is None:
        return False
    try:
        (conn / "abort").write_text("1")
    except OSError:
        return False
    return True


def end_connection(mountpoint: str) -> str | None:
    """End the FUSE connection of the mount at `mountpoint`, so that every request waiting on it
    fails: aborted through fusectl, or, where that cannot be done, closed by killing the
    processes that hold it (`connection_holders`). Says how, or None when it could not."""
    if abort_connection(mountpoint):
        return "aborted"
    entry = find_mount(mountpoint)
    if entry is None or not entry.fstype.startswith("fuse"):
        return None
    # Never this process (a test that serves a mount itself would be killed with its daemon).
    holders = {p: cmd for p, cmd in connection_holders(entry).items() if p != os.getpid()}
    for pid in holders:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if not holders or not all(wait_exited(pid, KILL_WAIT_S) for pid in holders):
        return None
    return f"closed, its daemon killed (no fusectl to abort it): {holders}"


def clear_mount(mountpoint: Path | str) -> None:
    """Remove a FUSE mount left at `mountpoint` (teardown, once its daemon was stopped or
    killed) without touching its file system: its connection ended, so that no request on it
    can wait forever (a daemon still running then ends), then detached (fusermount3 -u -z),
    bounded in time too."""
    entry = find_mount(str(mountpoint))
    if entry is None or not entry.fstype.startswith("fuse"):
        return
    end_connection(str(mountpoint))
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


def fuse_mounts_served_by(mark: str, token: str) -> list[str]:
    """FUSE mountpoints, wherever they are, whose connection is held by a process with
    `mark`=`token` in its environment (tests/processes.py): a test session's own daemons, also
    those that mount outside its directories (the bench's, the CSI driver's). Known by the
    connection a /dev/fuse descriptor names in its fdinfo; none on kernels that do not say."""
    ours = marked_processes(mark, token)
    connections = {
        conn
        for pid, (conns, _) in _fuse_descriptors().items()
        if pid in ours
        for conn in conns
        if conn is not None
    }
    return [
        e.mountpoint
        for e in mount_table()
        if e.fstype.startswith("fuse") and _minor(e) in connections
    ]


def fuse_holders() -> dict[int, str]:
    """Every process with /dev/fuse open: pid -> command line (for a hang's message)."""
    return {pid: " ".join(argv)[:200] for pid, (_, argv) in _fuse_descriptors().items()}


def connection_holders(entry: MountEntry) -> dict[int, str]:
    """The processes holding the /dev/fuse descriptor of a FUSE mount's connection: pid ->
    command line. Known by the connection each descriptor names in its fdinfo (recent kernels:
    6.18 has it); on older ones, which do not say, by the mountpoint on their command line
    (s3fs's and rclone's have it; pffs's daemon, `python -m pffs _daemon`, does not: there a
    hung pffs mount needs fusectl)."""
    found = {}
    for pid, (connections, argv) in _fuse_descriptors().items():
        named = _minor(entry) in connections
        unnamed = None in connections and _names_path(pid, argv, entry.mountpoint)
        if named or unnamed:
            found[pid] = " ".join(argv)[:200]
    return found


def fdinfo_names_connections() -> bool:
    """Whether this kernel names a /dev/fuse descriptor's connection in its fdinfo (seen on
    the descriptors open now: False when there are none)."""
    return any(None not in connections for connections, _ in _fuse_descriptors().values())


def _fuse_descriptors() -> dict[int, tuple[set[str | None], list[str]]]:
    """Every process with /dev/fuse open: pid -> (the connections of its /dev/fuse
    descriptors, None for one whose fdinfo does not say, and its argv)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            connections = {
                _fdinfo_connection(f"/proc/{name}/fdinfo/{fd}")
                for fd in os.listdir(f"/proc/{name}/fd")
                if _is_fuse(f"/proc/{name}/fd/{fd}")
            }
            if not connections:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")[:-1]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[int(name)] = (connections, argv)
    return found


def _fdinfo_connection(fdinfo: str) -> str | None:
    """The connection (its device's minor) a /dev/fuse descriptor is bound to, where the kernel
    says (`fuse_connection:` in its fdinfo), else None."""
    try:
        with open(fdinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "fuse_connection":
                    return value.strip()
    except OSError:
        pass
    return None


def _names_path(pid: int, argv: list[str], path: str) -> bool:
    """Whether one of `argv`'s arguments is `path`, relative ones taken from the process's
    working directory; compared as strings only (a stat of a hung mount would hang)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "/"
    return any(os.path.normpath(os.path.join(cwd, arg)) == path for arg in argv[1:] if arg)


def _minor(entry: MountEntry) -> str:
    return entry.device.partition(":")[2]


def _mount_of(path: Path | str) -> str:
    """The FUSE mountpoint `path` is at or under (strings only), else `path` itself."""
    target = os.path.join(os.path.abspath(path), "")
    under = [m for m in fuse_mounts_under("/") if target.startswith(os.path.join(m, ""))]
    return max(under, key=len) if under else str(path)


def _is_fuse(fd_link: str) -> bool:
    try:
        return os.readlink(fd_link) == "/dev/fuse"
    except OSError:
        return False


def time_limit(item: pytest.Item) -> float:
    """A test's time limit, pytest-timeout's: its `timeout` mark, else the `timeout` ini value
    (pyproject.toml); 0 for none."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and (mark.args or "timeout" in mark.kwargs):
        return float(mark.args[0] if mark.args else mark.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


class HangGuard:
    """The last resort against a test stuck on a FUSE request: when a test has run `grace`
    seconds past its time limit, the mounts under `roots` (the tests' directories), and those
    served by processes carrying `mark` (name, token) in their environment, are cleared,
    which ends every request waiting on them (ECONNABORTED), so the test fails with its
    traceback instead of holding the run until CI's time is up. On exit, the mounts left are
    cleared and named."""

    def __init__(
        self,
        roots: list[Path],
        poll: float = 1.0,
        grace: float | None = None,
        mark: tuple[str, str] | None = None,
    ) -> None:
        # HANG_GRACE_S read here, not at import: a test of the guard shortens it.
        grace = HANG_GRACE_S if grace is None else grace
        self.roots, self._poll, self._grace, self._mark = roots, poll, grace, mark
        self._test = ""
        self._test_thread = 0
        self._deadline: float | None = None
        self._limit = 0.0
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

    def begin(self, test: str, limit: float) -> None:
        """`test` starts, in this thread, with `limit` seconds to run (0: none)."""
        self._test, self._limit, self._test_thread = test, limit, threading.get_ident()
        self._deadline = time.monotonic() + limit + self._grace if limit > 0 else None

    def end(self) -> None:
        self._deadline = None

    def mounts(self) -> list[str]:
        """The FUSE mounts under the guard's roots, and those its `mark`ed processes serve."""
        found = [m for root in self.roots for m in fuse_mounts_under(root)]
        if self._mark is not None:
            found += [m for m in fuse_mounts_served_by(*self._mark) if m not in found]
        return found

    def clear(self) -> list[str]:
        """Clear the FUSE mounts under the guard's roots; says which."""
        left = self.mounts()
        for mountpoint in left:
            clear_mount(mountpoint)
        return left

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            deadline = self._deadline
            if deadline is None or time.monotonic() < deadline:
                continue
            self._deadline = None
            # Where the test waits, and what will be cleared, said before the clear ends the
            # wait (the failure's own traceback may show only where the exception surfaced, and
            # the test's output is captured only until it fails).
            frame = sys._current_frames().get(self._test_thread)
            waiting = "".join(traceback.format_stack(frame, limit=8)) if frame else "?\n"
            mounts = self.mounts()
            print(
                f"\n{self._test} ran over its {self._limit:.0f}s, waiting in:\n{waiting}"
                f"FUSE mounts cleared: {mounts}",
                file=sys.stderr,
                flush=True,
            )
            for mountpoint in mounts:
                clear_mount(mountpoint)

"""What the bench started and must not leave behind: server and proxy processes, FUSE mounts.

Servers and proxies run in sessions of their own (so a terminal's Ctrl-C reaches only the
bench), and mount daemons detach: none of them dies with the bench. Each is recorded here the
moment it is started, before it is known to work, so `clean_up` finds it whatever point a run
is stopped at. `stopped_cleanly` turns SIGTERM (`timeout`, `kill`, a pod's stop) into an
exception like Ctrl-C's, so every `finally` on the way out runs, then cleans up what is left:
mounts first (their daemons talk to the servers), then processes, newest first (a proxy before
the server behind it).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pffs.mounting.kernel import find_mount

_processes: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
_mountpoints: list[str] = []
STOP_WAIT_S = 10.0


def track_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Record a process the bench started, to be stopped at the latest by `clean_up`."""
    _processes.append(proc)


def track_mount(mountpoint: str) -> None:
    """Record a mountpoint about to be mounted, to be unmounted at the latest by `clean_up`."""
    if mountpoint not in _mountpoints:
        _mountpoints.append(mountpoint)


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL when it has not ended within `STOP_WAIT_S`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def unmount(mountpoint: str) -> None:
    """Unmount, retrying while the mount is busy for 5 s; then detach it lazily."""
    for _ in range(50):
        if find_mount(mountpoint) is None:
            return
        subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, check=False)
        time.sleep(0.1)
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, check=False)


def clean_up() -> list[str]:
    """Unmount every recorded mount still mounted and stop every recorded process still
    running; what it had to clean, one line each."""
    cleaned = []
    for mountpoint in reversed(_mountpoints):
        if find_mount(mountpoint) is not None:
            unmount(mountpoint)
            cleaned.append(f"unmounted {mountpoint}")
    _mountpoints.clear()
    for proc in reversed(_processes):
        if proc.poll() is None:
            stop_process(proc)
            cleaned.append(f"stopped {proc.args!r}")
    _processes.clear()
    return cleaned


Item = TypeVar("Item")


def in_threads(workers: int, work: Callable[[Item], object], items: Iterable[Item]) -> None:
    """`work(item)` for every item on `workers` threads, re-raising the first failure. Stopped
    (Ctrl-C, SIGTERM, a failure), it drops the items not started instead of running them all
    first, as a plain executor's exit would (100,000 PUTs of the full tree)."""
    with ThreadPoolExecutor(workers) as pool:
        try:
            for _ in pool.map(work, items):
                pass
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


class Stopped(BaseException):
    """Raised in the main thread when SIGTERM arrives: a BaseException, as KeyboardInterrupt
    is, so no scenario's `except Exception` takes it for a failed figure."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stopped_cleanly() -> Iterator[None]:
    """Run the body; on the way out, however it ends, leave nothing behind. SIGTERM and SIGINT
    stop the body; while cleaning up they are ignored, so a second one cannot cut it short."""
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            for line in clean_up():
                print(f"bench: {line}", file=sys.stderr)
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, sigint)

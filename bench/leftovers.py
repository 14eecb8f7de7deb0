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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
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
Result = TypeVar("Result")


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


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_stopped(signum: int, frame: object) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signal.Signals(signum).name)


def _stop_exception(signum: int) -> BaseException:
    """What a stop by `signum` raises: KeyboardInterrupt for SIGINT, Stopped for SIGTERM."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Stopped(signal.Signals(signum).name)


class _StopSignals:
    """Which stop signal reached the process, known as soon as the kernel delivers it.

    A stop signal also reaches what the bench started in its process group (a terminal's
    Ctrl-C): a mount daemon ending on it fails the bench's read on its mountpoint (ENOTCONN)
    before Python runs the bench's own handler, which may then never run (cleaning up ignores
    the signals). The C-level handler writes each signal to a wakeup pipe at once: read on the
    way out, it says whether a failure was the stop's doing.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self.received: int | None = None

    def check(self) -> int | None:
        """The first stop signal received so far, or None."""
        while self.received is None:
            try:
                numbers = os.read(self._read, 256)
            except BlockingIOError:
                break
            if not numbers:
                break
            self.received = next((n for n in numbers if n in _STOP_SIGNALS), None)
        return self.received

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self._read)
        os.close(self._write)


def run_trio(async_fn: Callable[[], Awaitable[Result]]) -> Result:
    """`trio.run(async_fn)` inside `stopped_cleanly`: its stop-signal pipe is the process's
    wakeup fd, and trio sets its own for the run and warns ("signal handling code might have
    collided") when it finds one set. The pipe is set aside for the run, then put back; a stop
    signal meanwhile still raises through the bench's Python handler."""
    import trio  # only the scenarios that run trio pay its import

    bench_wakeup = signal.set_wakeup_fd(-1)
    try:
        return trio.run(async_fn)
    finally:
        signal.set_wakeup_fd(bench_wakeup, warn_on_full_buffer=False)


@contextlib.contextmanager
def stopped_cleanly() -> Iterator[None]:
    """Run the body; on the way out, however it ends, leave nothing behind. SIGTERM and SIGINT
    stop the body; while cleaning up they are ignored, so a second one cannot cut it short.

    After a stop signal, any failure is part of the stop (a mount daemon in the bench's process
    group ended on the same Ctrl-C): the body's exception, whatever it is, leaves as the stop's
    (KeyboardInterrupt or Stopped), so the bench ends with one line and 130 or 143. A stopped
    run leaves the signals ignored: a handler still pending must not fire on the way out.
    """
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in _STOP_SIGNALS}
    signals = _StopSignals()
    try:
        yield
        stop = signals.check()
        if stop is not None:  # it arrived as the body ended: still a stop
            raise _stop_exception(stop)
    except BaseException as exc:
        stop = signals.check()
        if stop is None or isinstance(exc, (KeyboardInterrupt, Stopped)):
            raise
        raise _stop_exception(stop) from exc
    finally:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        try:
            for line in clean_up():
                print(f"bench: {line}", file=sys.stderr)
        finally:
            stopped = signals.check() is not None
            signals.close()
            if not stopped:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

"""Worker threads for blocking calls, entered from trio at about half the CPU of
`trio.to_thread.run_sync`.

Backends (boto3, pyarrow, the GET engine), the disk tier and staging files block; trio tasks must
not. Every such call goes through `run_blocking` with a limiter: the backend's it talks to (a permit
of its source's flow, pffs.flow.permits: a slow store cannot starve the others' threads), the disk
tier's or the staging area's. Threads touch bytes and file descriptors only; shared state of the
file system is touched only from trio tasks. The cold epoch makes two or three such hops per file,
so their CPU counts (docs/BENCHMARKS.md measures both). `trio.to_thread` copies the context, names
the OS thread (a prctl per call), and sets up a cancel scope and a thread-cache job. `run_blocking`
below does what pffs needs and no more: the trio task takes a place in its limiter, puts the call on
a queue that idle workers wait on, and parks; the worker hands the outcome back with one
`run_sync_soon` on the run's token.

Semantics are `trio.to_thread.run_sync`'s defaults: the call always runs to its end, and a
task cancelled meanwhile sees the cancellation at its next checkpoint after the call returns,
with the limiter's place held until then. Context variables are not carried into the thread
(pffs's blocking calls use none). A call that needs to run something in trio from its thread
(`trio.from_thread.run`) passes `trio_token=` explicitly.

Threads are started as calls need them and end after `_IDLE_SECONDS` without work, so the
pool is as large as the most calls running at once, which the callers' limiters bound. The
trio thread starts them and goes on at once (`_thread.start_new_thread`): `threading.Thread.
start` waits until the new thread has run Python, which needs the GIL, and with the worker
threads busy (a cold read's GETs and disk writes) that wait was 5-40 ms of the trio thread per
start, against 0.15 ms (docs/notes/worker-thread-start.md).
"""

from __future__ import annotations

import _thread
import functools
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import outcome
import trio

T = TypeVar("T")

_IDLE_SECONDS = 10.0  # as trio's own thread cache


class _Job:
    __slots__ = ("call", "task", "token")

    def __init__(self, call: Callable[[], object], task: trio.lowlevel.Task) -> None:
        self.call = call
        self.task = task
        self.token = trio.lowlevel.current_trio_token()

    def run(self) -> None:
        result = outcome.capture(self.call)
        # The run cannot have finished: the task waits for this outcome.
        self.token.run_sync_soon(trio.lowlevel.reschedule, self.task, result)


class _Pool:
    """Idle threads wait on one queue; a job finding none idle starts a thread of its own."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        # Threads waiting for a job, less the jobs queued for them. Changed, and jobs queued,
        # only under the lock, so a thread timing out cannot miss a job meant for it.
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._jobs.put(job)
                return
        # The first job goes in a list the thread empties: the thread keeps its args until it
        # ends, and with them the call's arguments (a span's bytes, a batch of blocks). Not a
        # threading.Thread, whose start waits for the thread (module doc); like a daemon
        # thread, it never holds up the interpreter's exit.
        first = [job]
        _thread.start_new_thread(self._serve, (first,))

    def _serve(self, first: list[_Job]) -> None:
        job = first.pop()
        while True:
            job.run()
            del job  # nothing of a finished call is kept alive by an idle thread
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    try:  # queued between the timeout and the lock: it is ours
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return

    def idle_threads(self) -> int:
        with self._lock:
            return self._idle


_pool = _Pool()


def idle_threads() -> int:
    """Worker threads waiting for a call (for tests and diagnostics)."""
    return _pool.idle_threads()


def _cannot_abort(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED  # the call runs to its end: see the module doc


async def run_blocking(
    limiter: AbstractAsyncContextManager[object], fn: Callable[..., T], *args: object
) -> T:
    """Run `fn(*args)` in a worker thread, holding `limiter` meanwhile (a trio
    CapacityLimiter, or a permit of a source's flow: pffs.flow.permits)."""
    async with limiter:
        _pool.submit(_Job(functools.partial(fn, *args), trio.lowlevel.current_task()))
        # The worker's outcome comes back unwrapped: the call's value, or its exception raised.
        result: T = await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
    return result

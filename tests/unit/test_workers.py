"""pffs.workers: blocking calls in worker threads, with trio.to_thread's semantics. The calls
wait on events and barriers, not for real time, and the trio side runs on a MockClock where it
waits: nothing here depends on the machine's speed."""

from __future__ import annotations

import threading
import weakref

import pytest
import trio
import trio.testing

from pffs import workers


def test_a_call_returns_its_value_from_another_thread() -> None:
    async def main() -> tuple[int, int]:
        limiter = trio.CapacityLimiter(1)
        return await workers.run_blocking(
            limiter, lambda a, b: (a + b, threading.get_ident()), 2, 3
        )

    value, ident = trio.run(main)
    assert value == 5
    assert ident != threading.get_ident()


def test_a_calls_exception_is_raised_in_the_task() -> None:
    def fails(text: str) -> None:
        raise FileNotFoundError(text)

    async def main() -> None:
        await workers.run_blocking(trio.CapacityLimiter(1), fails, "gone")

    with pytest.raises(FileNotFoundError, match="gone"):
        trio.run(main)


def test_the_limiter_bounds_the_calls_running_at_once() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    together = threading.Barrier(2, timeout=10)  # broken if two never run at once

    def call() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        together.wait()
        with lock:
            running -= 1

    async def main() -> None:
        limiter = trio.CapacityLimiter(2)
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(workers.run_blocking, limiter, call)

    trio.run(main)
    assert most == 2


def test_a_cancelled_task_waits_for_its_call_then_sees_the_cancellation() -> None:
    started = threading.Event()
    may_end = threading.Event()
    finished = threading.Event()

    def call() -> None:
        started.set()
        may_end.wait(timeout=10)  # until its task was cancelled
        finished.set()

    async def main() -> tuple[bool, bool, int]:
        limiter = trio.CapacityLimiter(1)
        finished_first = False
        scope = trio.CancelScope()

        async def cancel_once_started() -> None:
            await trio.to_thread.run_sync(started.wait)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()  # a cancellation would be delivered
            may_end.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_started)
            with scope:
                await workers.run_blocking(limiter, call)
                finished_first = finished.is_set()
                await trio.lowlevel.checkpoint()  # where the cancellation is delivered
        # The call ran to its end before the task moved on, and its place is free again.
        return scope.cancelled_caught, finished_first, limiter.borrowed_tokens

    cancelled, finished_first, borrowed = trio.run(main)
    assert started.is_set()
    assert finished_first
    assert cancelled
    assert borrowed == 0


def test_a_task_cancelled_while_waiting_for_the_limiter_runs_nothing() -> None:
    calls: list[int] = []

    async def main() -> None:
        limiter = trio.CapacityLimiter(1)
        release = trio.Event()

        async def hold() -> None:
            async with limiter:  # the only place
                await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await trio.sleep(0.01)
            with trio.move_on_after(0.05):
                await workers.run_blocking(limiter, calls.append, 1)
            release.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert calls == []


def test_an_idle_thread_takes_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_pool", workers._Pool())  # no threads of other tests
    monkeypatch.setattr(workers, "_IDLE_SECONDS", 60.0)  # idle for the whole test

    async def main() -> tuple[int, int]:
        limiter = trio.CapacityLimiter(1)
        first = await workers.run_blocking(limiter, threading.get_ident)
        while not workers.idle_threads():  # the thread counts itself idle after handing back
            await trio.sleep(0.001)  # virtual: the clock jumps while the thread runs
        second = await workers.run_blocking(limiter, threading.get_ident)
        return first, second

    first, second = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first == second  # the idle thread took the second call


class _Payload:
    """Stands for the bytes a call moves (a weakref tells when nothing holds them)."""


def test_an_idle_thread_keeps_nothing_of_the_calls_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls move bytes (a region span being parked, a batch of blocks): an idle thread must
    not keep them alive, nor those of the call that started it."""
    monkeypatch.setattr(workers, "_pool", workers._Pool())  # a thread started for the first
    monkeypatch.setattr(workers, "_IDLE_SECONDS", 60.0)  # idle for the whole test
    payloads = [_Payload(), _Payload()]
    gone = [weakref.ref(payload) for payload in payloads]

    async def main() -> None:
        limiter = trio.CapacityLimiter(1)
        for _ in range(2):
            await workers.run_blocking(limiter, lambda payload: None, payloads.pop())
            while not workers.idle_threads():  # counted idle once it handed the outcome back
                await trio.sleep(0.001)  # virtual: the clock jumps while the thread runs

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert workers.idle_threads() == 1
    assert [ref() for ref in gone] == [None, None]


def test_an_idle_thread_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_pool", workers._Pool())
    monkeypatch.setattr(workers, "_IDLE_SECONDS", 0.01)
    per_thread = threading.local()  # a thread's values are dropped when it ends
    ended = threading.Event()

    def mark_the_thread() -> None:
        per_thread.marker = _Payload()
        weakref.finalize(per_thread.marker, ended.set)

    trio.run(workers.run_blocking, trio.CapacityLimiter(1), mark_the_thread)
    assert ended.wait(timeout=10)
    assert workers.idle_threads() == 0


def test_many_calls_at_once_each_get_their_own_result() -> None:
    results: dict[int, int] = {}

    async def one(limiter: trio.CapacityLimiter, n: int) -> None:
        results[n] = await workers.run_blocking(limiter, lambda: n * n)

    async def main() -> None:
        limiter = trio.CapacityLimiter(16)
        async with trio.open_nursery() as nursery:
            for n in range(500):
                nursery.start_soon(one, limiter, n)

    trio.run(main)
    assert results == {n: n * n for n in range(500)}


def test_a_call_can_run_trio_code_with_the_runs_token() -> None:
    async def main() -> list[int]:
        seen: list[int] = []
        token = trio.lowlevel.current_trio_token()

        async def note(value: int) -> None:
            seen.append(value)

        def call() -> None:
            for value in range(3):
                trio.from_thread.run(note, value, trio_token=token)

        await workers.run_blocking(trio.CapacityLimiter(1), call)
        return seen

    assert trio.run(main) == [0, 1, 2]

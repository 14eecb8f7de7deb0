"""A source's breaker (pffs.routing.health) and a reader's retry budget counted from when it asked
(pffs.retry), in a trio run with real worker threads, on virtual clocks: trio's MockClock, and
`VirtualTime` for the retries' waits in the threads, so that no test depends on the machine's
speed. The store is a function that fails or answers as the test says: no server is needed to
show the state changes (the mount tests show them against a real one)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import trio
import trio.testing

from pffs import retry
from pffs.config import RetryConfig
from pffs.errors import SourceDown, Throttled, Transient
from pffs.routing import health
from pffs.workers import run_blocking

T = TypeVar("T")


class VirtualTime:
    """pffs.retry's clock (its `time`), virtual: `sleep` moves it on at once; safe across the
    worker threads retries run in."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.fixture
def retry_time(monkeypatch: pytest.MonkeyPatch) -> VirtualTime:
    clock = VirtualTime()
    monkeypatch.setattr(retry, "time", clock)
    return clock


def virtual_run(main: Callable[..., Awaitable[T]], *args: object) -> T:
    """trio.run on a MockClock that jumps to the next deadline whenever every task waits."""
    return trio.run(main, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def test_down_after_a_transient_failure_then_probed_up(monkeypatch) -> None:
    monkeypatch.setattr(health, "PROBE_FIRST", 0.05)
    store_answers = [False]
    probes = []
    calls = []

    async def probe() -> None:
        probes.append(trio.current_time())
        if not store_answers[0]:
            raise Transient("still down")

    def failing() -> bytes:
        calls.append("failing")
        raise Transient("GET timed out after retries")

    def answering() -> bytes:
        return b"x"

    async def main() -> None:
        breaker = health.SourceHealth("s3://unit", probe)
        assert breaker.up
        assert breaker.terms().recovered == 0
        limiter = trio.CapacityLimiter(1)
        async with trio.open_nursery() as mount:  # the mount's nursery runs its probes
            mount.start_soon(breaker.watch)
            with pytest.raises(Transient):
                await breaker.call(limiter, failing)
            assert not breaker.up
            with pytest.raises(SourceDown):  # at once, without calling the store
                await breaker.call(limiter, failing)
            assert calls == ["failing"]
            await trio.sleep(0.3)
            assert len(probes) >= 2  # probing with backoff while down
            store_answers[0] = True
            while not breaker.up:
                await trio.sleep(0.05)
            # Its requests' terms now tell the backend the source came back (issue 49).
            assert breaker.terms().recovered == 1
            assert await breaker.call(limiter, answering) == b"x"
            mount.cancel_scope.cancel()

    virtual_run(main)


def test_probes_end_with_the_mount(monkeypatch) -> None:
    """The probes of a source that stays down run in the mount's nursery: once the mount
    stops (its nursery cancelled), none is under way and none starts again."""
    monkeypatch.setattr(health, "PROBE_FIRST", 0.05)
    under_way: list[int] = [0]
    probes: list[float] = []

    async def probe() -> None:  # a store that never answers
        under_way[0] += 1
        probes.append(trio.current_time())
        try:
            await trio.sleep_forever()
        finally:
            under_way[0] -= 1

    async def main() -> None:
        breaker = health.SourceHealth("s3://stopping", probe)
        async with trio.open_nursery() as mount:
            mount.start_soon(breaker.watch)
            breaker.failed(Transient("timed out after retries"))
            while not probes:
                await trio.sleep(0.01)
            mount.cancel_scope.cancel()
        assert under_way == [0]
        seen = len(probes)
        await trio.sleep(10)  # no probe left behind the mount's end
        assert len(probes) == seen and not breaker.up

    virtual_run(main)


def test_a_probe_waiting_on_a_hung_store_does_not_hold_up_the_next(monkeypatch) -> None:
    """The store hangs each probe sent while it hangs until that probe's own timeout, then
    answers again: the breaker sees it within one interval, not after the hung probes."""
    monkeypatch.setattr(health, "PROBE_FIRST", 0.05)
    monkeypatch.setattr(health, "PROBE_MAX", 0.1)
    probe_timeout = 1.0  # a probe's own timeout, ten intervals
    answering_since: list[float] = []

    async def probe() -> None:
        if not answering_since:  # sent while the store hangs: never answered
            await trio.sleep(probe_timeout)
            raise Transient("probe timed out")

    async def main() -> float:
        breaker = health.SourceHealth("s3://hung", probe)
        async with trio.open_nursery() as mount:
            mount.start_soon(breaker.watch)
            breaker.failed(Transient("timed out after retries"))
            await trio.sleep(0.5)
            answering_since.append(trio.current_time())
            while not breaker.up:
                await trio.sleep(0.01)
            mount.cancel_scope.cancel()
        return trio.current_time() - answering_since[0]

    took = virtual_run(main)
    assert took < probe_timeout, took  # one interval, not the hung probes' timeout


def test_a_request_retrying_stops_at_its_next_attempt_once_the_source_is_down(
    retry_time: VirtualTime,
) -> None:
    """Another reader's request marks the source down (here, during this one's second attempt):
    this one, already retrying, stops at its next attempt with SourceDown instead of spending
    the rest of its budget."""
    policy = RetryConfig(attempts=100, base_delay=0.01, max_delay=0.05, total_timeout=30.0)
    attempts: list[float] = []
    # Its probes never answer: the virtual clock runs on while the threads work.
    breaker = health.SourceHealth("s3://gated", trio.sleep_forever)
    tokens: list[trio.lowlevel.TrioToken] = []

    def failing() -> None:
        attempts.append(retry_time.monotonic())
        if len(attempts) == 2:  # from pffs's worker thread, into the trio run
            failure = Transient("another reader's GET timed out after retries")
            trio.from_thread.run_sync(breaker.failed, failure, trio_token=tokens[0])
        raise ConnectionError("no answer")

    def call(terms: retry.RetryTerms) -> None:
        retry.call_with_retry(
            failing, is_transient=lambda _: True, policy=policy, what="GET unit", terms=terms
        )

    async def main() -> None:
        tokens.append(trio.lowlevel.current_trio_token())
        with pytest.raises(SourceDown):
            await breaker.call(trio.CapacityLimiter(1), call, breaker.terms())

    virtual_run(main)
    assert len(attempts) == 2  # not the 100 attempts of its 30 s budget


def test_a_call_that_waited_while_the_source_went_down_asks_nothing_and_marks_nothing_up() -> None:
    """A call waiting for a place when another reader marks the source down is refused in its
    thread: one that would ask the store nothing (the rest of a listing already fetched) must
    not pass for the store's answer and mark the source up."""
    called = []

    def nothing_asked() -> str:
        called.append(True)
        return "entries fetched before"

    async def main() -> None:
        breaker = health.SourceHealth("s3://waiting", lambda: trio.sleep(10))
        limiter = trio.CapacityLimiter(1)
        release, refused = trio.Event(), trio.Event()

        async def hold(task_status: trio.TaskStatus[None]) -> None:
            async with limiter:
                task_status.started()
                await release.wait()

        async def call() -> None:
            with pytest.raises(SourceDown):
                await breaker.call(limiter, nothing_asked)
            refused.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(hold)
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()  # the call waits for its place
            breaker.failed(Transient("another reader's GET timed out after retries"))
            release.set()
            await refused.wait()
        assert not breaker.up

    trio.run(main)
    assert called == []


def test_throttling_and_refusals_never_mark_a_source_down() -> None:
    async def main() -> None:
        breaker = health.SourceHealth("s3://throttled", lambda: trio.sleep(0))
        breaker.failed(Throttled("503 SlowDown after retries"))
        breaker.failed(PermissionError("denied"))
        assert breaker.up

    trio.run(main)


def test_a_readers_budget_counts_from_when_it_asked(retry_time: VirtualTime) -> None:
    policy = RetryConfig(attempts=100, base_delay=0.01, max_delay=0.01, total_timeout=0.5)
    attempts: list[float] = []

    def failing() -> None:
        attempts.append(retry_time.monotonic())
        raise ConnectionError("no answer")

    def call(terms: retry.RetryTerms) -> None:
        retry.call_with_retry(
            failing, is_transient=lambda _: True, policy=policy, what="GET unit", terms=terms
        )

    async def asked_then_waited(waited: float) -> float:
        with retry.asking():
            asked = retry_time.monotonic()
            retry_time.sleep(waited)  # waited behind someone else's fetch
            await run_blocking(trio.CapacityLimiter(1), call, retry.terms())
        return asked

    with pytest.raises(ConnectionError):
        virtual_run(asked_then_waited, 0.4)
    asked = 1000.0
    # Retried from 0.4 s after it asked until its budget, 0.5 s from when it asked, was spent:
    # not 0.4 s of waiting plus a fresh 0.5 s budget.
    assert asked + 0.4 == attempts[0] and len(attempts) > 2
    assert attempts[-1] <= asked + 0.5 < attempts[-1] + 0.01
    attempts.clear()
    with pytest.raises(Transient, match="no time left"):  # asked too long ago: no attempt
        virtual_run(asked_then_waited, 0.6)
    assert attempts == []

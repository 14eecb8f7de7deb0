"""A source's breaker (pffs.routing.health), the pace of loading ahead (pffs.pace) and a
reader's retry budget counted from when it asked (pffs.retry), in a real trio run with real
worker threads. The store is a function that fails or answers as the test says: no server is
needed to show the state changes (the mount tests show them against a real one)."""

from __future__ import annotations

import time

import pytest
import trio

from pffs import retry
from pffs.config import RetryConfig
from pffs.errors import SourceDown, Throttled, Transient
from pffs.pace import COOLDOWN, Pace
from pffs.routing import health
from pffs.workers import run_blocking


def test_down_after_a_transient_failure_then_probed_up(monkeypatch) -> None:
    monkeypatch.setattr(health, "PROBE_FIRST", 0.05)
    store_answers = [False]
    probes = []

    async def probe() -> None:
        probes.append(trio.current_time())
        if not store_answers[0]:
            raise Transient("still down")

    async def main() -> None:
        breaker = health.register("s3://unit", probe)
        assert health.of("s3://unit") is breaker and breaker.up

        async def failing() -> bytes:
            raise Transient("GET timed out after retries")

        with pytest.raises(Transient):
            await breaker.observe(failing)
        assert not breaker.up
        with pytest.raises(SourceDown):  # at once, without calling the store
            await breaker.observe(failing)
        await trio.sleep(0.3)
        assert len(probes) >= 2  # probing with backoff while down
        store_answers[0] = True
        while not breaker.up:
            await trio.sleep(0.05)

        async def answering() -> bytes:
            return b"x"

        assert await breaker.observe(answering) == b"x"

    trio.run(main)


def test_throttling_and_refusals_never_mark_a_source_down() -> None:
    async def main() -> None:
        breaker = health.register("s3://throttled", lambda: trio.sleep(0))
        breaker.failed(Throttled("503 SlowDown after retries"))
        breaker.failed(PermissionError("denied"))
        assert breaker.up

    trio.run(main)


def test_pace_halves_once_per_cooldown_and_grows_back_slowly() -> None:
    async def main() -> None:
        pace = Pace(16)
        for _ in range(5):  # five push backs from the requests in flight: one halving
            pace.pushed_back()
        pace.settle()
        assert pace.current == 8
        pace.pushed_back()
        pace.settle()
        assert pace.current == 8  # within the cooldown: the same crowding
        for _ in range(8):  # one window of requests that went well: one place more
            pace.went_well()
        assert pace.current == 9
        pace._last_halving -= COOLDOWN
        pace.pushed_back()
        pace.settle()
        assert pace.current == 4

    trio.run(main)


def test_a_readers_budget_counts_from_when_it_asked() -> None:
    policy = RetryConfig(attempts=100, base_delay=0.01, max_delay=0.01, total_timeout=0.5)
    attempts = []

    def failing() -> None:
        attempts.append(time.monotonic())
        raise ConnectionError("no answer")

    def call() -> None:
        retry.call_with_retry(failing, is_transient=lambda _: True, policy=policy, what="GET unit")

    async def main() -> float:
        limiter = trio.CapacityLimiter(1)
        with retry.asking():
            started = time.monotonic()
            await trio.sleep(0.4)  # waited behind someone else's fetch
            with pytest.raises(ConnectionError):
                await run_blocking(limiter, retry.carrying(call))
        return time.monotonic() - started

    took = trio.run(main)
    assert took < 0.5 + 0.2, took  # not 0.4 s of waiting plus a fresh 0.5 s budget
    with pytest.raises(Transient):  # asked too long ago: no attempt at all

        async def late() -> None:
            with retry.asking():
                await trio.sleep(0.6)
                await run_blocking(trio.CapacityLimiter(1), retry.carrying(call))

        attempts.clear()
        trio.run(late)
    assert attempts == []

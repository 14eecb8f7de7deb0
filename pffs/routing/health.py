"""Each source's health: a circuit breaker, so reads fail at once while a store is down.

A source is up until a reader's store request (a read, a lookup, a listing) fails past its
retries with a transient error (a timeout, a refused connection, a 5xx): then it is down.
Failures of loads ahead do not count (their readers fetch the blocks themselves, and their
failures do), so a blip in the background never fails a reader. Every request that needs the
store goes through `call`: while the source is down it raises `SourceDown` (EIO) at once, so
it does not wait out another retry budget; and a request carries the breaker as the gate of
its `terms` (pffs.retry.RetryTerms), so one already retrying stops at its next attempt. The
namespace answers a lookup, an attribute or a listing that fails so from what it last saw
(pffs.fs.namespace); cached blocks are still served, because they never ask. Writes do not
consult the breaker: they keep their staged data and their own errors.

While down, probes (the backend's `probe`: on S3 a one-key LIST of the mount's prefix on a
fresh connection, with short timeouts of its own whatever --request-timeout says) start
PROBE_FIRST seconds after, then at doubling intervals up to PROBE_MAX, each without waiting for
the one before (a probe sent while the store hung waits out its own timeout; the next one
still goes out on time), at most PROBES_AT_ONCE at once (each a permit of the source's flow,
pffs.flow.permits). So a store that answers again is seen
within PROBE_MAX and one round trip. The first probe that succeeds marks the source up again,
without a remount. The probes run in `watch`, a task the mount runs in its own nursery for
its whole life (pffs.mounting.serving, the one assembly point; warmup's likewise), so they end
with the mount and a failure of theirs is its own. Each change is one log line and the gauge
`pffs_source_up{source}` (in `.pffs/stats` and `pffs stats`). Each return counts in
`recoveries`, which every request's terms carry down to the backend (`RetryTerms.recovered`):
seeing it grow, the backend lets go of the connections it opened before, so nothing opened
while the store was down, or idle through it, carries a request after.

Throttling (`Throttled`: 503 SlowDown, 429) never marks a source down: the store is alive and
asks for fewer requests, which the source's flow of loading ahead answers (pffs.flow.permits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import trio

from pffs import metrics, retry
from pffs.errors import SourceDown, Throttled, Transient
from pffs.flow.permits import PROBES_AT_ONCE
from pffs.workers import run_blocking

T = TypeVar("T")
log = logging.getLogger("pffs.health")

# Seconds before the first probe, and the cap on the doubling interval between probes' starts.
PROBE_FIRST = 0.5
PROBE_MAX = 2.0


class SourceHealth:
    """The breaker of one source. Changed only from trio tasks; `check` only reads, so a worker
    thread may call it too."""

    def __init__(self, source: str, probe: Callable[[], Awaitable[object]]) -> None:
        self.source = source
        self._probe = probe
        self.down_since: float | None = None
        self.recoveries = 0  # times it came back up (see the module's docstring)
        self._reason = ""
        self._woken: trio.Event | None = None  # set when it goes down: `watch` starts probing
        self._gauge = metrics.SOURCE_UP.labels(source=source)
        self._gauge.set(1)

    @property
    def up(self) -> bool:
        return self.down_since is None

    def check(self) -> None:
        """Raise SourceDown when the source is down: a read needing the store fails at once."""
        if self.down_since is not None:
            raise SourceDown(f"{self.source} is down ({self._reason}); probing it")

    def succeeded(self) -> None:
        """A request got its answer (any answer the store gave, success or a refusal)."""
        if self.down_since is not None:
            self._mark_up()

    def failed(self, exc: BaseException) -> None:
        """A request failed past its retries: a transient failure marks the source down."""
        if not isinstance(exc, Transient):  # the store answered (not found, denied, changed)
            self.succeeded()
            return
        if isinstance(exc, (Throttled, SourceDown)):
            return
        if self.down_since is not None:
            return
        self.down_since = time.monotonic()
        self._reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._gauge.set(0)
        log.warning("source %s is down: %s; reads needing it fail at once", self.source, exc)
        if self._woken is not None:
            self._woken.set()

    def terms(
        self, on_throttled: Callable[[BaseException], None] | None = None
    ) -> retry.RetryTerms:
        """The terms of a request to this source made now (from a trio task): the breaker as
        its gate, the asking reader's bound, `on_throttled` told of the store's throttling."""
        return retry.terms(self.check, on_throttled, self.recoveries)

    async def call(
        self,
        limiter: AbstractAsyncContextManager[object],
        fn: Callable[..., T],
        *args: object,
        counts: bool = True,
    ) -> T:
        """`fn(*args)`, a store request, in a worker thread under `limiter`, through the
        breaker: refused at once while the source is down, also when it went down while this
        waited for a permit (checked again in the thread: a call that then asks the store
        nothing, the rest of a listing already fetched, must not pass for the store's answer
        and mark the source up), its outcome recorded (a failure only when it `counts`). A
        request that hands its backend this breaker's `terms` is also stopped when the source
        goes down between two attempts of its retries."""
        self.check()
        try:
            result: T = await run_blocking(limiter, _checked, self.check, fn, *args)
        except Exception as exc:
            if counts:
                self.failed(exc)
            raise
        self.succeeded()
        return result

    def _mark_up(self) -> None:
        down_for = time.monotonic() - (self.down_since or time.monotonic())
        self.down_since = None
        self.recoveries += 1
        self._gauge.set(1)
        log.warning("source %s is up again after %.1fs down", self.source, down_for)

    async def watch(self) -> None:
        """Probe the source whenever it is down, until cancelled: the mount runs it in its own
        nursery, so the probes end with the mount (without it, a source once down stays down)."""
        while True:
            while self.down_since is None:
                self._woken = trio.Event()
                await self._woken.wait()
            await self._probing()

    async def _probing(self) -> None:
        interval = PROBE_FIRST
        async with trio.open_nursery() as probes:
            while self.down_since is not None:
                await trio.sleep(interval)
                if self.down_since is None:  # a request got through meanwhile
                    return
                if len(probes.child_tasks) < PROBES_AT_ONCE:
                    probes.start_soon(self._probe_once)
                interval = min(interval * 2, PROBE_MAX)

    async def _probe_once(self) -> None:
        try:
            await self._probe()
        except Exception as exc:  # still down: the next probe is already scheduled
            log.debug("probe of %s failed: %s", self.source, exc)
            return
        if self.down_since is not None:
            self._mark_up()


def _checked(check: Callable[[], None], fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` once `check` passes (in the worker thread)."""
    check()
    return fn(*args)

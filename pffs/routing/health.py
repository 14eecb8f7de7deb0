"""Each source's health: a circuit breaker, so reads fail at once while a store is down.

A source is up until a reader's store request fails past its retries with a transient error (a
timeout, a refused connection, a 5xx): then it is down. Failures of loads ahead do not count
(their readers fetch the blocks themselves, and their failures do), so a blip in the background
never fails a reader. While it is down, `check()` raises
`SourceDown` (EIO) at once, so a read that needs the store does not wait out another retry
budget; cached blocks and listings within their TTL are still served, because they never ask.
Writes do not consult the breaker: they keep their staged data and their own errors.

While down, one probe at a time (the backend's `check`: on S3 a HEAD of the bucket and a
one-key LIST of the mount's prefix, with the short retry policy of the mount's preflight) runs
after PROBE_FIRST seconds, then at doubling intervals up to PROBE_MAX. The first probe
that succeeds marks the source up again, without a remount. Each change is one log line and
the gauge `pffs_source_up{source}` (in `.pffs/stats` and `pffs stats`).

Throttling (`Throttled`: 503 SlowDown, 429) never marks a source down: the store is alive and
asks for fewer requests, which the pace of loading ahead answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from pffs import metrics
from pffs.errors import SourceDown, Throttled, Transient

T = TypeVar("T")
log = logging.getLogger("pffs.health")

# Seconds before the first probe, and the cap on the doubling interval between probes.
PROBE_FIRST = 1.0
PROBE_MAX = 15.0

_breakers: dict[str, SourceHealth] = {}  # by source id, like the metrics' labels


def register(source: str, probe: Callable[[], Awaitable[object]]) -> SourceHealth:
    """The breaker of a source being mounted (replacing an earlier mount's in this process)."""
    breaker = SourceHealth(source, probe)
    _breakers[source] = breaker
    return breaker


def of(source: str) -> SourceHealth | None:
    """The breaker of a mounted source; None for a backend no mount table holds (warmup)."""
    return _breakers.get(source)


class SourceHealth:
    """The breaker of one source. Changed only from trio tasks; `check` only reads, so a worker
    thread may call it too."""

    def __init__(self, source: str, probe: Callable[[], Awaitable[object]]) -> None:
        self.source = source
        self._probe = probe
        self.down_since: float | None = None
        self._reason = ""
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
        trio.lowlevel.spawn_system_task(self._probing, name=f"pffs-probe {self.source}")

    async def observe(self, request: Callable[[], Awaitable[T]], counts: bool = True) -> T:
        """Await `request()` after checking the breaker, and record its outcome (a failure
        only when it `counts`)."""
        self.check()
        try:
            result = await request()
        except Exception as exc:
            if counts:
                self.failed(exc)
            raise
        self.succeeded()
        return result

    def _mark_up(self) -> None:
        down_for = time.monotonic() - (self.down_since or time.monotonic())
        self.down_since = None
        self._gauge.set(1)
        log.warning("source %s is up again after %.1fs down", self.source, down_for)

    async def _probing(self) -> None:
        interval = PROBE_FIRST
        while self.down_since is not None:
            await trio.sleep(interval)
            if self.down_since is None:  # a request got through meanwhile
                return
            try:
                await self._probe()
            except Exception as exc:  # still down: probe again later
                log.debug("probe of %s failed: %s", self.source, exc)
                interval = min(interval * 2, PROBE_MAX)
                continue
            self._mark_up()

"""How many requests loading ahead may be in flight: additive increase, multiplicative decrease.

Loading ahead (a file's readahead, pffs.fs.reads, and preload, pffs.fs.datasets) runs its store
requests under a limiter of its own, never the readers' (a reader's request never queues behind
a load ahead). `Pace`
adjusts that limiter: a push back from the store (a 503 SlowDown or 429, a timeout, anything a
retry loop retries) halves it, at most once per `COOLDOWN` seconds (the requests already in
flight carry news of the same crowding); every `current` requests that went well add one
place back, up to the ceiling. So under throttling loading ahead gives way first and grow back
slowly once the store keeps up.

Push backs are seen in worker threads (pffs.retry calls `pushed_back` from its loop), so they
are only noted there; the limiter, a trio object, is changed on the trio side when a request
next takes a place (`settle`).
"""

from __future__ import annotations

import time

import trio

# Seconds after a halving during which further push backs count as the same one.
COOLDOWN = 1.0


class Pace:
    """AIMD on one limiter's size."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limiter = trio.CapacityLimiter(ceiling)
        # Set by worker threads, cleared by `settle`: a flag, so a thread's write never races
        # with a count (two push backs at once are one signal anyway).
        self._pushed_back = False
        self._credit = 0.0
        self._last_halving = -COOLDOWN

    @property
    def current(self) -> int:
        return int(self.limiter.total_tokens)

    def pushed_back(self, _exc: BaseException | None = None) -> None:
        """The store pushed back on a request (any thread)."""
        self._pushed_back = True

    def went_well(self) -> None:
        """A request succeeded without push back (trio side): grow by one per window."""
        self._credit += 1 / self.current
        if self._credit >= 1 and self.current < self.ceiling:
            self._credit = 0.0
            self.limiter.total_tokens = self.current + 1

    def settle(self) -> None:
        """Apply the push backs counted since the last call (trio side)."""
        if not self._pushed_back:
            return
        self._pushed_back = False
        now = time.monotonic()
        if now - self._last_halving < COOLDOWN:
            return
        self._last_halving = now
        self._credit = 0.0
        self.limiter.total_tokens = max(1, self.current // 2)

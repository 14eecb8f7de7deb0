"""A source's pace: how many requests loading ahead may have in flight there, and who gets them.

Loading ahead is every store request no reader is waiting on yet: a file's readahead (and the
GET at its open, pffs.fs.reads), preload (pffs.fs.datasets) and warmup (pffs.mounting.warmup).
Each source has one `Pace` (on its `Mounted`), and every such request takes one of its places,
never a reader's (a reader's request never queues behind a load ahead).

How many places: additive increase, multiplicative decrease. A push back from the store (a 503
SlowDown or 429, a timeout, anything a retry loop retries, or a request that failed with one)
halves them, at most once per `COOLDOWN` seconds (the requests already in flight carry news of
the same crowding); every `current` requests that went well add one place back, up to the
ceiling. So under throttling loading ahead gives way first and grows back slowly once the store
keeps up.

Who gets them, the one rule: readahead first. A place that frees goes to the most urgent use
waiting, in the order of `USES` (readahead, then preload, then warmup), first come first served
within a use; and preload and warmup together hold at most `BACKGROUND_SHARE` of the places (one
at least), so a readahead request finds a place free even while the store stalls every preload.
Readahead is urgent because a reader is about to read what it loads (a reader's first READ
joins the GET at its open); preload and warmup load for later and take what readahead leaves.

Push backs are seen in worker threads (pffs.retry calls `pushed_back` from its loop), so they
are only noted there; the places change on the trio side when a request next takes or gives
back a place (`settle`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import trio

# Seconds after a halving during which further push backs count as the same one.
COOLDOWN = 1.0
# Loading ahead's places per place of the source's readers (its `max_concurrency`): many small
# requests in flight hide the store's round trip, which readers waiting on bytes do not need.
AHEAD_PER_READER_PLACE = 4
# The share of the places preload and warmup may hold between them; the rest waits for readahead.
BACKGROUND_SHARE = 0.75

Use = Literal["readahead", "preload", "warmup"]
USES: tuple[Use, ...] = ("readahead", "preload", "warmup")  # most urgent first


def ceiling_for(max_concurrency: int) -> int:
    """The places of loading ahead of a source whose readers have `max_concurrency`."""
    return AHEAD_PER_READER_PLACE * max_concurrency


@dataclass(eq=False)
class _Waiter:
    event: trio.Event = field(default_factory=trio.Event)
    granted: bool = False


class Pace:
    """A source's places for loading ahead: AIMD on their number, shared by urgency."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.current = ceiling
        self.in_flight: dict[Use, int] = dict.fromkeys(USES, 0)
        self._waiting: dict[Use, deque[_Waiter]] = {use: deque() for use in USES}
        self.pushbacks = 0  # push backs heard (a counter for the metrics)
        self.halvings = 0
        # Set by worker threads, cleared by `settle`: a flag, so a thread's write never races
        # with a count (two push backs at once are one signal anyway).
        self._pushed_back = False
        self._credit = 0.0
        self._last_halving = -COOLDOWN

    def gauges(self) -> dict[str, int]:
        """The pace's figures, as the metrics read them (any thread: reads only)."""
        values = {
            "places": self.current,
            "ceiling": self.ceiling,
            "pushbacks": self.pushbacks,
            "halvings": self.halvings,
        }
        for use in USES:
            values[f"{use}_in_flight"] = self.in_flight[use]
            values[f"{use}_waiting"] = len(self._waiting[use])
        return values

    @asynccontextmanager
    async def place(self, use: Use) -> AsyncIterator[None]:
        """Hold one place for a request of `use` (waiting for one by the rule above)."""
        self.settle()
        await self._take(use)
        try:
            yield
        finally:
            self._give_back(use)

    def pushed_back(self, _exc: BaseException | None = None) -> None:
        """The store pushed back on a request (any thread)."""
        self._pushed_back = True

    def went_well(self) -> None:
        """A request succeeded without push back (trio side): grow by one per window."""
        self._credit += 1 / self.current
        if self._credit >= 1 and self.current < self.ceiling:
            self._credit = 0.0
            self.current += 1
            self._hand_over()

    def settle(self) -> None:
        """Apply the push backs noted since the last call (trio side)."""
        if not self._pushed_back:
            return
        self._pushed_back = False
        self.pushbacks += 1
        now = trio.current_time()
        if now - self._last_halving < COOLDOWN:
            return
        self._last_halving = now
        self.halvings += 1
        self._credit = 0.0
        self.current = max(1, self.current // 2)

    # --- places ------------------------------------------------------------------------------

    def _taken(self) -> int:
        return sum(self.in_flight.values())

    def share(self, use: Use) -> int:
        """The places requests of `use` may hold now (if no other use holds any)."""
        if use == "readahead":
            return self.current
        return max(1, int(BACKGROUND_SHARE * self.current))

    def _free_for(self, use: Use) -> bool:
        """Whether a request of `use` may take a place now (waiters aside)."""
        if self._taken() >= self.current:
            return False
        background = self._taken() - self.in_flight["readahead"]
        return use == "readahead" or background < self.share(use)

    async def _take(self, use: Use) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        ahead_of_it = USES[: USES.index(use) + 1]
        if self._free_for(use) and not any(self._waiting[u] for u in ahead_of_it):
            self.in_flight[use] += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter()
        self._waiting[use].append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # granted as it was cancelled: pass the place on
                self._give_back(use)
            else:
                self._waiting[use].remove(waiter)
            raise

    def _give_back(self, use: Use) -> None:
        self.in_flight[use] -= 1
        self.settle()
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free places to the waiters, the most urgent use first."""
        while True:
            use = next((u for u in USES if self._waiting[u] and self._free_for(u)), None)
            if use is None:
                return
            waiter = self._waiting[use].popleft()
            waiter.granted = True
            self.in_flight[use] += 1
            waiter.event.set()

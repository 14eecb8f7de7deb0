"""A source's request permits: how many requests may be in flight to one store, and who goes first.

Each source (a mount table entry, and a shared tier's store) has one `SourceFlow`, and every
store request takes one of its permits, by priority (`Priority`, most urgent first):

- `reader`: a caller waiting on the store: a reader's bytes, a lookup, a listing, a write's
  upload, a peer's ask served at its owner (pffs.group.server: a reader on another node
  waits on it). At most the source's `max_concurrency` at once; never paced, so a reader waits
  only on other waiting readers, never behind a load ahead.
- `readahead`, `preload`, `warmup`: loading ahead, every request no reader waits on yet: a
  file's readahead (and the GET at its open, pffs.fs.reads), a region's spans
  (pffs.fs.regions), preload (pffs.fs.datasets) and warmup (pffs.mounting.warmup). They share
  the source's `Pace`, permits of their own beside the readers' (a reader's request never
  queues behind them).
- `write_behind`: a block written to a store for later readers (the shared tier's copies of
  blocks no other mount waits for, pffs.group.shared): `WRITES_BEHIND` at once, unpaced.
- `probe`: whether a source that is down answers again (pffs.routing.health): `PROBES_AT_ONCE`
  at once, beside the readers' (whose requests are refused while it is down).

How many permits loading ahead gets: additive increase, multiplicative decrease. The store
throttling a request (a 503 SlowDown or 429, a timeout, anything a retry loop retries, or a
request that failed with one) halves them, at most once per `COOLDOWN` seconds (the requests
already in flight carry news of the same crowding); every `current` requests that went well add
one permit back, up to the ceiling (`AHEAD_PER_READER_PERMIT` x `max_concurrency`). So under
throttling loading ahead gives way first and grows back slowly once the store keeps up.

Who gets them, the one rule: readahead first. A permit that frees goes to the most urgent
priority waiting (readahead, then preload, then warmup), first come first served within one; and
preload and warmup together hold at most `BACKGROUND_SHARE` of the permits (one at least), so a
readahead request finds one free even while the store stalls every preload. Readahead is urgent
because a reader is about to read what it loads (a reader's first READ joins the GET at its
open); preload and warmup load for later and take what readahead leaves. The preload engine
works on as many files at once as the permits give it now (`share`), so none waits in the
queue here.

Throttling is seen in worker threads (pffs.retry calls `throttled` from its loop), so it is only
noted there; the permits change on the trio side when a request next takes or gives one back
(`settle`).

A cache group's requests to its peers (pffs.group.peers) are no store's: they take a permit of
the member's `PeerFlow` by the same rule, the asker's priority carried down with the ask
(pffs.group.sources): a reader's ask (and the owner's side's, on which a reader on another node
waits) one of `PEER_REQUESTS` of its own, loads ahead a pace of `PEER_REQUESTS` shared
readahead first; so a reader's ask never queues behind a preload's. A peer never throttles, so
that pace stays at its ceiling: it orders, it does not back off. Each peer serves its asks from
its own store under that store's flow. The numbers, and the measurements behind
them: docs/notes/flow-control.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import trio

# Seconds after a halving during which further throttling counts as the same crowding.
COOLDOWN = 1.0
# Loading ahead's permits per reader permit of the source (its `max_concurrency`): many small
# requests in flight hide the store's round trip, which readers waiting on bytes do not need.
AHEAD_PER_READER_PERMIT = 4
# The share of the permits preload and warmup may hold between them; the rest waits for
# readahead.
BACKGROUND_SHARE = 0.75
# Blocks a shared tier writes at once for later misses (a block other mounts wait for, one this
# mount claimed, is written as a reader's request instead).
WRITES_BEHIND = 4
# A source's health probes under way at once: each ends by its own short timeouts (seconds),
# the next starts on time (pffs.routing.health).
PROBES_AT_ONCE = 3
# A cache group member's requests to its peers at once (each a kept-alive connection while it
# lasts).
PEER_REQUESTS = 32

Priority = Literal["reader", "readahead", "preload", "warmup", "write_behind", "probe"]
# Loading ahead: the priorities the pace serves, most urgent first.
Ahead = Literal["readahead", "preload", "warmup"]
AHEAD: tuple[Ahead, ...] = ("readahead", "preload", "warmup")


def ceiling_for(max_concurrency: int) -> int:
    """The permits of loading ahead of a source whose readers have `max_concurrency`."""
    return AHEAD_PER_READER_PERMIT * max_concurrency


def at_once(flows: Iterable[SourceFlow], priority: Ahead, most: int) -> int:
    """Loads of `priority` to work on at once over `flows` (the files a preload engine starts):
    the permits the flows give that priority now, so each load finds one; `most` at most."""
    return min(most, sum(flow.share(priority) for flow in flows))


class PeerFlow:
    """A cache group member's permits for its requests to peers: readers' apart from loading
    ahead's."""

    def __init__(self, most: int = PEER_REQUESTS) -> None:
        self._readers = trio.CapacityLimiter(most)
        self.pace = Pace(most)

    def permit(self, priority: Priority) -> AbstractAsyncContextManager[object]:
        """One ask's permit of `priority`, held while the ask is in flight."""
        if priority == "readahead" or priority == "preload" or priority == "warmup":
            return self.pace.permit(priority)
        return self._readers


class SourceFlow:
    """One store's permits: the readers' cap, loading ahead's pace, the writes behind, the
    probes."""

    def __init__(self, max_concurrency: int) -> None:
        self._readers = trio.CapacityLimiter(max_concurrency)
        self.pace = Pace(ceiling_for(max_concurrency))
        self._writes_behind = trio.CapacityLimiter(WRITES_BEHIND)
        self._probes = trio.CapacityLimiter(PROBES_AT_ONCE)

    def permit(self, priority: Priority) -> AbstractAsyncContextManager[object]:
        """One request's permit of `priority`, to hold while the request is in flight (what
        pffs.workers.run_blocking and the breaker's `call` take)."""
        if priority == "reader":
            return self._readers
        if priority == "write_behind":
            return self._writes_behind
        if priority == "probe":
            return self._probes
        return self.pace.permit(priority)

    def throttled(self, _exc: BaseException | None = None) -> None:
        """The store throttled a request loading ahead (any thread)."""
        self.pace.throttled()

    def went_well(self) -> None:
        """A request loading ahead succeeded (trio side): the pace settles, then may grow."""
        self.pace.settle()
        self.pace.went_well()

    def share(self, priority: Ahead) -> int:
        """The permits requests of `priority` may hold now (if no other holds any)."""
        return self.pace.share(priority)

    def gauges(self) -> dict[str, int]:
        """The flow's figures, as the metrics read them (any thread: reads only)."""
        return self.pace.gauges()


@dataclass(eq=False)
class _Waiter:
    event: trio.Event = field(default_factory=trio.Event)
    granted: bool = False


class Pace:
    """A source's permits for loading ahead: AIMD on their number, shared by priority."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.current = ceiling
        self.in_flight: dict[Ahead, int] = dict.fromkeys(AHEAD, 0)
        self._waiting: dict[Ahead, deque[_Waiter]] = {p: deque() for p in AHEAD}
        self.throttles = 0  # throttled requests heard (a counter for the metrics)
        self.halvings = 0
        # Set by worker threads, cleared by `settle`: a flag, so a thread's write never races
        # with a count (two throttled requests at once are one signal anyway).
        self._throttled = False
        self._credit = 0.0
        self._last_halving = -COOLDOWN

    def gauges(self) -> dict[str, int]:
        """The pace's figures, as the metrics read them (any thread: reads only)."""
        values = {
            "permits": self.current,
            "ceiling": self.ceiling,
            "throttled": self.throttles,
            "halvings": self.halvings,
        }
        for priority in AHEAD:
            values[f"{priority}_in_flight"] = self.in_flight[priority]
            values[f"{priority}_waiting"] = len(self._waiting[priority])
        return values

    @asynccontextmanager
    async def permit(self, priority: Ahead) -> AsyncIterator[None]:
        """Hold one permit for a request of `priority` (waiting for one by the rule above)."""
        self.settle()
        await self._take(priority)
        try:
            yield
        finally:
            self._give_back(priority)

    def throttled(self, _exc: BaseException | None = None) -> None:
        """The store throttled a request (any thread)."""
        self._throttled = True

    def went_well(self) -> None:
        """A request succeeded without throttling (trio side): grow by one per window."""
        self._credit += 1 / self.current
        if self._credit >= 1 and self.current < self.ceiling:
            self._credit = 0.0
            self.current += 1
            self._hand_over()

    def settle(self) -> None:
        """Apply the throttling noted since the last call (trio side)."""
        if not self._throttled:
            return
        self._throttled = False
        self.throttles += 1
        now = trio.current_time()
        if now - self._last_halving < COOLDOWN:
            return
        self._last_halving = now
        self.halvings += 1
        self._credit = 0.0
        self.current = max(1, self.current // 2)

    # --- permits -----------------------------------------------------------------------------

    def _taken(self) -> int:
        return sum(self.in_flight.values())

    def share(self, priority: Ahead) -> int:
        """The permits requests of `priority` may hold now (if no other holds any)."""
        if priority == "readahead":
            return self.current
        return max(1, int(BACKGROUND_SHARE * self.current))

    def _free_for(self, priority: Ahead) -> bool:
        """Whether a request of `priority` may take a permit now (waiters aside)."""
        if self._taken() >= self.current:
            return False
        background = self._taken() - self.in_flight["readahead"]
        return priority == "readahead" or background < self.share(priority)

    async def _take(self, priority: Ahead) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        ahead_of_it = AHEAD[: AHEAD.index(priority) + 1]
        if self._free_for(priority) and not any(self._waiting[p] for p in ahead_of_it):
            self.in_flight[priority] += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter()
        self._waiting[priority].append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # granted as it was cancelled: pass the permit on
                self._give_back(priority)
            else:
                self._waiting[priority].remove(waiter)
            raise

    def _give_back(self, priority: Ahead) -> None:
        self.in_flight[priority] -= 1
        self.settle()
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free permits to the waiters, the most urgent priority first."""
        while True:
            priority = next((p for p in AHEAD if self._waiting[p] and self._free_for(p)), None)
            if priority is None:
                return
            waiter = self._waiting[priority].popleft()
            waiter.granted = True
            self.in_flight[priority] += 1
            waiter.event.set()

"""Single-flight: one load per block, however many readers ask for it at once.

While a block is being loaded (from the disk tier or the store, for a reader or loaded ahead) the
table holds its flight. A reader that finds one waits for it instead of loading the block
again. When the flight ends, every waiter gets the bytes or the error; when it was abandoned
(its task was cancelled, its load ahead given up), they get nothing and load the block
themselves. The table is touched only from trio tasks.
"""

from __future__ import annotations

import trio

from pffs.cache.keys import BlockKey


class Flight:
    """One load of one block that several readers may wait on."""

    def __init__(self, ahead: bool = False) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.ahead = ahead  # loaded ahead, and no reader has asked for it yet
        self.tier = "store"  # where the bytes came from: "disk" or "store" (for metrics)

    async def outcome(self) -> bytes | None:
        """Wait for the flight to end: its bytes, its error raised, or None when abandoned."""
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.data


class SingleFlight:
    """The flights under way, by block."""

    def __init__(self) -> None:
        self._flights: dict[BlockKey, Flight] = {}

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._flights

    def get(self, key: BlockKey) -> Flight | None:
        return self._flights.get(key)

    def start(self, key: BlockKey, ahead: bool = False) -> Flight:
        """Register a new flight for `key`: readers arriving from now on wait for it."""
        flight = Flight(ahead)
        self._flights[key] = flight
        return flight

    def land(self, key: BlockKey, flight: Flight, data: bytes, tier: str) -> None:
        """The block arrived (from `tier`): to everyone waiting on its flight."""
        flight.tier = tier
        flight.data = data
        self._settle(key, flight)

    def abandon(self, key: BlockKey, flight: Flight, error: Exception | None) -> None:
        """A flight ends without data: waiters get the error, or (None) load it themselves."""
        flight.error = error
        self._settle(key, flight)

    def _settle(self, key: BlockKey, flight: Flight) -> None:
        flight.done.set()
        if self._flights.get(key) is flight:
            del self._flights[key]

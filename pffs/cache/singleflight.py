"""Single-flight: one load per block, however many readers ask for it at once.

While a block is being loaded (from the disk tier or the store, for a reader or loaded ahead) the
table holds its flight. A reader that finds one waits for it instead of loading the block
again. When the flight ends, every waiter gets the bytes or the error; when it was abandoned
(its task was cancelled, its load ahead given up), they get nothing and load the block
themselves. The table is touched only from trio tasks.

It is the one registry of blocks on their way. A flight's bytes can also be streamed as they
arrive (`Flight.stream`: its `Pieces`, pffs.cache.pieces): on a mount in a cache group, the
store adds each piece of a block it sends to the block's flight, and a peer's request for the
block (pffs.group.server) streams them from the first piece, whoever started the fetch (a
reader, readahead, preload, another peer). A flight nobody streams keeps no pieces.
"""

from __future__ import annotations

import trio

from pffs.cache.keys import BlockKey
from pffs.cache.pieces import Pieces
from pffs.errors import Corrupted


class Flight:
    """One load of one block that several readers may wait on."""

    def __init__(self, ahead: bool = False) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.ahead = ahead  # loaded ahead, and no reader has asked for it yet
        self.tier = "store"  # where the bytes came from: "disk" or "store" (for metrics)
        self.pieces: Pieces | None = None  # its bytes as they arrive, once asked to stream

    def stream(self, length: int) -> Pieces:
        """The block's pieces as they arrive (a block of `length` bytes), made on the first
        ask: the fetch adds them (pffs.store.fetching), a peer's request streams them. Ends
        with the flight: the whole block when it lands, the error when it is given up."""
        if self.pieces is None:
            self.pieces = Pieces(length)
            if self.done.is_set():
                self._end_pieces()
        return self.pieces

    def _end_pieces(self) -> None:
        if self.pieces is None:
            return
        if self.data is not None:
            self.pieces.finish(self.data)
        else:  # given up: nobody waits on pieces that will not come
            self.pieces.fail(self.error or Corrupted("the block's fetch stopped"))

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

    async def part_of(
        self, key: BlockKey, block_length: int, start: int, length: int
    ) -> bytes | None:
        """Bytes [start, start+length) of a block of `block_length` bytes on its way, once its
        flight's pieces cover them (a cold small read joining the block's load, made by the
        block source that knows the flight streams: pffs.store.fetching, pffs.group.sources);
        None when the block has no flight, or its flight ends without them."""
        flight = self._flights.get(key)
        if flight is None:
            return None
        return await flight.stream(block_length).covering(start, length)

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
        flight._end_pieces()
        if self._flights.get(key) is flight:
            del self._flights[key]

"""A block's bytes as they arrive from its store, for whoever joins its fetch.

A block on its way from the store is announced on its mount's `Arriving` board (the fetch path,
pffs.store.fetching, does it when a cache group is joined, whatever started the fetch: a reader, a
load ahead, a peer's request); its pieces are added to its `Pieces` as the store sends them.
A cache group's peer request for that block (pffs.group.owner) streams them from the
first piece, so an asker joining an owner's fetch gets the bytes as soon as the owner does.
`finish` ends it with the whole block (given at once when it came from a tier or the cache, not
in pieces); `fail` ends it with the error (a request that has sent nothing yet answers 503, one
mid-stream closes its connection: the asker sees a short body and reads the store itself).
Touched only from trio tasks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import trio

from pffs.cache.keys import BlockKey
from pffs.errors import Corrupted


class Pieces:
    def __init__(self, length: int) -> None:
        self.length = length
        self._pieces: list[bytes] = []
        self._got = 0
        self._done = False
        self.error: BaseException | None = None
        self._changed = trio.Event()

    @property
    def fresh(self) -> bool:
        """Nothing arrived yet, nor ended: a fetch starting now may fill it."""
        return not self._pieces and not self._done

    def add(self, piece: bytes) -> None:
        if self._done or self._got + len(piece) > self.length:
            return  # a store that sends more than the block (never expected): cut at its end
        self._pieces.append(piece)
        self._got += len(piece)
        self._wake()

    def finish(self, data: bytes) -> None:
        """The whole block: the pieces not yet added are its rest."""
        if self._done:
            return
        if self._got == 0:
            self._pieces.append(data)
        elif self._got < len(data):
            self._pieces.append(data[self._got :])
        self._got = len(data)
        self._done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self.error = error
            self._done = True
            self._wake()

    async def started(self) -> bool:
        """Wait for the first piece, or the end: whether there are bytes to send."""
        while not self._pieces and not self._done:
            await self._changed.wait()
        return bool(self._pieces)

    async def stream(self) -> AsyncIterator[bytes]:
        """Every piece in order, as it arrives; the error raised when the fetch failed."""
        sent = 0
        while True:
            while sent < len(self._pieces):
                yield self._pieces[sent]
                sent += 1
            if self._done:
                if self.error is not None:
                    raise self.error
                return
            await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


class Arriving:
    """The blocks on their way to this mount now, by key, each with its pieces so far."""

    def __init__(self) -> None:
        self._blocks: dict[BlockKey, Pieces] = {}

    def get(self, key: BlockKey) -> Pieces | None:
        return self._blocks.get(key)

    def announce(self, key: BlockKey, length: int) -> Pieces:
        """The block's pieces for a fetch starting now: the ones already announced when
        nothing has reached them yet (a peer's request announces a block before the fetch it
        starts reaches the store), else new ones."""
        pieces = self._blocks.get(key)
        if pieces is None or not pieces.fresh:
            pieces = self._blocks[key] = Pieces(length)
        return pieces

    def withdraw(self, key: BlockKey, pieces: Pieces) -> None:
        """The fetch ended: failed if they never finished (a fetch given up), so nobody waits
        on them; off the board."""
        pieces.fail(Corrupted("the block's fetch stopped"))  # nothing when it ended
        if self._blocks.get(key) is pieces:
            del self._blocks[key]

    @contextmanager
    def expecting(self, key: BlockKey, length: int) -> Iterator[Pieces]:
        """The block's pieces (`announce`) while its fetch runs, withdrawn at its end."""
        pieces = self.announce(key, length)
        try:
            yield pieces
        finally:
            self.withdraw(key, pieces)

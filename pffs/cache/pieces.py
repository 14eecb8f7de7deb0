"""A block's bytes as they arrive from its store, for whoever joins its fetch.

A block on its way is a flight (pffs.cache.singleflight, the one registry of blocks on their
way); on a mount in a cache group, the fetch path (pffs.store.fetching) adds each piece of a
whole block it streams to the flight's `Pieces`, whatever started the fetch: a reader, a load
ahead, a peer's request. A cache group's peer request for that block (pffs.group.server)
streams them from the first piece, so an asker joining an owner's fetch gets the bytes as soon
as the owner does. `finish` ends it with the whole block (given at once when it came from a
tier or the cache, not in pieces); `fail` ends it with the error (a request that has sent
nothing yet answers 503, one mid-stream closes its connection: the asker sees a short body and
reads the store itself). Touched only from trio tasks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio


class Pieces:
    def __init__(self, length: int) -> None:
        self.length = length
        self._pieces: list[bytes] = []
        self._got = 0
        self._done = False
        self.error: BaseException | None = None
        self._changed = trio.Event()

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

    async def covering(self, start: int, length: int) -> bytes | None:
        """Bytes [start, start+length) of the block once the pieces cover them (a cold small
        read joining the block's fetch); None when the fetch ended without them (given up, or
        failed: the reader then asks for its bytes itself and sees its own outcome)."""
        end = start + length
        while self._got < end and not self._done:
            await self._changed.wait()
        if self._got < end:
            return None
        parts: list[bytes] = []
        at = 0  # where the current piece starts in the block
        for piece in self._pieces:
            stop = at + len(piece)
            if stop > start and at < end:
                parts.append(piece[max(start - at, 0) : min(end, stop) - at])
            if stop >= end:
                break
            at = stop
        return parts[0] if len(parts) == 1 else b"".join(parts)

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

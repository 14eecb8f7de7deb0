"""A block loaded behind a cold read of its first bytes, taking those bytes from that read.

A read wanting a small part of a block nobody holds (a file's first READ: 1 MiB of a 4 MiB block)
gets its bytes with a request of its own while the block loads behind it (the cold start,
pffs.fs.reads). Loaded whole, the block asks the store again for the bytes the read's request
brings: 1 MiB of every file read cold from its start, 2-5% of a scan's or a tar stream's bytes
(docs/notes/clients-first-reads.md). When the read starts at the block's start, its block is
loaded through `HeadFirst` instead: the load asks the store for the rest of the block only, at
once, and takes the head from the read's request when it has come. The read's own request is
as before (a reader's, asked first), so the read waits no longer; a read whose request failed
or was cancelled leaves the head to the load, which then asks for it itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio

from pffs.cache.keys import Blocks
from pffs.store.fetching import StoreBlocks


class Head:
    """The bytes of a block's head, as the read's own request brings them (or not)."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.done = trio.Event()

    def arrived(self, data: bytes) -> None:
        self.data = data
        self.done.set()

    def failed(self) -> None:
        """The read's request failed or was cancelled: the load asks for the head itself."""
        self.done.set()


class HeadFirst:
    """The block source of one block load (`index`): its first `length` bytes from a read's
    request (`head`), the rest of the block from the store. Other runs go to the store."""

    def __init__(self, store: StoreBlocks, index: int, length: int, head: Head) -> None:
        self.store = store
        self.index = index
        self.length = length
        self.head = head

    async def part(self, offset: int, length: int) -> bytes:
        return await self.store.part(offset, length)

    def run(self, first: int, count: int) -> Blocks:
        if first != self.index or count != 1:
            return self.store.run(first, count)
        return self._block()

    @trio.as_safe_channel
    async def _block(self) -> AsyncGenerator[tuple[int, bytes], None]:
        blocks = self.store.blocks
        start, size = blocks.start(self.index), blocks.length(self.index)
        rest = await self._ahead(start + self.length, size - self.length)
        await self.head.done.wait()
        head = self.head.data
        if head is None:
            head = await self._ahead(start, self.length)
        yield self.index, head + rest

    async def _ahead(self, offset: int, length: int) -> bytes:
        """Bytes of the block loaded ahead: one request, in a place of the pace like the rest
        of the load (as pffs.fs.regions' `SpansFirst`), in one piece (nobody streams them)."""
        async with self.store.stream(offset, [length], True) as pieces:
            return b"".join([piece async for piece in pieces])

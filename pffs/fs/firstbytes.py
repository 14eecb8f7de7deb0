"""A block loaded behind a cold read of its first bytes, taking those bytes from that read.

A read wanting a small part of a block nobody holds (a file's first READ: 1 MiB of a 4 MiB block)
gets its bytes with a request of its own while the block loads behind it (the cold start,
pffs.fs.reads). Loaded whole, the block asks the store again for the bytes the read's request
brings: 1 MiB of every file read cold from its start, 1-2% of a scan's or a tar stream's bytes
(docs/notes/clients-first-reads.md). When the read starts at the block's start, its block is
loaded through `HeadFirst` instead: the load asks the store for the rest of the block only, at
once, and takes the head from the read's request when it has come. The read's own request is
as before (a reader's, asked first), so the read waits no longer; a read whose request failed
or was cancelled leaves the head to the load, which then asks for it itself.
"""

from __future__ import annotations

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
        return _Block(self)


class _Block(trio.abc.ReceiveChannel[tuple[int, bytes]]):
    """The run of the one block `HeadFirst` loads, as a channel that fetches it when first
    asked, in the receiving task (as pffs.store.fetching's `_OneBlock`): the rest's request
    goes out at once, not after the task, nursery and channels a streamed run takes, which
    cost it 8-42 ms against the read's own request on a busy loop (the scan's trace,
    docs/notes/clients-first-reads.md)."""

    def __init__(self, loading: HeadFirst) -> None:
        self._loading: HeadFirst | None = loading

    async def receive(self) -> tuple[int, bytes]:
        loading = self._loading
        if loading is None:
            raise trio.EndOfChannel
        self._loading = None
        store, index, length = loading.store, loading.index, loading.length
        start, size = store.blocks.start(index), store.blocks.length(index)
        rest = await store.ahead(start + length, size - length)
        await loading.head.done.wait()
        head = loading.head.data
        if head is None:
            head = await store.ahead(start, length)
        return index, head + rest

    async def aclose(self) -> None:
        self._loading = None
        await trio.lowlevel.checkpoint()

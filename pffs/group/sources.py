"""Block sources before the store: how the fetch path asks one, whatever it is.

A `BlockSource` is asked for the blocks it `asks` for (a peer's blocks in a cache group, every
block for a shared tier) before the store; a block it cannot give (None) comes from the store,
and every block the store serves is handed to its `landed` (a shared tier writes it there).
`Asking` wraps the store's fetches in one: `fetch_runs` for a run of blocks (a reader's miss,
readahead, preload, warmup), delivered in order, and `fetch_range` for the bytes of one block a
reader wants. pffs.fs.fetching finds the joined source with `pffs.group.current()`.
"""

from __future__ import annotations

from typing import Protocol

import trio

from pffs.cache.keys import Deliver, FetchRun, ObjectBlocks


class BlockSource(Protocol):
    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        """Whether this source may hold the block (else the store is asked at once)."""

    async def fetch_block(self, blocks: ObjectBlocks, index: int) -> bytes | None:
        """The block, checked; None when the store must serve it."""

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        """A block the store served (called from the trio task that received it)."""

    def close(self) -> None: ...


class Asking:
    """The store's fetches with a block source asked first."""

    def __init__(self, source: BlockSource) -> None:
        self.source = source

    def fetch_runs(self, blocks: ObjectBlocks, base: int, store_run: FetchRun) -> FetchRun:
        """`store_run` with the blocks the source may hold asked of it first, in order."""
        source = self.source

        async def from_store(first: int, count: int, deliver: Deliver) -> None:
            async def landed(position: int, data: bytes) -> None:
                source.landed(blocks, base + position, data)
                await deliver(position, data)

            await store_run(first, count, landed)

        async def fetch_run(first: int, count: int, deliver: Deliver) -> None:
            end = first + count
            asked = [p for p in range(first, end) if source.asks(blocks, base + p)]
            if not asked:
                await from_store(first, count, deliver)
                return
            results: dict[int, bytes | None] = {}
            arrived = {position: trio.Event() for position in asked}

            async def ask(position: int) -> None:
                try:
                    results[position] = await source.fetch_block(blocks, base + position)
                finally:
                    arrived[position].set()

            async with trio.open_nursery() as nursery:
                for position in asked:
                    nursery.start_soon(ask, position)
                position = first
                while position < end:
                    if position not in arrived:  # a run of blocks only the store serves
                        stop = position
                        while stop < end and stop not in arrived:
                            stop += 1
                        await from_store(position, stop - position, deliver)
                        position = stop
                        continue
                    await arrived[position].wait()
                    data = results.get(position)
                    if data is None:
                        await from_store(position, 1, deliver)
                    else:
                        await deliver(position, data)
                    position += 1

        return fetch_run

    async def fetch_range(self, blocks: ObjectBlocks, offset: int, length: int) -> bytes | None:
        """Bytes [offset, offset+length) from the source, when one block holds them and the
        source gives it; None otherwise (then the store serves them)."""
        index = offset // blocks.block_size
        start = offset - blocks.start(index)
        if length <= 0 or start + length > blocks.length(index):
            return None
        if not self.source.asks(blocks, index):
            return None
        data = await self.source.fetch_block(blocks, index)
        if data is None:
            return None
        return data if start == 0 and length == len(data) else data[start : start + length]

    def stored(self, blocks: ObjectBlocks, offset: int, data: bytes) -> None:
        """The store served these bytes: a whole block goes to the source's `landed`."""
        index = offset // blocks.block_size
        if offset == blocks.start(index) and len(data) == blocks.length(index):
            self.source.landed(blocks, index, data)

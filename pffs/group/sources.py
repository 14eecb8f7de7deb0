"""A tier before the store, as one more block source.

A `Tier` (a cache group's peers, a shared tier) is asked for the blocks it `asks` for (a peer's
blocks in a cache group, every block for a shared tier); a block it cannot give (None) comes
from the store, and every whole block the store serves is handed to its `landed` (a shared tier
writes it there). `TierFirst` is the `BlockSource` (pffs.cache.keys) of one open object version
with a tier asked before its store's own source: the cache asks it as it asks the store. The
fetch path (pffs.store.fetching) builds it from `Joined.before`: the tier a mount or warmup joined,
handed to the parts that open block sources when they are built (pffs.mounting).

Mounts sharing a tier would otherwise preload a dataset in the same order, each wanting the
same block at the same moment (and, on a shared tier, waiting on one another's claims):
`Joined.preload_order` is the order in which a member walks each window of a listing in its
dataset preload (pffs.fs.datasets), so the members walk it differently: a group member from its
place among the members (`member_order`: N members start N evenly spaced places apart), a
shared tier's mount, which knows nothing of the others, in a shuffle of its own
(`shuffled_order`, seeded by its name: two shuffles meet far less often than two starts
picked at random).
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

import trio

from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.cache.singleflight import SingleFlight
from pffs.flow.permits import Ahead, Priority


class Tier(Protocol):
    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        """Whether this tier may hold the block (else the store is asked at once)."""

    async def fetch_block(
        self, blocks: ObjectBlocks, index: int, priority: Priority = "reader"
    ) -> bytes | None:
        """The block, checked; None when the store must serve it. `priority`: who waits on
        it (pffs.flow.permits: a reader, or a load ahead)."""

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        """A block the store served (called from the trio task that received it)."""

    def close(self) -> None: ...


# The order a member walks a window of N files of a listing in: a permutation of range(N).
Order = Callable[[int], list[int]]


def shuffled_order(name: str, count: int) -> list[int]:
    """range(count) shuffled by a generator seeded by `name`: the same for the same name."""
    order = list(range(count))
    random.Random(f"pffs-preload:{name}").shuffle(order)
    return order


def member_order(name: str, members: Sequence[str], count: int) -> list[int]:
    """range(count) from member `name`'s place among the members' sorted names (the k-th of N
    starts k/N of the way) on, wrapping around; its own shuffle when it is not listed."""
    names = sorted(set(members))
    if name not in names:
        return shuffled_order(name, count)
    cut = names.index(name) * count // len(names)
    return [*range(cut, count), *range(cut)]


class Joined:
    """The tier a mount joined: what it puts before each object's store, the flights the
    store fills piece by piece (`arriving`: a cache group's mount's cache's, whose peers join
    them; None for a shared tier or an asker that serves no peers), and the order its dataset
    preload walks a listing's windows in (`preload_order`; None: listing order)."""

    def __init__(
        self,
        tier: Tier,
        arriving: SingleFlight | None = None,
        preload_order: Order | None = None,
    ) -> None:
        self.tier = tier
        self.arriving = arriving
        self.preload_order = preload_order

    def before(
        self, store: BlockSource, blocks: ObjectBlocks, priority: Ahead = "readahead"
    ) -> BlockSource:
        return TierFirst(self.tier, store, blocks, self.arriving, priority)


class TierFirst:
    """The blocks of one object version: from the tier where it has them, else the store.
    With `flights` (the mount's, pffs.cache.singleflight), a part of a block already on its
    way comes from its flight, never from a second ask of the tier. Its parts are asked of the
    tier as a reader's, its runs (loading ahead) as `priority`'s, as the store's own are."""

    def __init__(
        self,
        tier: Tier,
        store: BlockSource,
        blocks: ObjectBlocks,
        flights: SingleFlight | None = None,
        priority: Ahead = "readahead",
    ) -> None:
        self.tier = tier
        self.store = store
        self.blocks = blocks
        self.flights = flights
        self.priority = priority

    async def part(self, offset: int, length: int) -> bytes:
        """The tier's bytes when one block holds them and the tier gives it, else the store's
        (a whole block the store served is handed to the tier). A few bytes of a block on its
        way (a cold small read, which started the block's load: pffs.cache.blocks) are its
        flight's: the tier's block once it landed whole (checked), or the store's pieces."""
        blocks, tier, flights = self.blocks, self.tier, self.flights
        index = offset // blocks.block_size
        start = offset - blocks.start(index)
        whole = start == 0 and length == blocks.length(index)
        within = length > 0 and start + length <= blocks.length(index)
        if within and not whole and flights is not None and blocks.key(index) in flights:
            if tier.asks(blocks, index):
                key, size = blocks.key(index), blocks.length(index)
                data = await flights.part_of(key, size, start, length)
                if data is not None:
                    return data
            # The store's pieces where its fetch streams them (pffs.store.fetching), else a
            # ranged read of the store: the tier is asked once per flight.
            return await self.store.part(offset, length)
        if within and tier.asks(blocks, index):
            data = await tier.fetch_block(blocks, index, "reader")
            if data is not None:
                return data if whole else data[start : start + length]
        data = await self.store.part(offset, length)
        if whole:
            tier.landed(blocks, index, data)
        return data

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """The blocks the tier may hold are asked of it at once; each is yielded in order, the
        tier's when it gave it, else the store's (in runs, for blocks only the store serves)."""
        blocks, tier = self.blocks, self.tier
        end = first + count
        asked = [i for i in range(first, end) if tier.asks(blocks, i)]
        results: dict[int, bytes | None] = {}
        arrived = {index: trio.Event() for index in asked}

        async def ask(index: int) -> None:
            try:
                results[index] = await tier.fetch_block(blocks, index, self.priority)
            finally:
                arrived[index].set()

        async with trio.open_nursery() as nursery:
            for index in asked:
                nursery.start_soon(ask, index)
            index = first
            while index < end:
                if index in arrived:
                    await arrived[index].wait()
                    data = results.get(index)
                    if data is not None:
                        yield index, data
                        index += 1
                        continue
                    stop = index + 1  # the tier could not give it: the store serves it
                else:  # a run of blocks only the store serves
                    stop = index
                    while stop < end and stop not in arrived:
                        stop += 1
                async with self.store.run(index, stop - index) as landing:
                    async for landed, data in landing:
                        tier.landed(blocks, landed, data)
                        yield landed, data
                index = stop

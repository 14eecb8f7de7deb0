"""Who waits on a block asked of a tier (pffs.group.sources): `TierFirst` asks its runs (loads
ahead) as the priority of the store it was built for, and its parts as a reader's, so a
group's `PeerFlow` (pffs.flow.permits) paces loads ahead apart from readers. The tier here is a
recording stand-in for a group: what is under test is the priority `TierFirst` hands down,
which no peer sees (a group's own permits are tests/unit/test_flow_permits.py's)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio

from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.flow.permits import Priority
from pffs.group.sources import Joined

BLOCK = 1024
BLOCKS = ObjectBlocks("src", "p", "f.bin", "v1", 3 * BLOCK, BLOCK)


def block(index: int) -> bytes:
    return bytes([index]) * BLOCK


class Recording:
    """A tier holding every block, recording the priority each ask came with."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, Priority]] = []

    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        return True

    async def fetch_block(
        self, blocks: ObjectBlocks, index: int, priority: Priority = "reader"
    ) -> bytes | None:
        self.asked.append((index, priority))
        await trio.lowlevel.checkpoint()
        return block(index)

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class NoStore:
    """The store behind the tier: never reached (the tier gives every block)."""

    async def part(self, offset: int, length: int) -> bytes:
        raise AssertionError("the store was asked")

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        raise AssertionError("the store was asked")
        yield first, b""


def test_runs_ask_as_their_stores_priority_and_parts_as_a_reader() -> None:
    tier = Recording()
    for priority in ("readahead", "preload", "warmup"):
        tier.asked.clear()
        source = Joined(tier).before(NoStore(), BLOCKS, priority)

        async def main(source: BlockSource) -> None:
            async with source.run(0, 2) as landing:
                assert [index async for index, _ in landing] == [0, 1]
            assert await source.part(2 * BLOCK + 10, 20) == block(2)[10:30]

        trio.run(main, source)
        assert sorted(tier.asked) == [(0, priority), (1, priority), (2, "reader")]

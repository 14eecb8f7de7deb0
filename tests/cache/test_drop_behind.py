"""Drop-behind: blocks a sequential reader has passed leave the memory tier once on disk.

Through a real BlockCache and disk tier (a temporary directory): a passed block stays in memory
while its write behind is pending, leaves when it is written, leaves at once when the disk
already holds it, and stays where it never goes to disk (no disk tier, a memory-only source).
A re-read of a dropped block comes from the disk tier, never the store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import ObjectBlocks
from tests.cache.configs import KIB, cache_config
from tests.cache.test_block_source import CountingSource

BLOCK = 16 * KIB
BLOCKS = ObjectBlocks("mem://", "u", "f.bin", "v1", 6 * BLOCK, BLOCK)
DATA = bytes(range(256)) * (6 * BLOCK // 256)


@asynccontextmanager
async def _attached(cache: BlockCache) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        yield
        await cache.flush()


@asynccontextmanager
async def _disk_held(cache: BlockCache) -> AsyncIterator[None]:
    """Every disk thread taken: the write-behind's batches wait (pending) until the end."""
    holders = [object() for _ in range(int(cache._disk.limiter.total_tokens))]
    for holder in holders:
        await cache._disk.limiter.acquire_on_behalf_of(holder)
    try:
        yield
    finally:
        for holder in holders:
            cache._disk.limiter.release_on_behalf_of(holder)


async def _read_sequentially(cache: BlockCache, source: CountingSource, count: int) -> None:
    """Read blocks 0..count-1 in order, each block passing the one before (as Reader does)."""
    for index in range(count):
        block = await cache.read(BLOCKS.key(index), source, BLOCK)
        assert block == DATA[index * BLOCK : (index + 1) * BLOCK]
        if index:
            cache.passed(BLOCKS.key(index - 1))


def test_passed_blocks_stay_while_their_write_is_pending_and_leave_once_written(
    tmp_path: Path,
) -> None:
    source = CountingSource(DATA, BLOCKS)
    cache = BlockCache(cache_config(tmp_path))

    async def main() -> None:
        async with _attached(cache):
            # The disk tier's key filter read first (a first read replaces it whole, and the
            # writes' keys then join it with the index's next rows, up to a second later).
            cache.expect_reads()
            await cache.flush()
            async with _disk_held(cache):
                await _read_sequentially(cache, source, 4)
                # Blocks 0-2 are passed, their writes pending: still in memory.
                assert all(BLOCKS.key(index) in cache.memory for index in range(4))
            await cache.flush()
            # Written: the passed blocks left, the one being read (3) stays.
            assert [BLOCKS.key(index) in cache.memory for index in range(4)] == [
                False,
                False,
                False,
                True,
            ]
            assert cache.memory.used == BLOCK
            # On disk already: block 3 leaves as soon as it is passed.
            await _read_sequentially(cache, source, 5)
            assert BLOCKS.key(3) not in cache.memory
            await cache.flush()
            assert cache._disk._writing == {}  # the pending set holds nothing once written
            # A dropped block read again comes from the disk tier, not the store.
            parts = len(source.parts)
            assert await cache.read(BLOCKS.key(1), source, BLOCK) == DATA[BLOCK : 2 * BLOCK]
            assert len(source.parts) == parts
            assert cache.stats.disk_hits >= 1

    trio.run(main)
    assert source.parts == [(index * BLOCK, BLOCK) for index in range(5)]  # each fetched once


def test_passed_blocks_stay_in_memory_without_a_disk_tier(tmp_path: Path) -> None:
    source = CountingSource(DATA, BLOCKS)
    cache = BlockCache(cache_config(None))

    async def main() -> None:
        async with _attached(cache):
            await _read_sequentially(cache, source, 6)
        assert all(BLOCKS.key(index) in cache.memory for index in range(6))

    trio.run(main)


def test_passed_blocks_of_a_memory_only_source_stay_in_memory(tmp_path: Path) -> None:
    source = CountingSource(DATA, BLOCKS)
    cache = BlockCache(cache_config(tmp_path), memory_only=frozenset({BLOCKS.source}))

    async def main() -> None:
        async with _attached(cache):
            await _read_sequentially(cache, source, 6)
        await cache.flush()
        assert all(BLOCKS.key(index) in cache.memory for index in range(6))
        assert cache.stats.disk_writes == 0

    trio.run(main)

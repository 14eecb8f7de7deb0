"""A newcomer's check: a source of blocks is one class, and the cache needs no change for it.

`CountingSource` below is a complete block source (pffs.cache.keys.BlockSource): an object in
memory whose every request is counted. The cache loads ahead from it, hands a reader's cold
bytes from it, and preloads a file from it, exactly as it does from a store or a cache group.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.cache.preload import Preloader, PreloadItem, job_channel
from tests.cache.configs import KIB, cache_config

BLOCK = 16 * KIB
DATA = bytes(range(256)) * (5 * BLOCK // 256 + 1)
BLOCKS = ObjectBlocks("mem://", "u", "f.bin", "v1", 5 * BLOCK + 100, BLOCK)


class CountingSource:
    """One object's bytes in memory, every request counted."""

    def __init__(self, data: bytes, blocks: ObjectBlocks) -> None:
        self.data, self.blocks = data, blocks
        self.runs: list[tuple[int, int]] = []
        self.parts: list[tuple[int, int]] = []

    async def part(self, offset: int, length: int) -> bytes:
        self.parts.append((offset, length))
        return self.data[offset : offset + length]

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        self.runs.append((first, count))
        for index in range(first, first + count):
            start = self.blocks.start(index)
            yield index, self.data[start : start + self.blocks.length(index)]


def test_the_cache_reads_through_a_new_source_with_no_change(tmp_path: Path) -> None:
    source = CountingSource(DATA, BLOCKS)
    checked: BlockSource = source  # it is a block source as the type checker sees it
    cache = BlockCache(cache_config(tmp_path, fetch_size=4 * BLOCK))
    window = range(1, 5)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            started = cache.read_ahead(
                BLOCKS.keys(window), BLOCKS.lengths(window), checked, coalesce=True
            )
            assert started == 4
            await cache.flush()
            for index in window:  # all in memory now: no request more
                block = await cache.read(BLOCKS.key(index), source, BLOCKS.length(index))
                assert block == DATA[BLOCKS.start(index) : BLOCKS.start(index + 1)]
            # A reader's first bytes of block 0: its own request, the block loaded behind it.
            part = await cache.read_part(BLOCKS.key(0), 10, 20, source, BLOCK, cold_start=True)
            assert part == DATA[10:30]
            await cache.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert source.runs == [(1, 4), (0, 1)]  # one request for the window, one for block 0
    assert source.parts == [(10, 20)]


def test_preload_loads_a_file_from_a_new_source(tmp_path: Path) -> None:
    source = CountingSource(DATA, BLOCKS)
    cache = BlockCache(cache_config(tmp_path, fetch_size=2 * BLOCK))
    engine = Preloader(cache, cache.ahead.total, concurrency=1)
    item = PreloadItem(BLOCKS.ident, BLOCKS.keys(), BLOCKS.lengths(), source)
    outcomes: list[int | Exception] = []

    async def main() -> None:
        send, receive = job_channel()
        send.send_nowait(item)
        send.close()
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            engine.attach(nursery)
            engine.add("job", receive, report=lambda _, outcome: outcomes.append(outcome))
            await engine.wait_idle()
            await cache.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert outcomes == [BLOCKS.size]  # every byte fetched from the source
    assert sorted(source.runs) == [(0, 2), (2, 2), (4, 2)]  # in runs of fetch_size, at once


def test_a_small_files_get_at_open_is_not_readahead(tmp_path: Path) -> None:
    """`load_soon` (a small file's one block, at its open) loads like readahead but is not
    counted as readahead: its reader surely wants the block."""
    small = ObjectBlocks("mem://", "u", "small.bin", "v1", 100 * KIB // 10, BLOCK)
    source = CountingSource(DATA, small)
    cache = BlockCache(cache_config(tmp_path))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.load_soon([small.key(0)], [small.size], source) == 1
            assert await cache.read(small.key(0), source, small.size) == DATA[: small.size]
            await cache.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert source.runs == [(0, 1)] and source.parts == []  # the reader joined the load
    stats = cache.stats
    assert stats.readahead_issued == stats.readahead_used == stats.readahead_wasted == 0

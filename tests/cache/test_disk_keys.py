"""The disk tier's key filter: lookups of blocks it knows are absent skip the index, and it
follows what other processes sharing the directory add to the index.

A second DiskTier on the same directory stands for another process (a mount, `pffs warmup`):
it has its own SQLite connections, as a process would. Time is trio's MockClock, which moves
only when a test moves it, so "a second later" is exact however slow the worker threads are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import trio
import trio.testing

from pffs.cache.blocks import Background
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.diskkeys import DiskKeys
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats

BLOCK = 4096


def _tier(directory: Path) -> DiskTier:
    return DiskTier(str(directory), 1 << 30, free_ratio=0.0, compress=False)


def _key(index: int) -> BlockKey:
    return BlockKey("src", "u", "train/file", "etag", index)


def _name(key: BlockKey) -> str:
    return entry_key(key, BLOCK)


def _data(index: int) -> bytes:
    return bytes([index % 256]) * BLOCK


def test_the_filter_answers_absent_only_for_keys_it_was_not_given() -> None:
    keys = DiskKeys(0)
    given = [f"entry-{n}" for n in range(20_000)]
    keys.add_rows((rowid, key) for rowid, key in enumerate(given, start=1))
    assert all(keys.might_hold(key) for key in given)
    assert keys.last_rowid == len(given)
    others = [f"other-{n}" for n in range(20_000)]
    maybe = sum(keys.might_hold(key) for key in others)
    assert maybe < len(others) * 0.02  # sized for 65,536 keys: far under 1% at 20,000
    assert not keys.full
    keys.add_rows((len(given) + n, f"more-{n}") for n in range(1, 50_000))
    assert keys.full  # past its capacity: to be rebuilt larger


def _run_with_disk(
    tier: DiskTier,
    body: Callable[[DiskIO, trio.testing.MockClock], object],
    stats: CacheStats | None = None,
) -> CacheStats:
    stats = stats or CacheStats()
    background = Background()
    disk = DiskIO(tier, BLOCK, threads=2, stats=stats, background=background)
    clock = trio.testing.MockClock()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            await body(disk, clock)  # type: ignore[misc]
            await background.idle()

    trio.run(main, clock=clock)
    return stats


async def _wait_for_keys(disk: DiskIO) -> None:
    """Let the filter read that a lookup started land (a worker thread's query)."""
    while disk._keys_reading:
        await trio.sleep(0)


def test_a_cold_lookup_skips_the_index_once_the_filter_is_read(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    asked: list[list[str]] = []
    real_present = tier.present

    def counting_present(keys: list[str]) -> list[bool]:
        asked.append(keys)
        return real_present(keys)

    tier.present = counting_present  # type: ignore[method-assign]
    tier.put_batch([(_name(_key(0)), _data(0), "src")])

    async def body(disk: DiskIO, clock: trio.testing.MockClock) -> None:
        # No filter yet: the index is asked (and the lookup starts the filter's read).
        assert await disk.present([_key(0), _key(1)]) == [True, False]
        assert len(asked) == 1
        await _wait_for_keys(disk)
        # Read: the absent block costs no question; the cached one is still asked about.
        assert await disk.present([_key(0), _key(1)]) == [True, False]
        assert asked[-1] == [disk.name(_key(0))]
        assert await disk.present([_key(2), _key(3)]) == [False, False]
        assert len(asked) == 2
        assert await disk.get(_key(2)) is None
        assert await disk.get(_key(0)) == _data(0)

    stats = _run_with_disk(tier, body)
    assert stats.disk_misses_known == 4
    tier.close()


def test_blocks_another_process_cached_are_found_within_a_period(tmp_path: Path) -> None:
    tier, other = _tier(tmp_path), _tier(tmp_path)

    async def body(disk: DiskIO, clock: trio.testing.MockClock) -> None:
        assert await disk.get(_key(5)) is None
        await _wait_for_keys(disk)
        assert await disk.get(_key(5)) is None  # known absent now
        other.put_batch([(disk.name(_key(5)), _data(5), "src")])  # warmup, elsewhere
        clock.jump(1.5)  # a period later a lookup starts a read of the new rows
        await disk.get(_key(6))
        await _wait_for_keys(disk)
        assert await disk.get(_key(5)) == _data(5)

    _run_with_disk(tier, body)
    tier.close()
    other.close()


def test_an_old_filter_answers_nothing_until_it_is_read_again(tmp_path: Path) -> None:
    """An idle mount's filter may have missed what others wrote meanwhile: the index decides."""
    tier, other = _tier(tmp_path), _tier(tmp_path)
    hold_reads = trio.Event()
    real_keys_after = tier.index.keys_after

    async def body(disk: DiskIO, clock: trio.testing.MockClock) -> None:
        token = trio.lowlevel.current_trio_token()

        def held_keys_after(rowid: int) -> Iterator[tuple[int, str]]:
            trio.from_thread.run(hold_reads.wait, trio_token=token)
            return real_keys_after(rowid)

        assert await disk.get(_key(7)) is None
        await _wait_for_keys(disk)
        tier.index.keys_after = held_keys_after  # type: ignore[method-assign]
        other.put_batch([(disk.name(_key(7)), _data(7), "src")])
        clock.jump(60)  # idle
        # Its refresh is held back, yet the block is found: the old filter is not trusted.
        assert await disk.get(_key(7)) == _data(7)
        hold_reads.set()

    _run_with_disk(tier, body)
    tier.close()
    other.close()


def test_this_process_writes_are_known_at_once(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    stats = CacheStats()

    async def body(disk: DiskIO, clock: trio.testing.MockClock) -> None:
        assert await disk.get(_key(1)) is None
        await _wait_for_keys(disk)
        disk.write_behind(_key(1), _data(1))
        while disk._pending:  # a writer waits a little for more blocks: let that time pass
            clock.jump(0.01)
            await trio.sleep(0)
        while disk._writers:  # writing it (no time passes: the filter stays as fresh)
            await trio.sleep(0)
        assert stats.disk_writes == 1
        assert await disk.present([_key(1)]) == [True]
        assert await disk.get(_key(1)) == _data(1)

    _run_with_disk(tier, body, stats)
    tier.close()

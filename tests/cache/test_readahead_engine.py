"""The readahead engine through BlockCache.read_ahead (no VFS): runs, the budget, hand-over,
disk-tier lookups, failures and cancellation."""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

import trio
import trio.testing

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey
from pffs.errors import Transient
from tests.cache.configs import KIB, FetchSource, cache_config

BLOCK = 16 * KIB


def keys(count: int, first: int = 0) -> list[BlockKey]:
    return [BlockKey("s", "u", "p", "v", index) for index in range(first, first + count)]


def block_of(index: int) -> bytes:
    return bytes([index]) * BLOCK


class Runs:
    """A block source for the window starting at block `base`: records (first, count) of each
    request (counted from `base`), can hold every request until `release` is set, and can fail
    after `fail_after` blocks of a request were sent."""

    def __init__(self, base: int = 0, fail_after: int | None = None) -> None:
        self.base = base
        self.fail_after = fail_after
        self.requests: list[tuple[int, int]] = []
        self.release = trio.Event()
        self.release.set()

    async def part(self, offset: int, length: int) -> bytes:
        raise AssertionError("readers fetch through fetcher() here")

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        self.requests.append((first - self.base, count))
        await self.release.wait()
        for n, index in enumerate(range(first, first + count)):
            if self.fail_after is not None and n == self.fail_after:
                raise Transient("connection reset in the middle of a run")
            await trio.sleep(0)
            yield index, block_of(index)


def fetcher(index: int, calls: list[int]):
    async def fetch() -> bytes:
        calls.append(index)
        return block_of(index)

    return fetch


def read_ahead_all_then_read(cache: BlockCache, count: int, runs: Runs) -> list[int]:
    """Read `count` blocks ahead as one window, wait, read each back; the blocks readers had to
    fetch themselves."""
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(count), [BLOCK] * count, runs, coalesce=True) == count
            await cache.flush()
            assert cache.ahead.loading == 0
            for index, key in enumerate(keys(count)):
                assert await cache.read(key, FetchSource(fetcher(index, calls)), BLOCK) == block_of(
                    index
                )

    trio.run(main)
    return calls


def test_consecutive_missing_blocks_come_in_runs_of_fetch_size() -> None:
    cache = BlockCache(cache_config(None, fetch_size=4 * BLOCK))
    runs = Runs()
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            await cache.read(
                keys(1, 3)[0], FetchSource(fetcher(3, calls)), BLOCK
            )  # block 3 is in memory
            started = cache.read_ahead(keys(8), [BLOCK] * 8, runs, coalesce=True)
            assert started == 7
            assert cache.ahead.loading == 7 * BLOCK
            await cache.flush()
            assert cache.ahead.loading == 0
            for index, key in enumerate(keys(8)):
                assert await cache.read(key, FetchSource(fetcher(index, calls)), BLOCK) == block_of(
                    index
                )

    trio.run(main)
    assert sorted(runs.requests) == [(0, 3), (4, 4)]  # around the block already held, 4 at most
    assert calls == [3]  # every other block came from the readahead
    stats = cache.stats
    assert stats.readahead_issued == 7 and stats.readahead_used == 7
    assert stats.misses == 8 and stats.bytes_from_store == 8 * BLOCK


def test_without_coalescing_each_block_is_its_own_request() -> None:
    cache = BlockCache(cache_config(None, fetch_size=4 * BLOCK))
    runs = Runs()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(3), [BLOCK] * 3, runs) == 3
            await cache.flush()

    trio.run(main)
    assert sorted(runs.requests) == [(0, 1), (1, 1), (2, 1)]


def test_before_the_windows_end_a_runs_worth_must_be_missing() -> None:
    cache = BlockCache(cache_config(None, fetch_size=4 * BLOCK))
    runs = Runs()
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            for index, key in enumerate(keys(4)):
                await cache.read(key, FetchSource(fetcher(index, calls)), BLOCK)
            window = keys(6)
            assert cache.read_ahead(window, [BLOCK] * 6, runs, coalesce=True, at_end=False) == 0
            assert cache.read_ahead(window, [BLOCK] * 6, runs, coalesce=True, at_end=True) == 2
            # Everything is cached or coming: nothing more to start.
            assert cache.read_ahead(window, [BLOCK] * 6, runs, coalesce=True, at_end=True) == 0
            # A window shorter than a run needs only all of it missing.
            assert (
                cache.read_ahead(keys(2, 10), [BLOCK] * 2, runs, coalesce=True, at_end=False) == 2
            )
            await cache.flush()

    trio.run(main)
    assert sorted(runs.requests) == [(4, 2), (10, 2)]  # blocks 4-5 and 10-11
    assert cache.stats.readahead_issued == 4


def test_without_a_nursery_nothing_is_read_ahead() -> None:
    cache = BlockCache(cache_config(None))
    assert cache.read_ahead(keys(2), [BLOCK] * 2, Runs()) == 0
    assert cache.ahead.loading == 0


def test_the_budget_bounds_the_bytes_in_flight() -> None:
    cache = BlockCache(cache_config(None, ahead_budget=4 * BLOCK, fetch_size=8 * BLOCK))
    runs = Runs()
    runs.release = trio.Event()  # hold the store's answer

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(6), [BLOCK] * 6, runs, coalesce=True) == 4
            assert cache.ahead.loading == 4 * BLOCK
            assert cache.stats.readahead_skipped_budget == 1
            # Budget left for a short last block of another file only after these land.
            assert cache.read_ahead(keys(1, 100), [100], runs) == 0
            assert cache.stats.readahead_skipped_budget == 2
            runs.release.set()
            await cache.flush()
            assert cache.ahead.loading == 0
            assert cache.read_ahead(keys(1, 100), [100], Runs(base=100)) == 1
            await cache.flush()

    trio.run(main)
    assert runs.requests == [(0, 4)]
    assert cache.ahead.loading == 0


def test_a_reader_arriving_first_waits_for_the_readahead() -> None:
    cache = BlockCache(cache_config(None))
    runs = Runs()
    runs.release = trio.Event()
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(1), [BLOCK], runs) == 1

            async def let_go() -> None:
                await trio.testing.wait_all_tasks_blocked()  # the reader waits on the flight
                runs.release.set()

            nursery.start_soon(let_go)
            assert await cache.read(
                keys(1)[0], FetchSource(fetcher(0, calls)), BLOCK, served=10
            ) == block_of(0)
            await cache.flush()

    trio.run(main)
    assert calls == []
    stats = cache.stats
    assert stats.single_flight_waits == 1 and stats.readahead_used == 1
    assert stats.store_bytes_served == 10 and stats.memory_hits == 0


def test_a_broken_run_gives_back_what_it_did_not_deliver() -> None:
    cache = BlockCache(cache_config(None, fetch_size=4 * BLOCK))
    runs = Runs(fail_after=2)
    calls = read_ahead_all_then_read(cache, 4, runs)
    assert runs.requests == [(0, 4)]
    assert calls == [2, 3]  # the readers fetched the undelivered blocks themselves
    assert cache.stats.misses == 4


def test_cancelled_readaheads_give_their_budget_back() -> None:
    cache = BlockCache(cache_config(None, fetch_size=2 * BLOCK))
    runs = Runs()
    runs.release = trio.Event()  # never set: the store never answers
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(4), [BLOCK] * 4, runs, coalesce=True) == 4
            await trio.testing.wait_all_tasks_blocked()  # every load started, none answered
            assert cache.ahead.loading == 4 * BLOCK
            nursery.cancel_scope.cancel()
        assert cache.ahead.loading == 0
        await cache.flush()  # nothing left in the background
        for index, key in enumerate(keys(4)):  # no reader waits on an abandoned load ahead
            assert await cache.read(key, FetchSource(fetcher(index, calls)), BLOCK) == block_of(
                index
            )

    trio.run(main)
    assert sorted(runs.requests) == [(0, 2), (2, 2)]
    assert calls == [0, 1, 2, 3]


def _fill_disk(tmp_path: Path, indices: range) -> None:
    cache = BlockCache(cache_config(tmp_path))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            for index in indices:
                await cache.read(keys(1, index)[0], FetchSource(fetcher(index, [])), BLOCK)
            await cache.flush()

    trio.run(main)
    cache.close()


def test_blocks_read_ahead_on_disk_are_not_asked_of_the_store(tmp_path: Path) -> None:
    _fill_disk(tmp_path, range(0, 3))
    cache = BlockCache(cache_config(tmp_path, fetch_size=4 * BLOCK))
    runs = Runs()
    calls = read_ahead_all_then_read(cache, 6, runs)
    cache.close()
    assert runs.requests == [(3, 3)]
    assert calls == []
    stats = cache.stats
    assert stats.disk_hits == 3 and stats.disk_misses == 3
    assert stats.disk_writes == 3  # the blocks from the store were written behind
    assert stats.readahead_issued == 6 and stats.readahead_used == 6


def test_memory_only_sources_never_look_at_the_disk(tmp_path: Path) -> None:
    _fill_disk(tmp_path, range(0, 3))
    cache = BlockCache(cache_config(tmp_path, fetch_size=4 * BLOCK), memory_only=frozenset({"s"}))
    runs = Runs()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert cache.read_ahead(keys(6), [BLOCK] * 6, runs, coalesce=True) == 6
            await cache.flush()

    trio.run(main)
    cache.close()
    assert sorted(runs.requests) == [(0, 4), (4, 2)]
    stats = cache.stats
    assert stats.disk_hits == 0 and stats.disk_misses == 0 and stats.disk_writes == 0


def _held_disk(cache: BlockCache) -> threading.Event:
    """Make the cache's disk tier hold every batch write until the returned event is set."""
    assert cache.disk is not None
    free = threading.Event()
    real_put_batch = cache.disk.put_batch

    def held(blocks: Sequence[tuple[str, bytes, str]]) -> list[bool]:
        free.wait(30)
        return real_put_batch(blocks)

    cache.disk.put_batch = held  # type: ignore[method-assign]
    return free


def test_a_slow_disk_never_stalls_a_request_in_the_middle(tmp_path: Path) -> None:
    # A run of six blocks, a disk that takes none of them yet: every block of the run still
    # lands, since the run's stream is never held up by the disk (on a far store that would
    # stall the connection too); all are written afterwards.
    cache = BlockCache(cache_config(tmp_path, fetch_size=6 * BLOCK, disk_threads=1))
    free = _held_disk(cache)
    runs = Runs()
    calls: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            try:
                assert cache.read_ahead(keys(6), [BLOCK] * 6, runs, coalesce=True) == 6
                with trio.fail_after(10):
                    for index, key in enumerate(keys(6)):
                        assert await cache.read(
                            key, FetchSource(fetcher(index, calls)), BLOCK
                        ) == block_of(index)
            finally:
                free.set()
            await cache.flush()

    trio.run(main)
    cache.close()
    assert runs.requests == [(0, 6)] and calls == []
    assert cache.stats.disk_writes == 6


def test_a_readahead_waits_for_the_disks_backlog_before_its_request(tmp_path: Path) -> None:
    # Room for eight blocks to wait for the disk (two budgets of bytes loaded ahead; more than
    # two per thread): two windows fill it.
    config = cache_config(tmp_path, fetch_size=4 * BLOCK, disk_threads=1, ahead_budget=4 * BLOCK)
    cache = BlockCache(config)
    free = _held_disk(cache)
    first, second, third = Runs(), Runs(base=4), Runs(base=8)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            try:
                for window, runs in enumerate((first, second)):  # each lands while it has room
                    assert cache.read_ahead(keys(4, 4 * window), [BLOCK] * 4, runs, coalesce=True)
                    with trio.fail_after(10):
                        while len(cache.memory) < 4 * (window + 1):
                            await trio.sleep(0.01)
                # Their eight blocks wait for the disk, filling its room: the next window waits.
                assert cache.read_ahead(keys(4, 8), [BLOCK] * 4, third, coalesce=True) == 4
                await trio.testing.wait_all_tasks_blocked()  # all that could go has gone
                assert third.requests == []
            finally:
                free.set()
            await cache.flush()

    trio.run(main)
    cache.close()
    assert [runs.requests for runs in (first, second, third)] == [[(0, 4)]] * 3
    assert cache.stats.disk_writes == 12

"""A short region run streamed (pffs.fs.regions): the kernel's READs of a tensor's page faults
get their bytes from ranged GETs streamed in pieces just ahead of them, no blocks loaded.

The store is the fake of tests/fs/test_reads_through_cache.py that serves runs in one request
(as S3 does) and can break one mid-stream, which no real server does on demand; the real path
through S3 and the kernel is tests/mount/test_lazy_checkpoint.py's.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio

import pffs
from pffs.cache.keys import BlockKey
from pffs.cache.readahead import REGION_STREAM_AHEAD, Readahead
from pffs.errors import SourceDown, Transient
from pffs.fs.inodes import ROOT_INODE
from pffs.fs.vfs import Vfs
from pffs.routing.table import Mounted, MountTable
from tests.cache.configs import KIB, cache_config
from tests.fs.helpers import make_vfs
from tests.fs.test_reads_through_cache import NO_TTLS, RunStore, cached_vfs, with_nursery

MIB = 1024 * KIB
BLOCK = 2 * MIB
READ = 512 * KIB  # the kernel's READs of a mapping: a quarter of a block at most, as here


def _region(seed: int, fail_at: int = 0) -> tuple[bytes, RunStore, list[tuple[int, int]], int]:
    data = random.Random(seed).randbytes(24 * BLOCK)
    store = RunStore({"f": data}, fail_at=fail_at)
    start = 7 * BLOCK + 5616  # a tensor's first byte, past a safetensors header
    region = 6 * MIB  # shorter than REGION_STREAM_BLOCKS blocks: streamed throughout
    return data, store, [(o, READ) for o in range(start, start + region, READ)], start


def test_a_region_is_streamed_just_ahead_of_its_reads() -> None:
    data, store, reads, start = _region(1)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]
    end = reads[-1][0] + READ
    assert store.ranges[0] == (start, READ)  # the first READ starts no run: its bytes alone
    # Then spans in pieces, never a whole block: the pieces cover the rest of the region once,
    # and at most REGION_STREAM_AHEAD past its last READ.
    pieces = store.ranges[1:]
    assert pieces[0][0] == start + READ and max(n for _, n in pieces) < BLOCK
    covered = sorted(pieces)
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))
    assert covered[-1][0] + covered[-1][1] <= end + REGION_STREAM_AHEAD
    assert store.requests < len(reads)  # spans of several READs each


@pytest.mark.parametrize("fail_at", [1, 3, 9, 17])
def test_a_span_broken_midway_gives_its_reads_their_bytes_anyway(fail_at: int) -> None:
    data, store, reads, _ = _region(fail_at, fail_at=fail_at)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]  # the READs asked for them themselves


def test_a_span_failing_for_good_fails_its_reads_with_the_stores_error() -> None:
    _, store, reads, _ = _region(5)

    def refuse(*args: object, **kwargs: object) -> Iterator[bytes]:
        raise Transient("the store went away")

    store.read_blocks = refuse  # type: ignore[method-assign]
    store.fail_every = 1  # every read_range too: the READs' own requests
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    with pytest.raises(ExceptionGroup) as raised:
        trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    # The READ's own request failed (the breaker then fails the next at once), not a hang.
    assert raised.group_contains(Transient) or raised.group_contains(SourceDown)


def test_a_read_alone_across_a_blocks_end_is_one_request() -> None:
    """The first READ of a fault's read-around starts no run; when it crosses a block's end it
    gets its bytes in one request, not one per block in series with a block behind the second."""
    data, store, _, _ = _region(7)
    offset = 5 * BLOCK - 4 * KIB
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", [(offset, READ)])
    assert got == [data[offset : offset + READ]]
    assert store.ranges == [(offset, READ)]


def test_spans_across_open_files_stay_within_the_mounts_room_and_go_at_close() -> None:
    """Each open file may hold a few blocks of spans; many open files with region runs must not
    hold memory without bound: across the mount at most the budget of bytes loaded ahead."""
    data, store, reads, _ = _region(11)
    budget = 2 * BLOCK  # less than what three files streaming at once hold
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=budget)
    vfs = cached_vfs(store, config)
    held: list[int] = []

    async def three_files_at_once() -> list[list[bytes]]:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            handles = [(await vfs.open(inode.ino, os.O_RDONLY))[0] for _ in range(3)]
            got: list[list[bytes]] = [[] for _ in handles]
            for offset, size in reads:  # the three runs interleaved, READ by READ
                for n, fh in enumerate(handles):
                    got[n].append(bytes(await vfs.read(fh, offset, size)))
                    held.append(vfs.cache.ahead.held["region"])
            for fh in handles:
                await vfs.release(fh)
            held.append(vfs.cache.ahead.held["region"])
            await vfs.drain()
            nursery.cancel_scope.cancel()
        return got

    got = trio.run(three_files_at_once)
    assert got == [[data[o : o + n] for o, n in reads]] * 3
    assert max(held) <= budget and max(held) > 0
    assert held[-1] == 0  # closed files hold nothing


def _fetched_twice(ranges: list[tuple[int, int]]) -> int:
    """Bytes of `ranges` (start, length) asked for more than once."""
    union, end = 0, -1
    for start, length in sorted(ranges):
        union += max(0, start + length - max(start, end))
        end = max(end, start + length)
    return sum(length for _, length in ranges) - union


def test_a_walk_of_the_whole_file_takes_what_its_regions_fetched() -> None:
    """An Arrow file read through a mapping (docs/notes/clients-arrow-mmap.md): faults at the
    file's metadata, a few MiB apart, each stream a region; then the kernel's readahead walks
    the file from its start, skipping the pages the faults brought. The walk's blocks take the
    bytes the regions' spans hold, are fetching, or parked in the cache when they were dropped
    (more spans than a file may hold at once), and those each fault's first READ fetched alone
    (parked too, once the file streams a region). Fetched twice: the first fault's first READ
    (before the file streamed any region) and the walk's first block (its first READs are cold
    starts, their bytes alone while the block loads behind: the faults' streams pushed the
    file's start out of the handle's)."""
    data, store, _, start = _region(13)
    hops = [start + n * 3 * BLOCK for n in range(5)]
    faults = [(hop + n * READ, READ) for hop in hops for n in range(3)]
    brought = {offset for offset, _ in faults}
    walk = [(o, READ) for o in range(0, len(data), READ) if o not in brought]
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", faults + walk)
    assert got == [data[o : o + n] for o, n in faults + walk]
    assert _fetched_twice(store.ranges) <= READ + BLOCK, sorted(store.ranges)


def test_random_faults_fetch_the_file_about_once_then_find_it_loaded() -> None:
    """`datasets`' gathers of random rows from a mapped Arrow file (docs/notes/
    clients-arrow-mmap.md): page faults one at a time at random offsets, each the kernel's
    read-around (two READs) and no more. Once the faults have touched an eighth of the file's
    blocks the rest of the file is loaded (taking the bytes the faults and their spans
    fetched), and the later faults find it: the file's bytes are fetched about once, however
    many faults come over them."""
    data = random.Random(29).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    starts = random.Random(30).sample(range(0, len(data) - 2 * READ, 4096), 120)
    faults = [(start + n * READ, READ) for start in starts for n in range(2)]
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", faults)
    assert got == [data[o : o + n] for o, n in faults]
    fetched = sum(length for _, length in store.ranges)
    assert fetched <= len(data) + 2 * BLOCK, (fetched, len(data))
    assert _fetched_twice(store.ranges) <= 2 * BLOCK
    assert store.requests + len(store.ranges) < len(faults)  # most faults found it loaded


def test_a_walk_in_hops_from_the_start_loads_the_file_ahead_of_it_then_behind() -> None:
    """An Arrow file's `read_all` by mmap (docs/notes/clients-arrow-mmap.md): the file's start,
    then a hop per record batch's metadata, each the fault's read-around and a READ of
    readahead, strides alike. At the third fault the file is loaded (the cache keeps it), from
    the walk's front to the end first, then the blocks behind: the walk alone brings all of
    it, each byte fetched about once (what the hops' spans fetched is taken, not asked again)."""
    data = random.Random(41).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    stride = 5 * MIB + 12 * KIB
    hops = [stride * (n + 1) for n in range(8)]
    walk = [(0, READ), (READ, READ)] + [(hop + n * READ, READ) for hop in hops for n in range(3)]
    config = cache_config(
        None,
        block=BLOCK,
        memory_bytes=128 * BLOCK,
        readahead_max=8 * BLOCK,
        ahead_budget=32 * BLOCK,
    )
    vfs = cached_vfs(store, config)
    assert vfs.reader.cache.ahead.unread_max >= len(data)
    asked: list[tuple[int, int]] = []  # (first block, blocks) of each load ahead started
    read_ahead = vfs.reader.cache.read_ahead

    def recorded(keys: Sequence[BlockKey], *args: Any, **kwargs: Any) -> int:
        asked.append((keys[0].block, len(keys)))
        return read_ahead(keys, *args, **kwargs)

    vfs.reader.cache.read_ahead = recorded  # type: ignore[method-assign]
    got = trio.run(with_nursery, vfs, "f", walk)
    assert got == [data[o : o + n] for o, n in walk]
    front, blocks = hops[1] // BLOCK, len(data) // BLOCK
    first = asked.index((front, blocks - front))  # before it: the start's run, a block ahead
    assert all(count == 1 for _, count in asked[:first]) and asked[first + 1] == (0, front)
    fetched = sum(length for _, length in store.ranges)
    assert fetched - _fetched_twice(store.ranges) == len(data)  # all of it, by the walk alone
    assert fetched <= len(data) + 2 * BLOCK, (fetched, len(data))


def _walk_to_the_sweep() -> list[tuple[int, int]]:
    """An Arrow metadata walk's READs up to its third fault's first READ (the sweep starts)."""
    stride = 5 * MIB + 12 * KIB
    walk = [(0, READ), (READ, READ)] + [(stride + n * READ, READ) for n in range(3)]
    return [*walk, (2 * stride, READ)]


def _read_then_idle(vfs: Vfs, data: bytes, reads: list[tuple[int, int]]) -> None:
    """`reads` of "f" checked one by one, then the loads ahead drained, the file still open."""

    async def read_then_idle() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            fh, _ = await vfs.open((await vfs.lookup(ROOT_INODE, "f")).ino, os.O_RDONLY)
            for offset, size in reads:
                assert bytes(await vfs.read(fh, offset, size)) == data[offset : offset + size]
            await vfs.drain()
            await vfs.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(read_then_idle)


def test_a_swept_file_goes_on_loading_while_no_read_comes() -> None:
    """A file swept within a budget of bytes ahead smaller than it: each block that lands
    starts the next, so the file is loaded while its reader waits (on a block of the sweep)
    and no READ comes to ask for more. Here the READs stop at the walk's third fault (the
    sweep's start); the file stays open, and all of it comes, each byte once."""
    data = random.Random(43).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    config = cache_config(
        None, block=BLOCK, memory_bytes=128 * BLOCK, readahead_max=8 * BLOCK, ahead_budget=6 * BLOCK
    )
    _read_then_idle(cached_vfs(store, config), data, _walk_to_the_sweep())
    fetched = sum(length for _, length in store.ranges)
    assert fetched - _fetched_twice(store.ranges) == len(data)
    assert fetched <= len(data) + 2 * BLOCK, (fetched, len(data))


def test_a_sweeps_landings_ask_for_runs_not_a_block_each() -> None:
    """The landings of a sweep free the budget a block at a time; the next blocks are asked
    for a run at a time (`fetch_size`) once a run's worth is free, not one GET per block as
    each lands: fewer, larger requests for the same bytes."""
    data = random.Random(47).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    in_runs: list[int] = []  # blocks a run (one request) delivered
    alone: list[int] = []  # whole blocks asked for in a request of their own
    read_blocks, read_range = store.read_blocks, store.read_range

    running = threading.local()  # whether this worker thread is inside a run's request

    def run(
        path: str, start: int, lengths: list[int], *args: Any, **kwargs: Any
    ) -> Iterator[bytes]:
        in_runs.append(len(lengths))
        pieces = read_blocks(path, start, lengths, *args, **kwargs)
        while True:
            running.inside = True
            try:
                piece = next(pieces)
            except StopIteration:
                return
            finally:
                running.inside = False
            yield piece

    def one(path: str, offset: int, length: int, *args: Any, **kwargs: Any) -> bytes:
        whole = length == BLOCK and offset % BLOCK == 0
        if whole and not getattr(running, "inside", False):
            alone.append(offset // BLOCK)
        return read_range(path, offset, length, *args, **kwargs)

    store.read_blocks = run  # type: ignore[method-assign]
    store.read_range = one  # type: ignore[method-assign,assignment]
    config = cache_config(
        None,
        block=BLOCK,
        memory_bytes=128 * BLOCK,
        readahead_max=8 * BLOCK,
        ahead_budget=6 * BLOCK,
        fetch_size=4 * BLOCK,
    )
    _read_then_idle(cached_vfs(store, config), data, _walk_to_the_sweep())
    assert sum(length for _, length in store.ranges) - _fetched_twice(store.ranges) == len(data)
    # Blocks alone: the walk's first ones and where spans split a run, not one per landing.
    assert len(alone) <= 24 // 3, (alone, in_runs)


def test_random_faults_over_a_file_larger_than_the_cache_keeps_unread_never_load_it() -> None:
    """The same faults over a file larger than what loading ahead may leave unread (half the
    memory tier here, no disk tier): they are random faults (the readahead would sweep), but
    the file is not loaded; the faults fetch their own. A few faults land in order after one
    another and make a short run, whose window may load a few blocks: that is the run's
    readahead, not the sweep's (which asks for every block of the file at once)."""
    data = random.Random(31).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    starts = random.Random(32).sample(range(0, len(data) - 2 * READ, 4096), 120)
    faults = [(start + n * READ, READ) for start in starts for n in range(2)]
    readahead_max = 8 * BLOCK
    config = cache_config(
        None,
        block=BLOCK,
        memory_bytes=32 * BLOCK,
        readahead_max=readahead_max,
        ahead_budget=8 * BLOCK,
    )
    vfs = cached_vfs(store, config)
    assert vfs.reader.cache.ahead.unread_max < len(data)
    policy = Readahead(BLOCK, readahead_max, len(data))
    for offset, size in faults:
        policy.on_read(offset, offset + size)
    assert policy.sweeping  # the faults are random ones: a file the cache keeps would be swept
    asked: list[int] = []  # the blocks of each load ahead the reads started (recorded, then done)
    read_ahead = vfs.reader.cache.read_ahead

    def recorded(keys: Sequence[BlockKey], *args: Any, **kwargs: Any) -> int:
        asked.append(len(keys))
        return read_ahead(keys, *args, **kwargs)

    vfs.reader.cache.read_ahead = recorded  # type: ignore[method-assign]
    got = trio.run(with_nursery, vfs, "f", faults)
    assert got == [data[o : o + n] for o, n in faults]
    assert max(asked, default=0) <= readahead_max // BLOCK, asked  # runs' windows, no sweep


def test_a_region_fetches_nothing_past_the_kernels_last_read() -> None:
    """A lazy loader's tensor (docs/notes/clients-safetensors.md): past the fault's first span,
    each READ's bytes are asked when it comes; the kernel's readahead of the mapping already
    keeps its READs ahead of the copy, and bytes streamed beyond its last READ were never
    asked for."""
    data, store, reads, _ = _region(17)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]
    last = reads[-1][0] + READ
    assert max(start + length for start, length in store.ranges) <= last
    assert sum(length for _, length in store.ranges) == last - reads[0][0]  # each byte once


def test_a_copys_end_asks_for_the_middle_before_the_copy_reads_it() -> None:
    """A lazy loader's copy of a tensor faults at its start, then at its end, then reads its
    middle (docs/notes/clients-full-load-window.md): at the end's second READ, the bytes between
    the start's spans and the end are asked for, with no READ of them yet, so the middle's READs
    wait for no round trip of their own; no byte is asked twice."""
    data = random.Random(23).randbytes(24 * BLOCK)
    store = RunStore({"f": data})
    start = 7 * BLOCK + 5616
    end = start + 6 * MIB  # the end's region: less than REGION_COPY_END past the start's reads
    faults = [(start, READ), (start + READ, READ), (end, READ), (end + READ, READ)]
    middle = [(offset, READ) for offset in range(start + 2 * READ, end, READ)]
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)

    def asked(offset: int, stop: int) -> bool:
        ranges = list(store.ranges)
        return all(
            any(a <= position < a + n for a, n in ranges)
            for position in range(offset, stop, 64 * KIB)
        )

    async def copy(vfs: Vfs) -> list[bytes]:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            try:
                got = [bytes(await vfs.read(fh, o, n)) for o, n in faults]
                with trio.fail_after(10):  # the spans' requests run in worker threads
                    while not asked(start + 2 * READ, end):
                        await trio.sleep(0.01)
                got += [bytes(await vfs.read(fh, o, n)) for o, n in middle]
            finally:
                await vfs.release(fh)
            await vfs.drain()
            nursery.cancel_scope.cancel()
        return got

    got = trio.run(copy, cached_vfs(store, config))
    assert got == [data[o : o + n] for o, n in faults + middle]
    covered = sorted(store.ranges)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(covered))  # each byte once


# Frames kept per allocation: enough to find pffs's or the fake store's code below the
# builtins and trio's machinery that made it.
FRAMES = 32


_CHANNEL = ("execnet", "xdist")


def _held_by_pffs_and_its_store(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still allocated whose call stack passed through pffs or these tests (the store's
    fake): not those of other threads of the test process (pytest-xdist's channel to its
    controller allocates hundreds of KiB at any moment)."""
    places = [os.path.dirname(pffs.__file__), os.path.dirname(__file__)]
    ours = [tracemalloc.Filter(True, os.path.join(place, "*"), all_frames=True) for place in places]
    # Nor what passed through execnet, pytest-xdist's channel: 538 KB held once more in a
    # fresh clone's run (2026-11-30), the size that channel had held before.
    theirs = [tracemalloc.Filter(False, f"*/{name}/*", all_frames=True) for name in _CHANNEL]
    return sum(stat.size for stat in snapshot.filter_traces(ours + theirs).statistics("filename"))


def test_a_lazy_loads_dropped_spans_are_not_held_in_memory() -> None:
    """A lazy loader's tensors (docs/notes/parked-spans-rss.md): the spans dropped once read
    are parked on local disk, not kept in the mount's memory while the file is open (where
    they bought nothing: no walk comes over them); the file's close lets them go."""
    data, store, reads, _ = _region(19)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    vfs = cached_vfs(store, config)
    seen: dict[str, int] = {}

    async def load_a_tensor() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            tracemalloc.start(FRAMES)
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            for offset, size in reads:  # checked one by one: the test keeps none of them
                assert bytes(await vfs.read(fh, offset, size)) == data[offset : offset + size]
            await vfs.drain()  # the parked spans' writes done
            seen["held"] = _held_by_pffs_and_its_store(tracemalloc.take_snapshot())
            tracemalloc.stop()
            regions = vfs.handles.reading(fh).regions
            seen["spans"] = regions.held if regions is not None else 0  # not dropped yet
            seen["parked"] = vfs.reader.parking.used
            await vfs.release(fh)
            seen["parked_after"] = vfs.reader.parking.used
            nursery.cancel_scope.cancel()

    trio.run(load_a_tensor)
    region = len(reads) * READ
    assert seen["parked"] >= region - READ  # parked (but the last span): a walk may come
    # But not in memory: what the mount holds is the spans not dropped yet (the last one, when
    # its end came after the last READ), and little else.
    assert seen["held"] < seen["spans"] + 256 * KIB, seen
    assert seen["parked_after"] == 0


def test_a_memory_only_sources_spans_are_never_parked() -> None:
    """`cache = "memory"`: the source's bytes never go to disk, so its dropped spans are let go
    rather than parked in a scratch file."""
    data, store, reads, _ = _region(23)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    table = MountTable([Mounted("", store, disk_cache=False)])
    vfs = make_vfs(table, meta=NO_TTLS, cache=config)
    parked: list[int] = []

    async def load_a_tensor() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            for offset, size in reads:
                assert bytes(await vfs.read(fh, offset, size)) == data[offset : offset + size]
                parked.append(vfs.reader.parking.used)
            await vfs.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(load_a_tensor)
    assert parked == [0] * len(reads)


def test_a_parquet_files_last_row_group_loads_its_last_block_which_the_scan_then_finds() -> None:
    """pyarrow's scan of a Parquet file, as traced (docs/notes/clients-machine-cpu.md): its
    footer, its last row group from 31.76 MiB of 35.73 in 1 MiB READs to the end, then the file
    from its start. The last row group's run is within reach of the end, so the file's last
    block is loaded whole, in one request (not spans streamed in pieces for this open alone),
    and the run from the start finds it: the file is fetched once, but for the READs fetched
    alone before a run is known."""
    block = 4 * MIB
    data = random.Random(50).randbytes(35 * MIB + 750 * KIB)
    size = len(data)
    store = RunStore({"f": data})
    config = cache_config(None, block=block, readahead_max=8 * block, ahead_budget=16 * block)
    footer, tail = size - 68 * KIB, 31 * MIB + 780 * KIB
    reads = [(footer, size - footer)]
    reads += [(o, min(MIB, size - o)) for o in range(tail, size, MIB)]
    reads += [(o, min(MIB, size - o)) for o in range(0, size, MIB)]
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]
    last = 8 * block
    assert store.ranges.count((last, size - last)) == 1  # the last block, whole, once
    # Nothing else asked within it but the footer and the tail's first READ (fetched alone).
    assert [r for r in store.ranges if r[0] >= last and r != (last, size - last)] == [
        (footer, size - footer)
    ]
    assert sum(n for _, n in store.ranges) <= size + (size - footer) + 2 * MIB

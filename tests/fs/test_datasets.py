"""Dataset preload through the VFS, without a kernel: detection from opens (flat and nested),
bytes exact, a reader not starved while preload is saturated (preload within its share of the
source's pace), `.pffs/preload` order lists with bad entries, what does not count (writes,
`.pffs`), and a throttling store halving the source's pace, seen in its metrics.

The store is the real local backend, wrapped to count reads by path and to hold the reads of
chosen paths (a store that stalls, which a real server cannot do on demand).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio

from pffs import metrics
from pffs.cli.stats_view import pace_lines, series
from pffs.errors import ReadOnly, Transient, Unsupported
from pffs.flow.permits import BACKGROUND_SHARE
from pffs.fs.special import HIDDEN_DIR, PRELOAD_FILE
from pffs.fs.vfs import Vfs
from pffs.mounting.observe import pace_reader
from tests.fs.helpers import (
    KIB,
    dataset,
    preloading_vfs,
    read_whole,
    resolve,
    with_vfs,
)


@pytest.mark.parametrize("size", [10 * KIB, 150 * KIB])  # one block, and a run of three
def test_three_opens_preload_the_rest_of_the_directory(tmp_path: Path, size: int) -> None:
    files = dataset(tmp_path, {"train": 50}, size)
    vfs, backend = preloading_vfs(tmp_path)
    order = list(files)
    random.Random(1).shuffle(order)

    async def body() -> None:
        for path in order[:3]:
            assert await read_whole(vfs, path) == files[path]
        await vfs.datasets.engine.wait_idle()
        assert vfs.datasets.engine.stats.files_fetched == 47
        fetched = sum(backend.reads.values())
        for path in order[3:]:  # every byte from the cache: no new store read
            assert await read_whole(vfs, path) == files[path]
        assert sum(backend.reads.values()) == fetched
        assert vfs.datasets.engine.stats.files_used == 47

    with_vfs(vfs, body)
    # One request per file: a one-block file is one GET.
    if size <= 64 * KIB:
        assert set(backend.reads.values()) == {1}


def test_two_opens_or_a_slow_pace_do_not_preload(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"docs": 10}, KIB)
    vfs, backend = preloading_vfs(tmp_path, trigger_window=0.0)

    async def body() -> None:
        for path in list(files)[:5]:
            await read_whole(vfs, path)
            await trio.sleep(0.01)  # each open outside the (empty) window of the last
        await trio.sleep(0.2)  # time for a listing and loads in worker threads, were any started

    with_vfs(vfs, body)
    assert vfs.datasets.engine.stats.files_queued == 0
    assert sum(backend.reads.values()) == 5


def test_opens_across_sibling_directories_preload_the_parent(tmp_path: Path) -> None:
    layout = {f"imagenet/train/n{c:04}": 8 for c in range(6)}
    files = dataset(tmp_path, layout, 4 * KIB)
    vfs, backend = preloading_vfs(tmp_path)
    first = ["imagenet/train/n0000/000.bin", "imagenet/train/n0003/005.bin"]
    first.append("imagenet/train/n0005/001.bin")

    async def body() -> None:
        for path in first:  # one file in each of three classes
            await read_whole(vfs, path)
        await vfs.datasets.engine.wait_idle()
        fetched = sum(backend.reads.values())
        for path in files:
            assert await read_whole(vfs, path) == files[path]
        assert sum(backend.reads.values()) == fetched

    with_vfs(vfs, body)
    assert vfs.datasets.engine.stats.files_fetched == len(files) - 3


def test_writes_and_pffs_files_do_not_count(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"d": 10}, KIB)
    vfs, _ = preloading_vfs(tmp_path)

    async def body() -> None:
        for _ in range(3):
            await read_whole(vfs, f"{HIDDEN_DIR}/stats")
        for path in list(files)[:3]:  # opens for writing (this source refuses them)
            with pytest.raises((ReadOnly, Unsupported)):
                await read_whole(vfs, path, os.O_WRONLY)
        await trio.sleep(0.2)  # time for a listing and loads in worker threads, were any started

    with_vfs(vfs, body)
    assert vfs.datasets.engine.stats.files_queued == 0


def test_disabled_preloads_nothing(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"d": 10}, KIB)
    vfs, backend = preloading_vfs(tmp_path, enabled=False)

    async def body() -> None:
        for path in list(files)[:5]:
            await read_whole(vfs, path)
        await trio.sleep(0.2)  # time for a listing and loads in worker threads, were any started

    with_vfs(vfs, body)
    assert sum(backend.reads.values()) == 5


def test_reader_is_not_starved_while_preload_is_saturated(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"d": 40}, KIB)
    vfs, backend = preloading_vfs(tmp_path)
    paths = list(files)
    # Every preload request stalls at the store: preload takes all the permits of the source's
    # pace it may (its share: the rest is readahead's), and starts no file beyond them.
    backend.held = set(paths[3:-1])
    pace = vfs.table.mounted[0].flow.pace
    share = int(BACKGROUND_SHARE * pace.current)

    async def body() -> None:
        for path in paths[:3]:
            await read_whole(vfs, path)
        with trio.fail_after(5):
            while pace.in_flight["preload"] < share:
                await trio.sleep(0.01)
        await trio.sleep(0.1)
        assert pace.in_flight["preload"] == share < pace.current
        assert vfs.datasets.engine.files_in_flight == share
        assert pace.gauges()["preload_waiting"] == 0
        with trio.fail_after(5):  # the reader's own requests go around the stalled preload
            assert await read_whole(vfs, paths[-1]) == files[paths[-1]]
        backend.release.set()
        await vfs.datasets.engine.wait_idle()

    with_vfs(vfs, body)
    # Still queued when its reader opened it: the reader fetched it alone, first (no engine
    # priority is needed, pffs.cache.preload), and the engine never loaded it again.
    assert backend.reads[paths[-1]] == 1


def test_order_list_through_the_preload_file(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"a": 5, "b": 5}, 2 * KIB)
    # Detection off in effect: only the order list preloads here.
    vfs, backend = preloading_vfs(tmp_path, concurrency=1, trigger_files=100)
    order = ["b/004.bin", "a/002.bin", "missing/x.bin", "a/999.bin", "b/000.bin", "a"]

    async def body() -> None:
        control = await resolve(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}")
        fh, _ = await vfs.open(control, os.O_WRONLY | os.O_TRUNC)
        text = "".join(f"{p}\n" for p in order).encode()
        assert await vfs.write(fh, 0, text) == len(text)
        await vfs.flush(fh)
        await vfs.release(fh)
        await vfs.datasets.engine.wait_idle()
        report = await read_whole(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}")
        assert report.decode().splitlines() == [
            "queued 3",
            "missing/x.bin: no such file",
            "a/999.bin: no such file",
            "a: not a file of a source",
        ]
        fetched = sum(backend.reads.values())
        for path in ("b/004.bin", "a/002.bin", "b/000.bin"):
            assert await read_whole(vfs, path) == files[path]
        assert sum(backend.reads.values()) == fetched

    with_vfs(vfs, body)
    # In the order given, one at a time.
    assert list(backend.reads) == ["b/004.bin", "a/002.bin", "b/000.bin"]


def test_throttled_preload_backs_off_and_readers_see_what_they_would_without_it(
    tmp_path: Path,
) -> None:
    files = dataset(tmp_path, {"d": 30}, 2 * KIB)
    paths = list(files)
    outcomes: dict[bool, list[object]] = {}
    for enabled in (True, False):
        vfs, backend = preloading_vfs(tmp_path, enabled=enabled, concurrency=16)
        backend.throttled = set(paths[5:9])
        seen: list[object] = []

        async def body(vfs: Vfs = vfs, seen: list[object] = seen) -> None:
            for path in paths[:3]:
                await read_whole(vfs, path)
            await vfs.datasets.engine.wait_idle()
            for path in paths[3:]:
                try:
                    seen.append(await read_whole(vfs, path))
                except Transient as exc:
                    seen.append(str(exc))

        with_vfs(vfs, body)
        outcomes[enabled] = seen
        if enabled:
            stats = vfs.datasets.engine.stats
            assert stats.files_failed == 4 and stats.files_fetched == 23
            # The source's pace heard the throttling and halved its permits.
            pace = vfs.table.mounted[0].flow.pace
            assert pace.throttles >= 1 and pace.halvings >= 1
            assert pace.current < pace.ceiling
            # ...and says so in the metrics and `pffs stats`, by source.
            paces = pace_reader(vfs)
            metrics.paces.watch(paces)
            try:
                values = series(metrics.snapshot())
            finally:
                metrics.paces.unwatch(paces)
            source = (("source", vfs.table.mounted[0].backend.source_id),)
            assert values[("pffs_pace_places", source)] == pace.current
            assert values[("pffs_pace_halvings_total", source)] == pace.halvings
            in_flight = (*source, ("use", "preload"))
            assert values[("pffs_pace_in_flight", tuple(sorted(in_flight)))] == 0
            (line,) = pace_lines(values)
            assert f"places {pace.current}/{pace.ceiling}" in line
    assert outcomes[True] == outcomes[False]
    assert outcomes[True][2] == f"{paths[5]}: 503 SlowDown"


async def _read_ranges(vfs: Vfs, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    fh, _ = await vfs.open(await resolve(vfs, path), os.O_RDONLY)
    try:
        return [bytes(await vfs.read(fh, offset, size)) for offset, size in ranges]
    finally:
        await vfs.release(fh)


def test_a_projection_of_its_files_holds_the_preload_until_one_is_read_through(
    tmp_path: Path,
) -> None:
    """A column projection (docs/notes/clients-parquet.md): each file's footer, then a few
    chunks in its middle, a small share of it. Loading the other files whole would fetch ten
    times what is read: nothing is loaded until a file is read through (a scan), then the rest
    of the directory is."""
    size = 2 << 20  # 32 blocks of 64 KiB
    files = dataset(tmp_path, {"columns": 12}, size)
    vfs, backend = preloading_vfs(tmp_path)
    paths = list(files)
    footer = (size - 64 * KIB, 64 * KIB)
    chunks = [(offset, 40 * KIB) for offset in (300 * KIB, 900 * KIB, 1500 * KIB)]

    async def body() -> None:
        for path in paths[:5]:
            got = await _read_ranges(vfs, path, [footer, *chunks])
            assert got == [files[path][o : o + n] for o, n in [footer, *chunks]]
        await trio.sleep(0.3)  # time for a listing and loads, were any started
        assert vfs.datasets.engine.stats.files_queued == 0
        assert not any(backend.reads[path] for path in paths[5:])
        assert await read_whole(vfs, paths[5]) == files[paths[5]]  # a scan now
        await vfs.datasets.engine.wait_idle()
        assert vfs.datasets.engine.stats.files_fetched == len(paths) - 6

    with_vfs(vfs, body)


def test_shard_streams_release_the_preload_while_they_are_read(tmp_path: Path) -> None:
    """Tar shards read front to back by several readers at once (WebDataset): their first
    reads are a run from each file's start, so the other shards are loaded while the first
    are still being read."""
    size = 2 << 20
    files = dataset(tmp_path, {"shards": 10}, size)
    vfs, _backend = preloading_vfs(tmp_path)
    paths = list(files)
    step = 128 * KIB

    async def body() -> None:
        handles = [(await vfs.open(await resolve(vfs, p), os.O_RDONLY))[0] for p in paths[:3]]
        got: list[list[bytes]] = [[] for _ in handles]
        for offset in range(0, 2 * step, step):  # each reader's first two reads
            for n, fh in enumerate(handles):
                got[n].append(bytes(await vfs.read(fh, offset, step)))
        await vfs.datasets.engine.wait_idle()  # the others loaded before these are read
        assert vfs.datasets.engine.stats.files_fetched == len(paths) - 3
        for offset in range(2 * step, size, step):
            for n, fh in enumerate(handles):
                got[n].append(bytes(await vfs.read(fh, offset, step)))
        for n, fh in enumerate(handles):
            await vfs.release(fh)
            assert b"".join(got[n]) == files[paths[n]]

    with_vfs(vfs, body)

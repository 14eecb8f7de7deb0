"""A dataset larger than the disk tier, read for shuffled epochs through the VFS (no kernel):
the cache keeps a stable subset of it, so epoch 2 takes about the cache's share of its bytes
from the cache, dataset preload loads nothing outside the subset, every byte is exact; a
dataset that fits is cached whole as before; the metrics and `pffs stats` show each dataset.

The store is the real local backend, counting reads by path (tests.fs.test_datasets).
"""

from __future__ import annotations

import random
from pathlib import Path

import trio

from pffs import metrics
from pffs.cache.blocks import BlockCache
from pffs.cache.datasetroom import KEEP_SHARE, subset_point
from pffs.cli.stats_view import dataset_lines, series
from pffs.config import CacheConfig, PreloadConfig
from pffs.fs.vfs import Vfs
from tests.fs.helpers import HoldingBackend, dataset, make_vfs, read_whole

KIB = 1024
MIB = 1 << 20
FILE = 64 * KIB  # one block each
FILES = 256  # 16 MiB: twice the disk tier below


def room_vfs(root: Path, tmp: Path, disk_bytes: int) -> tuple[Vfs, HoldingBackend]:
    """A Vfs over `root` with a disk tier of `disk_bytes`, and its store."""
    backend = HoldingBackend(root)
    config = CacheConfig(
        block_size=FILE,
        memory_bytes=2 * MIB,
        disk_dir=str(tmp / "cache"),
        disk_bytes=disk_bytes,
        free_ratio=0.0,  # no floor: whatever the machine's disk holds (tests/conftest.py)
    )
    return make_vfs(backend, cache=config, dataset=PreloadConfig()), backend


def served(cache: BlockCache) -> tuple[int, int]:
    """(bytes served from memory or disk, bytes served in all) so far."""
    stats = cache.stats
    cached = stats.memory_bytes_served + stats.disk_bytes_served
    return cached, cached + stats.store_bytes_served


def two_epochs(vfs: Vfs, files: dict[str, bytes]) -> list[float]:
    """Read every file in two shuffled epochs (4 readers); each epoch's share from the cache."""
    shares: list[float] = []

    async def read_epoch(seed: int) -> None:
        order = list(files)
        random.Random(seed).shuffle(order)
        before = served(vfs.cache)

        async def reader(paths: list[str]) -> None:
            for path in paths:
                assert await read_whole(vfs, path) == files[path]

        async with trio.open_nursery() as readers:
            for worker in range(4):
                readers.start_soon(reader, order[worker::4])
        await vfs.cache.flush()
        after = served(vfs.cache)
        shares.append((after[0] - before[0]) / (after[1] - before[1]))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await read_epoch(1)
            await vfs.datasets.engine.wait_idle()
            await vfs.cache.flush()
            await read_epoch(2)
            nursery.cancel_scope.cancel()

    trio.run(main)
    vfs.cache.close()
    return shares


def test_a_dataset_twice_the_disk_tier_keeps_a_stable_subset(tmp_path: Path) -> None:
    files = dataset(tmp_path / "store", {"train": FILES}, FILE)
    vfs, backend = room_vfs(tmp_path / "store", tmp_path, disk_bytes=FILES * FILE // 2)
    shares = two_epochs(vfs, files)

    (described,) = vfs.cache.room.describe()
    assert described["dataset"] == "/train"
    assert described["size"] == FILES * FILE and described["files"] == FILES
    assert described["fits"] is False and described["listed"] is True
    # Epoch 2 finds about the share the room keeps (plus what memory still holds); cycling
    # through the set, as least-recently-stored eviction alone does, finds about 20%.
    kept_share = KEEP_SHARE / 2
    assert shares[1] >= kept_share - 0.1, shares
    # Dataset preload loaded no file outside the subset: each of those was fetched by its
    # reader, once per epoch, and never written to disk.
    source = vfs.table.mounted[0].backend.source_id
    threshold = float(described["threshold"])
    kept = {path for path in files if subset_point(source, path) < threshold}
    for path in set(files) - kept:
        assert backend.reads[path] <= 2, path
    assert vfs.cache.stats.disk_writes_declined >= len(files) - len(kept)
    # Most of the subset was fetched once, in epoch 1, and served from the cache in epoch 2.
    once = [path for path in kept if backend.reads[path] == 1]
    assert len(once) >= 0.8 * len(kept)


def test_a_dataset_that_fits_is_cached_whole_as_before(tmp_path: Path) -> None:
    files = dataset(tmp_path / "store", {"train": FILES}, FILE)
    vfs, backend = room_vfs(tmp_path / "store", tmp_path, disk_bytes=64 * MIB)
    shares = two_epochs(vfs, files)

    (described,) = vfs.cache.room.describe()
    assert described["fits"] is True and described["size"] == FILES * FILE
    assert shares[1] == 1.0
    assert vfs.cache.stats.disk_writes_declined == 0
    assert max(backend.reads.values()) <= 2  # (a reader may race the engine to a file)


def test_the_metrics_and_pffs_stats_show_each_dataset(tmp_path: Path) -> None:
    files = dataset(tmp_path / "store", {"train": FILES}, FILE)
    vfs, _ = room_vfs(tmp_path / "store", tmp_path, disk_bytes=FILES * FILE // 2)
    two_epochs(vfs, files)
    describe = vfs.cache.room.describe
    metrics.cache.watch_datasets(describe)
    try:
        values = series(metrics.snapshot())
    finally:
        metrics.cache.unwatch_datasets(describe)
    labels = (("dataset", "/train"),)
    assert values[("pffs_dataset_size_bytes", labels)] == FILES * FILE
    assert values[("pffs_dataset_files", labels)] == FILES
    assert values[("pffs_dataset_fits", labels)] == 0
    cached = values[("pffs_dataset_cached_bytes", labels)]
    assert 0.3 * FILES * FILE < cached <= FILES * FILE // 2  # at most what the tier holds
    assert values[("pffs_dataset_room_bytes", labels)] == int(KEEP_SHARE * FILES * FILE // 2)
    (line,) = dataset_lines(values)
    assert line.startswith("  dataset /train: 16.8 MB in 256 files, cached ")
    assert "does not fit: a stable subset of 47.5% kept" in line

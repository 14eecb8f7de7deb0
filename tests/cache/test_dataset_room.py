"""The room for datasets being consumed (pffs.cache.datasetroom): a dataset that fits is
admitted whole, one that does not keeps the same hash-chosen subset in every process, rooms
are shared max-min, other data is never held back, idle datasets are forgotten; and the disk
tier's write-behind declines what the room does not keep."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio
from trio.testing import MockClock

from pffs.cache.blocks import BlockCache
from pffs.cache.datasetroom import KEEP_SHARE, DatasetRoom, subset_point
from pffs.cache.keys import BlockKey
from tests.cache.configs import FetchSource, cache_config

MIB = 1 << 20
FILE = MIB // 2


def keys(count: int, source: str = "s3://b", prefix: str = "train/") -> list[BlockKey]:
    return [BlockKey(source, "u", f"{prefix}f{i:04}.bin", "v1", 0) for i in range(count)]


def in_trio(body: Callable[[], None]) -> None:
    """Run `body` in a trio run (the room reads trio's clock)."""

    async def main() -> None:
        body()

    trio.run(main)


def watched_room(capacity: int, files: int) -> tuple[DatasetRoom, list[BlockKey]]:
    room = DatasetRoom(capacity)
    watched = room.watch("/train", "s3://b", "u", "train/")
    blocks = keys(files)
    for key in blocks:
        watched.count(key.path, FILE)
    room.listed(watched, complete=True)
    return room, blocks


def test_a_dataset_that_fits_is_admitted_whole() -> None:
    def body() -> None:
        room, blocks = watched_room(256 * MIB, 400)  # 200 MiB: within 95% of 256 MiB
        assert all(room.admit(key, FILE) for key in blocks)
        (described,) = room.describe()
        assert described["fits"] is True
        assert described["size"] == 400 * FILE
        assert described["cached_share"] == 1.0

    in_trio(body)


def test_a_dataset_twice_the_cache_keeps_a_stable_hash_subset() -> None:
    def body() -> None:
        room, blocks = watched_room(256 * MIB, 1000)  # 500 MiB
        kept = [key for key in blocks if room.admit(key, FILE)]
        (described,) = room.describe()
        threshold = float(described["threshold"])
        assert kept == [k for k in blocks if subset_point(k.source, k.path) < threshold]
        # The room's worth, to a file: the threshold is placed by the bytes below it.
        assert KEEP_SHARE * 256 * MIB - 2 * FILE < len(kept) * FILE <= KEEP_SHARE * 256 * MIB
        assert described["fits"] is False
        assert described["cached"] == len(kept) * FILE
        # Another process (another room) keeps the same files; a larger room a superset.
        again, _ = watched_room(256 * MIB, 1000)
        assert [key for key in blocks if again.keeps(key)] == kept
        larger, _ = watched_room(320 * MIB, 1000)
        assert set(kept) < {key for key in blocks if larger.keeps(key)}

    in_trio(body)


def test_other_data_is_admitted_and_the_blocks_of_one_file_go_together() -> None:
    def body() -> None:
        room, blocks = watched_room(64 * MIB, 1000)
        assert all(room.admit(key, FILE) for key in keys(50, prefix="val/"))
        assert all(room.admit(key, FILE) for key in keys(50, source="s3://other"))
        for key in blocks[:50]:
            later = key._replace(block=3)
            assert room.keeps(later) == room.keeps(key)

    in_trio(body)


def test_an_unlisted_dataset_fits_until_its_listing_passes_its_room() -> None:
    def body() -> None:
        room = DatasetRoom(100 * MIB)
        watched = room.watch("/train", "s3://b", "u", "train/")
        blocks = keys(400)
        assert all(room.keeps(key) for key in blocks)  # nothing listed yet: as before
        for key in blocks[:180]:
            watched.count(key.path, FILE)
        room.listed(watched, complete=False)
        assert watched.fits and all(room.keeps(key) for key in blocks)
        for key in blocks[180:]:
            watched.count(key.path, FILE)
        room.listed(watched, complete=False)
        assert not watched.fits
        assert 0 < sum(room.keeps(key) for key in blocks) < 400

    in_trio(body)


def test_rooms_are_shared_max_min() -> None:
    def body() -> None:
        room = DatasetRoom(100 * MIB)
        sizes = {"small": 10 * MIB, "large": 200 * MIB, "huge": 400 * MIB}
        watched = {name: room.watch(f"/{name}", "s3://b", "u", f"{name}/") for name in sizes}
        for name, size in sizes.items():
            for key in keys(size // FILE, prefix=f"{name}/"):
                watched[name].count(key.path, FILE)
            room.listed(watched[name], complete=True)
        small, large, huge = watched.values()
        left = int(KEEP_SHARE * 100 * MIB) - 10 * MIB
        assert small.fits
        assert not large.fits and not huge.fits
        assert large.room == huge.room == left // 2

    in_trio(body)


def test_a_parent_replaces_the_datasets_inside_it_and_idle_ones_are_forgotten() -> None:
    async def main() -> None:
        room = DatasetRoom(64 * MIB, idle_after=0.05)
        room.watch("/imagenet/train/n1", "s3://b", "u", "imagenet/train/n1/")
        parent = room.watch("/imagenet/train", "s3://b", "u", "imagenet/train/")
        assert [d["dataset"] for d in room.describe()] == ["/imagenet/train"]
        blocks = keys(1000, prefix="imagenet/train/n1/")
        for key in blocks:
            parent.count(key.path, FILE)
        room.listed(parent, complete=True)
        assert not all(room.keeps(key) for key in blocks)
        await trio.sleep(0.1)  # no reader for longer than idle_after
        assert all(room.keeps(key) for key in blocks)
        assert room.describe() == []

    # Virtual time: counting a thousand files on a busy machine may take longer than idle_after.
    trio.run(main, clock=MockClock(autojump_threshold=0))


def test_the_disk_tier_declines_blocks_outside_the_subset(tmp_path: Path) -> None:
    block = 16 * 1024
    cache = BlockCache(cache_config(tmp_path, block, disk_bytes=64 * block))
    blocks = keys(100)

    async def main() -> None:
        watched = cache.room.watch("/train", "s3://b", "u", "train/")
        for key in blocks:
            watched.count(key.path, block)
        cache.room.listed(watched, complete=True)
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            for key in blocks:

                async def fetch() -> bytes:
                    return b"x" * block

                await cache.read(key, FetchSource(fetch), block)
            await cache.flush()
            present = await cache.cached_bytes(blocks, [block] * len(blocks))
            nursery.cancel_scope.cancel()
        kept = [key for key in blocks if cache.room.keeps(key)]
        assert present == len(kept) * block
        assert cache.stats.disk_writes == len(kept)
        assert cache.stats.disk_writes_declined == len(blocks) - len(kept)

    try:
        trio.run(main)
    finally:
        cache.close()

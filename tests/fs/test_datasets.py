"""Dataset preload through the VFS, without a kernel: detection from opens (flat and nested),
bytes exact, a reader not starved while preload is saturated, `.pffs/preload` order lists
with bad entries, and what does not count (writes, `.pffs`).

The store is the real local backend, wrapped to count reads by path and to hold the reads of
chosen paths (a store that stalls, which a real server cannot do on demand).
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

from pffs.backends import open_backend
from pffs.backends.base import Capabilities, ObjectInfo
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, DatasetConfig, FuseConfig, MetaConfig, SourceConfig
from pffs.errors import ReadOnly, Throttled, Transient, Unsupported
from pffs.fs.inodes import ROOT_INODE
from pffs.fs.special import HIDDEN_DIR, PRELOAD_FILE
from pffs.fs.vfs import Vfs
from pffs.routing.table import MountTable

KIB = 1024


class HoldingBackend:
    """The local backend; counts reads by path, and holds reads of paths in `held` until
    `release` is set (in the worker thread, so only that request waits)."""

    def __init__(self, root: Path) -> None:
        self.inner = open_backend(SourceConfig(url=f"file://{root}"))
        self.source_id = self.inner.source_id
        self.principal = self.inner.principal
        self.max_concurrency = 4
        self.capabilities = Capabilities()  # reads only
        self.retries = 0
        self.reads: Counter[str] = Counter()
        self.held: set[str] = set()
        self.throttled: set[str] = set()  # reads answered with 503 SlowDown
        self.release = threading.Event()

    def check(self) -> None:
        self.inner.check()

    def probe(self) -> None:
        self.inner.probe()

    def stat(self, path: str) -> ObjectInfo:
        return self.inner.stat(path)

    def list(self, path: str) -> Iterator[ObjectInfo]:
        return self.inner.list(path)

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes:
        self.reads[path] += 1
        if path in self.held:
            self.release.wait(10)
        if path in self.throttled:
            raise Throttled(f"{path}: 503 SlowDown")  # what S3 maps a SlowDown to
        return self.inner.read_range(path, start, length, version)


def dataset(root: Path, layout: dict[str, int], size: int) -> dict[str, bytes]:
    """Files of `size` bytes: layout maps a directory to its file count."""
    rng = random.Random(size)
    files: dict[str, bytes] = {}
    for directory, count in layout.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            path = f"{directory}/{i:03}.bin"
            files[path] = rng.randbytes(size)
            (root / path).write_bytes(files[path])
    return files


def make_vfs(root: Path, **dataset_options: object) -> tuple[Vfs, HoldingBackend]:
    backend = HoldingBackend(root)
    meta = MetaConfig(attr_ttl=60.0, entry_ttl=60.0, dir_ttl=60.0, negative_ttl=60.0)
    cache = BlockCache(CacheConfig(block_size=64 * KIB, memory_bytes=64 << 20, disk_dir=None))
    staging = tempfile.mkdtemp(prefix="pffs-staging-")
    config = DatasetConfig(**dataset_options)  # type: ignore[arg-type]
    vfs = Vfs(
        MountTable.single(backend),
        meta,
        FuseConfig(mountpoint="/unused"),
        cache,
        staging_dir=staging,
        dataset=config,
    )
    return vfs, backend


async def resolve(vfs: Vfs, path: str) -> int:
    ino = ROOT_INODE
    for name in path.split("/"):
        ino = (await vfs.lookup(ino, name)).ino
    return ino


async def read_whole(vfs: Vfs, path: str, flags: int = os.O_RDONLY) -> bytes:
    fh, _ = await vfs.open(await resolve(vfs, path), flags)
    try:
        return bytes(await vfs.read(fh, 0, 1 << 30))
    finally:
        await vfs.release(fh)


def with_vfs(vfs: Vfs, body: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("size", [10 * KIB, 150 * KIB])  # one block, and a run of three
def test_three_opens_preload_the_rest_of_the_directory(tmp_path: Path, size: int) -> None:
    files = dataset(tmp_path, {"train": 50}, size)
    vfs, backend = make_vfs(tmp_path)
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
    vfs, backend = make_vfs(tmp_path, trigger_window=0.0)

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
    vfs, backend = make_vfs(tmp_path)
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
    vfs, _ = make_vfs(tmp_path)

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
    vfs, backend = make_vfs(tmp_path, enabled=False)

    async def body() -> None:
        for path in list(files)[:5]:
            await read_whole(vfs, path)
        await trio.sleep(0.2)  # time for a listing and loads in worker threads, were any started

    with_vfs(vfs, body)
    assert sum(backend.reads.values()) == 5


def test_reader_is_not_starved_while_preload_is_saturated(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"d": 40}, KIB)
    vfs, backend = make_vfs(tmp_path, concurrency=8, max_concurrency=8)
    paths = list(files)
    # Every preload request stalls at the store: all the preload slots are taken.
    backend.held = set(paths[3:-1])

    async def body() -> None:
        for path in paths[:3]:
            await read_whole(vfs, path)
        with trio.fail_after(5):
            while vfs.datasets.engine.files_in_flight < 8:
                await trio.sleep(0.01)
        await trio.sleep(0.1)
        assert vfs.datasets.engine.files_in_flight == 8
        with trio.fail_after(5):  # the reader's own request goes around the stalled preload
            assert await read_whole(vfs, paths[-1]) == files[paths[-1]]
        backend.release.set()
        await vfs.datasets.engine.wait_idle()

    with_vfs(vfs, body)
    # Still queued when its reader opened it: the reader fetched it alone, first (no engine
    # priority is needed, pffs.cache.preload), and the engine never loaded it again.
    assert backend.reads[paths[-1]] == 1


def test_order_list_through_the_control_file(tmp_path: Path) -> None:
    files = dataset(tmp_path, {"a": 5, "b": 5}, 2 * KIB)
    # Detection off in effect: only the order list preloads here.
    vfs, backend = make_vfs(tmp_path, concurrency=1, max_concurrency=1, trigger_files=100)
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
        vfs, backend = make_vfs(tmp_path, enabled=enabled, concurrency=16)
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
            assert stats.files_failed == 4 and stats.throttled == 4
            assert vfs.datasets.engine.concurrency < 16
            assert stats.files_fetched == 23
    assert outcomes[True] == outcomes[False]
    assert outcomes[True][2] == f"{paths[5]}: 503 SlowDown"

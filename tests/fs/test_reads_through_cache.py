"""The block cache through the VFS: tiers, checksums, readahead and persistence (the cache's
tests that need no VFS are in tests/cache/).

The store here is a fake on purpose: it injects failures and delays on demand and counts every
fetch, which no real server can do reliably. Real servers are used by the mount tests.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pffs.backends.base import Capabilities, ObjectInfo
from pffs.config import CacheConfig, MetaConfig
from pffs.errors import Changed, NotFound, Transient
from pffs.fs.inodes import ROOT_INODE
from pffs.fs.vfs import Vfs
from pffs.retry import RetryTerms
from tests.cache.configs import KIB, cache_config
from tests.fs.helpers import make_vfs


class FakeStore:
    """One-directory store in memory: counts reads, fails every `fail_every`-th, can be slow."""

    def __init__(self, files: dict[str, bytes], fail_every: int = 0, delay: float = 0.0) -> None:
        self.files = dict(files)
        self.versions = dict.fromkeys(files, 1)
        self.fail_every = fail_every
        self.delay = delay
        self.reads = 0
        self.ranges: list[tuple[int, int]] = []  # (start, length) of every read
        self.source_id = "fake://store"
        self.principal = "reader"
        self.principal_key: bytes | None = None
        self.max_concurrency = 8
        self.capabilities = Capabilities()  # reads only
        self.retries = 0

    def check(self) -> None:
        pass

    def probe(self) -> None:
        pass

    def _info(self, name: str) -> ObjectInfo:
        return ObjectInfo(name, len(self.files[name]), 1.0, f'"v{self.versions[name]}"', False)

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        if path == "":
            return ObjectInfo("", 0, 1.0, None, True)
        if path not in self.files:
            raise NotFound(path)
        return self._info(path)

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        for name in sorted(self.files):
            yield self._info(name)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        self.reads += 1
        self.ranges.append((start, length))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_every and self.reads % self.fail_every == 0:
            raise Transient(f"injected failure on read {self.reads}")
        if version is not None and version != self._info(path).version:
            raise Changed(path)
        return self.files[path][start : start + length]

    def overwrite(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.versions[path] += 1


# Metadata never kept: every open asks the store.
NO_TTLS = MetaConfig(attr_ttl=0.0, entry_ttl=0.0, dir_ttl=0.0, negative_ttl=0.0)


def cached_vfs(store: FakeStore, config: CacheConfig) -> Vfs:
    return make_vfs(store, meta=NO_TTLS, cache=config)


async def read_file(vfs: Vfs, name: str, reads: list[tuple[int, int]]) -> list[bytes]:
    inode = await vfs.lookup(ROOT_INODE, name)
    fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
    try:
        return [bytes(await vfs.read(fh, offset, size)) for offset, size in reads]
    finally:
        await vfs.release(fh)


async def with_nursery(vfs: Vfs, name: str, reads: list[tuple[int, int]]) -> list[bytes]:
    async with trio.open_nursery() as nursery:
        vfs.attach(nursery)
        result = await read_file(vfs, name, reads)
        await vfs.drain()
        nursery.cancel_scope.cancel()
    return result


# --- property tests against reference bytes ---------------------------------------------------

reads_strategy = st.lists(
    st.tuples(st.integers(0, 300 * KIB), st.integers(1, 70 * KIB)), min_size=1, max_size=40
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.integers(0, 260 * KIB), reads=reads_strategy, sequential=st.booleans())
def test_random_reads_match_reference(tmp_path: Path, size: int, reads, sequential: bool) -> None:
    data = random.Random(size).randbytes(size)
    if sequential:  # a streaming reader, to drive readahead
        reads = [(offset, 8 * KIB) for offset in range(0, size + 8 * KIB, 8 * KIB)]
    store = FakeStore({"f": data}, delay=0.0005)
    vfs = cached_vfs(store, cache_config(None))
    got = trio.run(with_nursery, vfs, "f", reads)
    assert got == [data[o : o + n] for o, n in reads]
    # Each block came from the store at most once (readahead and readers share fetches); other
    # reads are a reader's part of a cold block, asked for while the block loads behind it.
    blocks = [
        r for r in store.ranges if r[0] % (16 * KIB) == 0 and r[1] == min(16 * KIB, size - r[0])
    ]
    assert len(blocks) == len(set(blocks)) <= -(-size // (16 * KIB))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reads=reads_strategy)
def test_injected_failures_never_give_wrong_bytes(tmp_path: Path, reads) -> None:
    data = random.Random(1).randbytes(250 * KIB)
    store = FakeStore({"f": data}, fail_every=3)
    vfs = cached_vfs(store, cache_config(None))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            for offset, size in reads:
                try:
                    got = await read_file(vfs, "f", [(offset, size)])
                except Transient:
                    continue  # an error is allowed; wrong bytes are not
                assert got == [data[offset : offset + size]]
            nursery.cancel_scope.cancel()

    trio.run(main)


class RunStore(FakeStore):
    """A FakeStore that also serves runs of blocks in one request (as S3 does), failing the
    `fail_at`-th block it hands over, after those before it were delivered."""

    def __init__(self, files: dict[str, bytes], fail_at: int = 0) -> None:
        super().__init__(files)
        self.capabilities = Capabilities(block_runs=True)
        self.requests = 0
        self.blocks_delivered = 0
        self.fail_at = fail_at

    def read_blocks(self, path, start, lengths, version, terms=None) -> Iterator[bytes]:
        self.requests += 1
        offset = start
        for length in lengths:
            if self.fail_at and self.blocks_delivered + 1 == self.fail_at:
                self.fail_at = 0
                raise Transient("connection reset in the middle of a run")
            yield self.read_range(path, offset, length, version)
            self.blocks_delivered += 1
            offset += length


def test_readahead_asks_for_consecutive_blocks_in_one_request() -> None:
    data = random.Random(3).randbytes(64 * 16 * KIB + 100)
    store = RunStore({"f": data})
    config = cache_config(None, readahead_max=16 * 16 * KIB, fetch_size=4 * 16 * KIB)
    reads = [(offset, 8 * KIB) for offset in range(0, len(data), 8 * KIB)]
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert b"".join(got) == data
    blocks = -(-len(data) // (16 * KIB))
    assert store.reads <= blocks  # no block fetched twice
    # Runs of up to 4 blocks: far fewer requests than blocks (the first few are single).
    assert store.requests + (store.reads - store.blocks_delivered) < blocks // 2


@pytest.mark.parametrize("fail_at", [1, 2, 6, 11])
def test_a_run_broken_midway_loses_nothing(fail_at: int) -> None:
    data = random.Random(fail_at).randbytes(40 * 16 * KIB)
    store = RunStore({"f": data}, fail_at=fail_at)
    config = cache_config(None, readahead_max=16 * 16 * KIB, fetch_size=4 * 16 * KIB)
    reads = [(offset, 16 * KIB) for offset in range(0, len(data), 16 * KIB)]
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]  # readers fetched the rest themselves


# --- the disk tier ---------------------------------------------------------------------------


def _entry_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*.val")]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_entries_are_dropped_and_refetched(tmp_path: Path, damage: str) -> None:
    data = random.Random(5).randbytes(100 * KIB)
    store = FakeStore({"f": data})
    config = cache_config(tmp_path)
    trio.run(with_nursery, cached_vfs(store, config), "f", [(0, len(data))])
    files = _entry_files(tmp_path / "cache")
    assert len(files) == 7  # 100 KiB in 16 KiB blocks, every one written behind the reader
    victim = files[3]
    raw = victim.read_bytes()
    if damage == "flip":
        middle = len(raw) // 2  # inside the payload
        victim.write_bytes(raw[:middle] + bytes([raw[middle] ^ 0xFF]) + raw[middle + 1 :])
    elif damage == "truncate":
        victim.write_bytes(raw[: len(raw) // 2])
    else:
        victim.unlink()
    reads_before = store.reads
    vfs = cached_vfs(store, config)  # a fresh mount: nothing in memory
    assert trio.run(with_nursery, vfs, "f", [(0, len(data))]) == [data]
    assert store.reads == reads_before + 1  # only the damaged block came from the store
    assert vfs.cache.stats.disk_hits == 6
    if damage != "delete":
        assert vfs.cache.stats.disk_corrupt == 1


def test_disk_tier_survives_a_remount(tmp_path: Path) -> None:
    data = random.Random(9).randbytes(200 * KIB)
    store = FakeStore({"f": data})
    config = cache_config(tmp_path)
    trio.run(with_nursery, cached_vfs(store, config), "f", [(0, len(data))])
    fetched = store.reads
    assert fetched == 13
    again = cached_vfs(store, config)
    assert trio.run(with_nursery, again, "f", [(0, len(data))]) == [data]
    assert store.reads == fetched  # every block came from disk
    assert again.cache.stats.disk_hits == 13


def test_changed_object_is_refetched_not_mixed(tmp_path: Path) -> None:
    old = random.Random(1).randbytes(100 * KIB)
    new = random.Random(2).randbytes(100 * KIB)
    store = FakeStore({"f": old})
    vfs = cached_vfs(store, cache_config(tmp_path))
    assert trio.run(with_nursery, vfs, "f", [(0, len(old))]) == [old]
    store.overwrite("f", new)
    assert trio.run(with_nursery, vfs, "f", [(0, len(new))]) == [new]

    async def open_then_change() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await read_changed()
            nursery.cancel_scope.cancel()

    async def read_changed() -> None:
        inode = await vfs.lookup(ROOT_INODE, "f")
        fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
        await vfs.read(fh, 0, 10)
        store.overwrite("f", old)
        # Blocks of the version it opened may still come from the cache; a block that must
        # come from the store is refused, never taken from the new version.
        _evict_all(vfs)
        with pytest.raises(Changed):
            await vfs.read(fh, 90 * KIB, 10 * KIB)

    trio.run(open_then_change)


def _evict_all(vfs: Vfs) -> None:
    for key in list(vfs.cache.memory._blocks):
        vfs.cache.memory.discard(key)
    if vfs.cache.disk is not None:
        vfs.cache.disk.clear()


def test_free_space_floor_reads_around_the_cache(tmp_path: Path) -> None:
    data = random.Random(4).randbytes(64 * KIB)
    store = FakeStore({"f": data})
    # A floor no file system can meet: nothing is stored, and readers see no error.
    vfs = cached_vfs(store, cache_config(tmp_path, free_ratio=0.999999))
    assert trio.run(with_nursery, vfs, "f", [(0, len(data))]) == [data]
    assert vfs.cache.stats.disk_writes == 0 and vfs.cache.stats.disk_write_skips == 4


def test_random_reads_use_verified_chunks_of_the_disk_tier(tmp_path: Path) -> None:
    block = 256 * KIB  # four 64 KiB chunks per block
    data = random.Random(8).randbytes(4 * block)
    store = FakeStore({"f": data})
    config = cache_config(tmp_path, block=block)
    trio.run(with_nursery, cached_vfs(store, config), "f", [(0, len(data))])
    fetched = store.reads
    offset = 2 * block + 70 * KIB  # inside block 2, chunk 1: not where a sequential read starts
    vfs = cached_vfs(store, config)
    assert trio.run(with_nursery, vfs, "f", [(offset, 100)]) == [data[offset : offset + 100]]
    assert store.reads == fetched and vfs.cache.stats.disk_hits == 1
    assert len(vfs.cache.memory) == 0  # a part of a block is not a block: memory untouched
    # Damage that chunk on disk: the partial read notices and goes to the store.
    [victim] = [
        p
        for p in _entry_files(tmp_path / "cache")
        if p.read_bytes().find(data[offset : offset + 100]) > 0
    ]
    raw = bytearray(victim.read_bytes())
    raw[raw.find(data[offset : offset + 100]) + 5] ^= 0xFF
    victim.write_bytes(bytes(raw))
    vfs = cached_vfs(store, config)
    assert trio.run(with_nursery, vfs, "f", [(offset, 100)]) == [data[offset : offset + 100]]
    # The reader's 100 bytes come on their own; the block is fetched again behind them.
    assert store.reads == fetched + 2 and vfs.cache.stats.disk_corrupt == 1


class GatedStore(FakeStore):
    """Holds every read of more than `small` bytes until `gate` opens (a slow block transfer)."""

    def __init__(self, files: dict[str, bytes], small: int) -> None:
        super().__init__(files)
        self.small = small
        self.gate = threading.Event()

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        if length > self.small and not self.gate.wait(timeout=10):
            raise Transient("the gate never opened")
        return super().read_range(path, start, length, version, terms)


def test_a_small_read_of_a_cold_block_does_not_wait_for_the_whole_block() -> None:
    block = 256 * KIB
    data = random.Random(9).randbytes(3 * block)
    store = GatedStore({"f": data}, small=4 * KIB)
    vfs = cached_vfs(store, cache_config(None, block=block))
    offset = block + 1000  # a random read in the middle of the file

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            with trio.fail_after(5):  # the block's transfer is held: only the part can come
                assert await vfs.read(fh, offset, 4 * KIB) == data[offset : offset + 4 * KIB]
            store.gate.set()
            await vfs.drain()
            reads = store.reads
            later = offset + 100 * KIB  # the same block, now in memory
            assert await vfs.read(fh, later, 4 * KIB) == data[later : later + 4 * KIB]
            assert store.reads == reads  # the block landed behind the part
            assert store.ranges[0] == (offset, 4 * KIB)
            assert (block, block) in store.ranges
            await vfs.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_small_file_is_fetched_from_its_open() -> None:
    data = random.Random(10).randbytes(10 * KIB)
    store = GatedStore({"f": data}, small=0)  # every read waits for the gate
    vfs = cached_vfs(store, cache_config(None))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            await trio.testing.wait_all_tasks_blocked()  # whatever the open started waits
            assert vfs.cache.ahead.loading == len(data)  # asked for before any read
            store.gate.set()
            assert await vfs.read(fh, 0, 128 * KIB) == data
            assert store.reads == 1
            await vfs.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_region_read_through_page_faults_fetches_little_beyond_it() -> None:
    """The kernel's reads of a mapped region (a tensor): 256 KiB each, from the middle of a
    large file, front to back. The first two start no run and get their bytes alone (no block
    loaded behind them); then the run reads ahead for itself, never the rest of the file."""
    block = 1024 * KIB
    data = random.Random(11).randbytes(64 * block)
    store = FakeStore({"f": data})
    vfs = cached_vfs(store, cache_config(None, block=block))
    start, size, region = 20 * block + 512 * KIB, 256 * KIB, 8 * block
    reads = [(offset, size) for offset in range(start, start + region, size)]
    got = trio.run(with_nursery, vfs, "f", reads)
    assert b"".join(got) == data[start : start + region]
    assert store.ranges[:2] == [(start, size), (start + size, size)]  # alone
    fetched = sum(length for _, length in store.ranges)
    assert fetched <= 1.75 * region
    assert max(offset + length for offset, length in store.ranges) <= start + 1.5 * region


def test_a_parquet_projection_fetches_its_footer_and_chunks_alone() -> None:
    """pyarrow's projection of a Parquet file as the kernel passes it on: the footer (the
    file's last 64 KiB) read alone, then a column chunk of ~460 KiB every ~3.5 MiB
    (docs/notes/clients-parquet.md). Each read gets its own bytes; no block is loaded behind
    the footer or the chunks, and no readahead makes a run of them."""
    block = 4096 * KIB
    data = random.Random(12).randbytes(9 * block)
    store = FakeStore({"f": data})
    vfs = cached_vfs(store, cache_config(None, block=block))
    footer = (len(data) - 64 * KIB, 64 * KIB)
    chunks = [(offset, 470_000) for offset in range(1_400_000, 32 * block // 4, 3_600_000)]
    got = trio.run(with_nursery, vfs, "f", [footer, *chunks])
    assert got == [data[offset : offset + size] for offset, size in [footer, *chunks]]
    fetched = sum(length for _, length in store.ranges)
    assert fetched <= 1.1 * sum(size for _, size in [footer, *chunks]), store.ranges

"""What the VFS tests share: one way to build a Vfs without a kernel (`make_vfs`), a store that
counts and holds reads (`HoldingBackend`, the real local backend underneath), a dataset on disk,
and the walks a kernel would make (`resolve`, `read_whole`, `with_vfs`)."""

from __future__ import annotations

import os
import random
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import trio

from pffs.backends import open_backend
from pffs.backends.base import Backend, Capabilities, ObjectInfo
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, FuseConfig, MetaConfig, PreloadConfig, SourceConfig
from pffs.errors import Throttled
from pffs.fs.inodes import ROOT_INODE
from pffs.fs.vfs import Vfs
from pffs.retry import RetryTerms
from pffs.routing.table import MountTable

KIB = 1024
# Metadata kept a minute: a test sees each store call it causes, none from expiry.
LONG_TTLS = MetaConfig(attr_ttl=60.0, entry_ttl=60.0, dir_ttl=60.0, negative_ttl=60.0)


def make_vfs(
    store: Backend | MountTable,
    *,
    meta: MetaConfig = LONG_TTLS,
    cache: CacheConfig | None = None,
    dataset: PreloadConfig | None = None,
    read_only: bool = False,
) -> Vfs:
    """A Vfs over one store at the root (or a whole mount table), its staging in a fresh
    directory; `cache` None is the Vfs's own memory-only cache."""
    table = store if isinstance(store, MountTable) else MountTable.single(store)
    return Vfs(
        table,
        meta,
        FuseConfig(mountpoint="/unused", read_only=read_only),
        BlockCache(cache, memory_only=table.memory_only) if cache is not None else None,
        staging_dir=tempfile.mkdtemp(prefix="pffs-staging-"),
        dataset=dataset,
    )


class HoldingBackend:
    """The local backend; counts reads by path, and holds reads of paths in `held` until
    `release` is set (in the worker thread, so only that request waits)."""

    def __init__(self, root: Path) -> None:
        self.inner = open_backend(SourceConfig(url=f"file://{root}"))
        self.source_id = self.inner.source_id
        self.principal = self.inner.principal
        self.principal_key: bytes | None = None
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

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        return self.inner.stat(path, terms)

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(path, terms)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        self.reads[path] += 1
        if path in self.held:
            self.release.wait(10)
        if path in self.throttled:
            raise Throttled(f"{path}: 503 SlowDown")  # what S3 maps a SlowDown to
        return self.inner.read_range(path, start, length, version, terms)


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


# Blocks of 64 KiB in 64 MiB of memory, no disk tier.
BLOCKS = CacheConfig(block_size=64 * KIB, memory_bytes=64 << 20, disk_dir=None)


def preloading_vfs(root: Path, **dataset_options: object) -> tuple[Vfs, HoldingBackend]:
    """A Vfs over `root` with the given preload options, and its store."""
    backend = HoldingBackend(root)
    config = PreloadConfig(**dataset_options)  # type: ignore[arg-type]
    return make_vfs(backend, cache=BLOCKS, dataset=config), backend

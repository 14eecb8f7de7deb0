"""What names a block, what the cache asks for blocks it holds none of, and where its parts
start their background tasks.

Shared by every module of the cache and by its callers (the read path, dataset preload,
warmup). A block is identified by (source, principal, path, object version, index): a changed
object has a new version, so its old blocks can never be served for it, and a principal (a
digest of the credentials' identity: pffs.backends.principal) never gets blocks another one
read, in memory, on disk or in flight, however many mounts share the cache directory. What
they do share is the space, the eviction and the per-source usage figures (the disk index's
tag is the source alone). A cache group asks its peers by the same key, principal included.
`ObjectBlocks` is the one place a file becomes block keys and block lengths, so a block loaded
ahead is the very block a reader asks for. The cache never sees a backend; the caller hands it
a `BlockSource`, which gives the bytes back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVarTuple

from trio.abc import ReceiveChannel

Ts = TypeVarTuple("Ts")


class BlockKey(NamedTuple):
    source: str  # the store and root (Backend.source_id)
    principal: str  # who read it (Backend.principal)
    path: str
    version: str
    block: int


@dataclass(frozen=True, slots=True)
class ObjectBlocks:
    """One version of one object (`size` bytes), as `principal` reads it, cut into blocks of
    `block_size` bytes: each block's key, length and place in the object."""

    source: str
    principal: str
    path: str
    version: str
    size: int
    block_size: int

    @property
    def ident(self) -> tuple[str, str, str]:
        """What names the file whatever its version (the preload engine's item ident)."""
        return (self.source, self.principal, self.path)

    @property
    def count(self) -> int:
        return -(-self.size // self.block_size)

    def key(self, index: int) -> BlockKey:
        return BlockKey(self.source, self.principal, self.path, self.version, index)

    def length(self, index: int) -> int:
        return min(self.block_size, self.size - index * self.block_size)

    def start(self, index: int) -> int:
        """Where block `index` starts in the object."""
        return index * self.block_size

    def keys(self, indices: range | None = None) -> list[BlockKey]:
        """The keys of blocks `indices` (default: all of them)."""
        return [self.key(index) for index in (range(self.count) if indices is None else indices)]

    def lengths(self, indices: range | None = None) -> list[int]:
        return [self.length(index) for index in (range(self.count) if indices is None else indices)]

    def spans(self, offset: int, end: int) -> list[tuple[int, int, int]]:
        """(index, start, stop) of each block bytes [offset, end) of the object touch, `start`
        and `stop` counted from the block's first byte."""
        size = self.block_size
        return [
            (index, max(offset - index * size, 0), min(end - index * size, self.length(index)))
            for index in range(offset // size, (end - 1) // size + 1)
        ]


# Loads one block from the store (a reader's miss, or warmup).
# A run of blocks as they land: `async with source.run(first, count) as blocks: async for ...`
Blocks = AbstractAsyncContextManager[ReceiveChannel[tuple[int, bytes]]]


class BlockSource(Protocol):
    """Where the blocks of one open object version come from when the cache holds none of
    them: its store (pffs.store.fetching), or a tier asked before the store (pffs.group). The
    cache asks it for runs of blocks and gets them back as a stream; it never calls the cache.

    Adding a source of blocks is one class with these two methods and no change to the cache.
    """

    def run(self, first: int, count: int) -> Blocks:
        """Blocks first..first+count-1 of the object (indices in the object), in order, each
        sent as soon as it has arrived (loading ahead: readahead, preload, warmup). Written as
        an async generator of (index, bytes) under `@trio.as_safe_channel`, or as a channel
        of its own where that costs too much (the store's run of one block, pffs.store.fetching)."""
        ...

    async def part(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of the object, all of them, for a reader waiting on
        them (a whole block, or the few bytes of a cold start)."""
        ...


class Tasks(Protocol):
    """Where the cache's parts (readahead_engine.py, diskio.py) start their background tasks:
    the block cache's `Background` (pffs.cache.blocks), in the nursery the cache was given, which
    an unmount waits for. Without one there is no background work."""

    @property
    def attached(self) -> bool: ...

    def spawn(self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None: ...

"""The disk tier as trio tasks use it: every call in a worker thread, counted, written behind.

DiskTier (disk.py) blocks; here each of its calls runs through `trio.to_thread.run_sync`
under one limiter (`disk_threads` at once), and what it found is counted in CacheStats. The
one exception is a random read the tier can serve without waiting (an open entry, its chunks
in the page cache): it is tried first, in the trio task, since a thread hop costs more CPU
than the read. A block fetched from the store is written behind: a reader's block queues for
a write slot in the background, a prefetch waits for one (prefetching then runs at the disk's
pace). The slots cap the blocks waiting for the disk, memory the memory tier's bound does not
see.

A random read of a compressed entry gets the whole block from the tier; it is handed to
`keep_block` (the block cache puts it in the memory tier), so the next reads of that block do
not decompress it again.

Blocks of the sources in `memory_only` (a mount table entry's `cache = "memory"`) are never
looked up or written here; without a tier (`--cache-dir none`) no block is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVarTuple

import trio

from pffs.cache.background import Background
from pffs.cache.disk import DiskRead, DiskTier, entry_key
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats

Ts = TypeVarTuple("Ts")


class DiskIO:
    def __init__(
        self,
        tier: DiskTier | None,
        block_size: int,
        threads: int,
        stats: CacheStats,
        background: Background,
    ) -> None:
        self.tier = tier
        self.block_size = block_size
        self.stats = stats
        self.limiter = trio.CapacityLimiter(threads)
        self._write_slots = trio.Semaphore(2 * threads)
        self._background = background
        self.memory_only: set[str] = set()
        # Where a whole block read for a part of it goes (the memory tier), if anywhere.
        self.keep_block: Callable[[BlockKey, bytes], None] | None = None

    def holds(self, key: BlockKey) -> bool:
        """Whether the block belongs in the disk tier (there is one, and its source uses it)."""
        return self.tier is not None and key.source not in self.memory_only

    def name(self, key: BlockKey) -> str:
        """The block's entry key in the tier."""
        return entry_key(key.source, key.path, key.version, self.block_size, key.block)

    # --- reading -----------------------------------------------------------------------------

    async def get(self, key: BlockKey) -> bytes | None:
        """The whole block from the tier, or None (a miss is counted)."""
        if self.tier is None or not self.holds(key):
            return None
        found = await self._read(self.tier.get, self.name(key))
        if found.data is None:
            self.stats.disk_misses += 1
        return found.data

    async def get_range(self, key: BlockKey, start: int, length: int) -> bytes | None:
        """Bytes [start, start+length) of the block, reading only the chunks needed.

        An entry held open whose chunks the page cache holds is read right here (a few
        microseconds, the disk never waited for); anything else takes a worker thread.
        """
        assert self.tier is not None
        name = self.name(key)
        data = self.tier.get_range_nowait(name, start, length)
        if data is not None:
            self.stats.disk_hits += 1
            return data
        found = await self._read(self.tier.get_range, name, start, length)
        if found.data is None or not found.whole:
            return found.data
        if self.keep_block is not None:
            self.keep_block(key, found.data)
        return found.data[start : start + length]

    async def _read(self, reader: Callable[[*Ts], DiskRead], *args: *Ts) -> DiskRead:
        """Run a tier read in a worker thread and count what it found."""
        found = await trio.to_thread.run_sync(reader, *args, limiter=self.limiter)
        if found.corrupt:
            self.stats.disk_corrupt += 1
        if found.data is not None:
            self.stats.disk_hits += 1
        return found

    async def present(self, keys: list[BlockKey]) -> list[bool]:
        """Which of the blocks have an entry (one worker-thread hop for them all)."""
        assert self.tier is not None
        names = [self.name(key) for key in keys]
        return await trio.to_thread.run_sync(self.tier.present, names, limiter=self.limiter)

    # --- writing -----------------------------------------------------------------------------

    async def write_behind(self, key: BlockKey, data: bytes, wait: bool) -> None:
        """Store a fetched block on disk; a reader never waits for it, a prefetch may.

        Blocks waiting for the disk are memory the bound does not see, so their number is
        capped: a prefetch waits for a free slot (prefetching then runs at the disk's pace),
        a reader's block queues for one in the background.
        """
        if not self.holds(key) or not self._background.attached:
            return
        if wait:
            await self._write_slots.acquire()
            self._background.spawn(self._store, key, data)
        else:
            self._background.spawn(self._store_when_free, key, data)

    async def _store_when_free(self, key: BlockKey, data: bytes) -> None:
        await self._write_slots.acquire()
        await self._store(key, data)

    async def _store(self, key: BlockKey, data: bytes) -> bool:
        """Write one block (its write slot already taken, and given back here)."""
        assert self.tier is not None
        try:
            stored = await trio.to_thread.run_sync(
                self.tier.put, self.name(key), data, key.source, limiter=self.limiter
            )
        finally:
            self._write_slots.release()
        if stored:
            self.stats.disk_writes += 1
        else:
            self.stats.disk_write_skips += 1
        return bool(stored)

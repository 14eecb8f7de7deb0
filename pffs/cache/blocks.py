"""The tiered block cache: memory, then disk, then one fetch from the store per block.

Threading rule (DESIGN.md): the cache's state (memory tier, in-flight table, budgets, counters)
is touched only from trio tasks. Worker threads, entered through `trio.to_thread.run_sync`,
only move bytes: disk tier reads and writes, CRC and lz4, and the fetch function's store call.

A block is identified by (source, path, object version, index): a changed object has a new
version, so its old blocks can never be served for it. The cache never sees a backend: it is
handed a fetch function per call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import trio

from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.memory import MemoryTier
from pffs.cache.stats import CacheStats
from pffs.config import CacheConfig

log = logging.getLogger("pffs.cache")

Fetch = Callable[[], Awaitable[bytes]]


class BlockKey(NamedTuple):
    source: str
    path: str
    version: str
    block: int


class _InFlight:
    """One fetch that several readers may wait on (single-flight)."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.prefetch = False
        self.tier = "store"  # where the bytes came from: "disk" or "store" (for metrics)


class BlockCache:
    def __init__(self, config: CacheConfig, stats: CacheStats | None = None) -> None:
        self.config = config
        self.block_size = config.block_size
        self.stats = stats or CacheStats()
        # Prefetched blocks in flight count against the memory bound, so reserve their budget.
        self.prefetch_budget = min(config.prefetch_budget, config.memory_bytes // 2)
        self.memory = MemoryTier(config.memory_bytes - self.prefetch_budget, self.stats)
        self.memory.on_evict = self._evicted
        # A window larger than half the memory tier would evict prefetched blocks before the
        # reader gets to them, and one larger than the budget could never be in flight.
        self.readahead_limit = min(
            config.prefetch_max, self.memory.capacity // 2, self.prefetch_budget
        )
        self.disk = (
            DiskTier(config.disk_dir, config.disk_bytes, config.free_ratio, config.compress)
            if config.disk_dir
            else None
        )
        self.disk_limiter = trio.CapacityLimiter(config.disk_threads)
        self._write_slots = trio.Semaphore(2 * config.disk_threads)
        self._in_flight: dict[BlockKey, _InFlight] = {}
        self._prefetch_in_flight = 0
        self._prefetched: set[BlockKey] = set()
        self._background = 0  # disk writes and prefetches not finished yet
        self._idle = trio.Event()
        self._idle.set()
        self._nursery: trio.Nursery | None = None
        # Sources whose blocks stay in memory only (a mount table entry's `cache = "memory"`).
        self.memory_only: set[str] = set()

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the cache a nursery for background work (disk writes, prefetch)."""
        self._nursery = nursery

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        assert self._nursery is not None

        async def tracked() -> None:
            try:
                await fn(*args)
            finally:
                self._background -= 1
                if self._background == 0:
                    self._idle.set()

        if self._background == 0:
            self._idle = trio.Event()
        self._background += 1
        self._nursery.start_soon(tracked)

    async def flush(self) -> None:
        """Wait for background work, so blocks fetched before an unmount reach the disk."""
        await self._idle.wait()

    def _uses_disk(self, key: BlockKey) -> bool:
        return self.disk is not None and key.source not in self.memory_only

    def _disk_key(self, key: BlockKey) -> str:
        return entry_key(key.source, key.path, key.version, self.block_size, key.block)

    # --- reading -----------------------------------------------------------------------------

    async def read(self, key: BlockKey, fetch: Fetch, served: int | None = None) -> bytes:
        """The block's bytes, from the nearest tier that has them.

        `served` is how many of them the reader takes (for the bytes-served counters; default
        the whole block).
        """
        while True:
            data = self.memory.get(key)
            if data is not None:
                self.stats.memory_hits += 1
                self.stats.memory_bytes_served += len(data) if served is None else served
                if key in self._prefetched:
                    self._prefetched.discard(key)
                    self.stats.prefetch_used += 1
                return data
            flight = self._in_flight.get(key)
            if flight is None:
                self.stats.memory_misses += 1
                return await self._load(key, fetch, prefetch=False, served=served)
            self.stats.single_flight_waits += 1
            if flight.prefetch:
                self.stats.prefetch_used += 1
                flight.prefetch = False
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.data is not None:
                self._count_served(flight.tier, len(flight.data) if served is None else served)
                return flight.data
            # The fetching task was cancelled (its reader was interrupted): try again ourselves.

    async def read_part(self, key: BlockKey, start: int, length: int, fetch: Fetch) -> bytes:
        """Bytes [start, start+length) of a block, for random reads.

        From memory when the block is there; else only the chunks needed are read from the disk
        tier (a 4 KiB read costs a 64 KiB read, not 4 MiB); else the whole block is fetched
        and cached as usual.
        """
        if self.disk is not None and self._uses_disk(key) and not self.is_cached_or_coming(key):
            data = await self._disk_read(self.disk.get_range, self._disk_key(key), start, length)
            if data is not None:
                self.stats.memory_misses += 1
                self.stats.disk_bytes_served += len(data)
                return data
        block = await self.read(key, fetch, served=length)
        return block[start : start + length]

    def _count_served(self, tier: str, count: int) -> None:
        if tier == "disk":
            self.stats.disk_bytes_served += count
        else:
            self.stats.store_bytes_served += count

    def _evicted(self, key: object) -> None:
        if key in self._prefetched:  # loaded ahead, dropped before anyone read it
            self._prefetched.discard(key)
            self.stats.prefetch_wasted += 1

    async def _load(
        self, key: BlockKey, fetch: Fetch, prefetch: bool, served: int | None = None
    ) -> bytes:
        flight = _InFlight()
        flight.prefetch = prefetch
        self._in_flight[key] = flight
        try:
            data = await self._from_disk(key)
            fetched = data is None
            if data is None:
                data = await fetch()
                self.stats.misses += 1
                self.stats.bytes_from_store += len(data)
            else:
                flight.tier = "disk"
            if not prefetch:
                self._count_served(flight.tier, len(data) if served is None else served)
            self.memory.put(key, data)
            if flight.prefetch:  # loaded ahead and not yet asked for
                self._note_prefetched(key)
            flight.data = data
        except Exception as exc:
            flight.error = exc
            raise
        finally:
            flight.done.set()
            if self._in_flight.get(key) is flight:
                del self._in_flight[key]
        if fetched:
            await self._write_behind(key, data, wait=prefetch)
        return data

    async def _from_disk(self, key: BlockKey) -> bytes | None:
        if self.disk is None or not self._uses_disk(key):
            return None
        data = await self._disk_read(self.disk.get, self._disk_key(key))
        if data is None:
            self.stats.disk_misses += 1
        return data

    async def _disk_read(
        self, reader: Callable[..., tuple[bytes | None, bool]], *args: object
    ) -> bytes | None:
        """Run a disk tier read in a worker thread and count what it found."""
        data, corrupt = await trio.to_thread.run_sync(reader, *args, limiter=self.disk_limiter)
        if corrupt:
            self.stats.disk_corrupt += 1
        if data is not None:
            self.stats.disk_hits += 1
        return data

    async def _write_behind(self, key: BlockKey, data: bytes, wait: bool) -> None:
        """Store a fetched block on disk; a reader never waits for it, a prefetch may.

        Blocks waiting for the disk are memory the bound does not see, so their number is
        capped: a prefetch waits for a free slot (prefetching then runs at the disk's pace),
        a reader's block queues for one in the background.
        """
        if not self._uses_disk(key) or self._nursery is None:
            return
        if wait:
            await self._write_slots.acquire()
            self._spawn(self._store, key, data)
        else:
            self._spawn(self._store_when_free, key, data)

    async def _store_when_free(self, key: BlockKey, data: bytes) -> None:
        await self._write_slots.acquire()
        await self._store(key, data)

    async def _store(self, key: BlockKey, data: bytes) -> bool:
        """Write one block (its write slot already taken, and given back here)."""
        assert self.disk is not None
        try:
            stored = await trio.to_thread.run_sync(
                self.disk.put, self._disk_key(key), data, key.source, limiter=self.disk_limiter
            )
        finally:
            self._write_slots.release()
        if stored:
            self.stats.disk_writes += 1
        else:
            self.stats.disk_write_skips += 1
        return bool(stored)

    # --- prefetch and warmup -----------------------------------------------------------------

    def _note_prefetched(self, key: BlockKey) -> None:
        # Remembered only to count prefetch hits; bounded so blocks evicted unread are forgotten.
        if len(self._prefetched) > 4 * max(1, len(self.memory)):
            self._prefetched.clear()
        self._prefetched.add(key)

    def is_cached_or_coming(self, key: BlockKey) -> bool:
        return key in self.memory or key in self._in_flight

    def prefetch(self, key: BlockKey, fetch: Fetch, size: int) -> bool:
        """Start loading a block in the background; False when the global budget is spent."""
        if self._nursery is None or self.is_cached_or_coming(key):
            return True
        if self._prefetch_in_flight + size > self.prefetch_budget:
            self.stats.prefetch_skipped_budget += 1
            return False
        self._prefetch_in_flight += size
        self.stats.prefetch_issued += 1
        self._spawn(self._prefetch_one, key, fetch, size)
        return True

    async def _prefetch_one(self, key: BlockKey, fetch: Fetch, size: int) -> None:
        try:
            # A reader may have asked for the block between scheduling and now.
            if not self.is_cached_or_coming(key):
                await self._load(key, fetch, prefetch=True)
        except Exception as exc:  # the reader will fetch it again and see the error itself
            log.debug("prefetch of %s block %d failed: %s", key.path, key.block, exc)
        finally:
            self._prefetch_in_flight -= size

    async def fill(self, key: BlockKey, fetch: Fetch) -> str:
        """Make sure a block is on disk (warmup). Returns 'cached', 'fetched' or 'skipped'."""
        if self.disk is None:
            raise ValueError("the disk tier is disabled (--cache-dir none)")
        if not self._uses_disk(key):
            raise ValueError(f"{key.source} is cached in memory only")
        disk_key = self._disk_key(key)
        present = await trio.to_thread.run_sync(
            self.disk.__contains__, disk_key, limiter=self.disk_limiter
        )
        if present:
            return "cached"
        data = await fetch()
        self.stats.misses += 1
        self.stats.bytes_from_store += len(data)
        await self._write_slots.acquire()
        return "fetched" if await self._store(key, data) else "skipped"

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

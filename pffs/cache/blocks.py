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
from collections.abc import Awaitable, Callable, Sequence

import trio

from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey, Deliver, Fetch, FetchRun
from pffs.cache.memory import MemoryTier
from pffs.cache.stats import CacheStats
from pffs.config import CacheConfig

# BlockKey and Deliver live in pffs.cache.keys; they are re-exported here only until
# pffs/fs/reads.py imports them from there.
__all__ = ["BlockCache", "BlockKey", "Deliver"]

log = logging.getLogger("pffs.cache")


class _InFlight:
    """One fetch that several readers may wait on (single-flight)."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.prefetch = False
        self.tier = "store"  # where the bytes came from: "disk" or "store" (for metrics)


class _Run:
    """Blocks of one readahead window being prefetched: position -> (key, size, flight)."""

    def __init__(self, blocks: dict[int, tuple[BlockKey, int, _InFlight]], fetch: FetchRun) -> None:
        self.blocks = blocks
        self.fetch = fetch
        self.on_disk: set[int] = set()  # found in the disk tier: not asked of the store

    def spans(self, most: int) -> list[tuple[int, int]]:
        """(first, count) of consecutive positions not on disk, at most `most` long each."""
        spans: list[tuple[int, int]] = []
        for position in sorted(p for p in self.blocks if p not in self.on_disk):
            first, count = spans[-1] if spans else (-2, 0)
            if position == first + count and count < most:
                spans[-1] = (first, count + 1)
            else:
                spans.append((position, 1))
        return spans


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
        # Blocks a prefetch asks the store for in one request (stores that can stream them).
        self.run_blocks = max(1, config.fetch_size // config.block_size)
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

    @property
    def prefetch_in_flight(self) -> int:
        """Bytes of prefetched blocks asked for and not yet delivered (against the budget)."""
        return self._prefetch_in_flight

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
                return await self._load(key, fetch, served)
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

    async def _load(self, key: BlockKey, fetch: Fetch, served: int | None) -> bytes:
        """Load a block a reader asked for: from disk, else from the store."""
        flight = _InFlight()
        self._in_flight[key] = flight
        try:
            data = await self._from_disk(key)
            fetched = data is None
            if data is None:
                data = await fetch()
                self._count_fetched(data)
            self._count_served(
                "store" if fetched else "disk", len(data) if served is None else served
            )
            self._land(key, flight, data, "store" if fetched else "disk")
        except BaseException as exc:
            self._abandon(key, flight, exc if isinstance(exc, Exception) else None)
            raise
        if fetched:
            await self._write_behind(key, data, wait=False)
        return data

    def _count_fetched(self, data: bytes) -> None:
        self.stats.misses += 1
        self.stats.bytes_from_store += len(data)

    def _land(self, key: BlockKey, flight: _InFlight, data: bytes, tier: str) -> None:
        """A block arrived: into memory, and to everyone waiting on its flight."""
        self.memory.put(key, data)
        if flight.prefetch:  # loaded ahead and not yet asked for
            self._note_prefetched(key)
        flight.tier = tier
        flight.data = data
        self._settle(key, flight)

    def _abandon(self, key: BlockKey, flight: _InFlight, error: Exception | None) -> None:
        """A flight ends without data: waiters get the error, or (None) fetch it themselves."""
        flight.error = error
        self._settle(key, flight)

    def _settle(self, key: BlockKey, flight: _InFlight) -> None:
        flight.done.set()
        if self._in_flight.get(key) is flight:
            del self._in_flight[key]

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

    def prefetch(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        fetch_run: FetchRun,
        coalesce: bool = False,
        at_end: bool = True,
    ) -> int:
        """Start loading a reader's readahead window; returns how many blocks were started.

        `keys` are consecutive blocks of one object and `sizes` their lengths. Blocks not in
        memory or on their way are loaded in the background: from disk when they are there,
        else from the store through `fetch_run`: with `coalesce`, in runs of up to `run_blocks`
        consecutive blocks, one request per run. Fewer, larger requests cost the store and the
        client less per byte, so until the window's end (`at_end`) is reached, nothing is asked
        for before a run's worth of blocks is missing. The global prefetch budget bounds the
        bytes in flight.
        """
        if self._nursery is None:
            return 0
        run_blocks = self.run_blocks if coalesce else 1
        missing = [i for i, key in enumerate(keys) if not self.is_cached_or_coming(key)]
        if not missing or (len(missing) < min(run_blocks, len(keys)) and not at_end):
            return 0
        started: list[int] = []
        for position in missing:
            if self._prefetch_in_flight + sizes[position] > self.prefetch_budget:
                self.stats.prefetch_skipped_budget += 1
                break
            self._prefetch_in_flight += sizes[position]
            flight = _InFlight()  # registered now: a reader arriving first waits for it
            flight.prefetch = True
            self._in_flight[keys[position]] = flight
            started.append(position)
        self.stats.prefetch_issued += len(started)
        if started:
            run = _Run(
                {p: (keys[p], sizes[p], self._in_flight[keys[p]]) for p in started}, fetch_run
            )
            self._spawn(self._prefetch_run, run, run_blocks)
        return len(started)

    async def _prefetch_run(self, run: _Run, run_blocks: int) -> None:
        if self.disk is not None:
            try:
                await self._prefetch_from_disk(run)
            except BaseException:  # cancelled: what no task took over is given back
                self._release(run, [p for p in run.blocks if p not in run.on_disk])
                raise
        for first, count in run.spans(run_blocks):
            self._spawn(self._fetch_span, run, first, count)

    async def _prefetch_from_disk(self, run: _Run) -> None:
        """Start a disk read of each block of the run the disk tier holds (in parallel)."""
        assert self.disk is not None
        wanted = [p for p, (key, _, _) in run.blocks.items() if self._uses_disk(key)]
        if not wanted:
            return
        names = [self._disk_key(run.blocks[p][0]) for p in wanted]
        present = await trio.to_thread.run_sync(self.disk.present, names, limiter=self.disk_limiter)
        for position, here in zip(wanted, present, strict=True):
            if here:
                run.on_disk.add(position)
                self._spawn(self._prefetch_disk_block, run, position)
            else:
                self.stats.disk_misses += 1

    async def _prefetch_disk_block(self, run: _Run, position: int) -> None:
        key, _, flight = run.blocks[position]
        try:
            data = await self._from_disk(key)
        except BaseException:
            self._release(run, [position])
            raise
        if data is not None:
            self._land(key, flight, data, "disk")
            self._release(run, [position])
            return
        # Gone or damaged since it was seen: one block from the store instead.
        self._spawn(self._fetch_span, run, position, 1)

    async def _fetch_span(self, run: _Run, first: int, count: int) -> None:
        async def deliver(position: int, data: bytes) -> None:
            key, _, flight = run.blocks[position]
            self._count_fetched(data)
            self._land(key, flight, data, "store")
            self._release(run, [position])
            # Waiting for a write slot holds the fetch back: prefetch runs at the disk's pace.
            await self._write_behind(key, data, wait=True)

        try:
            await run.fetch(first, count, deliver)
        except Exception as exc:  # a reader will fetch the block itself and see the error
            log.debug("prefetch of %d blocks failed: %s", count, exc)
        finally:
            self._release(run, [p for p in range(first, first + count) if p in run.blocks])

    def _release(self, run: _Run, positions: Sequence[int]) -> None:
        """Give back the budget of blocks that are done; undelivered ones are abandoned."""
        for position in positions:
            key, size, flight = run.blocks.pop(position)
            self._prefetch_in_flight -= size
            if not flight.done.is_set():
                self._abandon(key, flight, None)

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

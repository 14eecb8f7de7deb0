"""BlockCache: blocks from the nearest tier that has them, each fetched from the store once.

A read looks in the memory tier, then joins the block's flight when one is under way, else
loads it itself: from the disk tier, else from the block source it was handed, and writes it
behind to disk. A random read takes only the bytes it asks for from the disk tier. The cache
composes the tiers (memory.py, disk.py through diskio.py), single-flight (singleflight.py), the
readahead engine (readahead_engine.py) and the background tasks they all start (`Background`,
below, in the nursery the cache is given); the threading rule they all follow is in
pffs/cache/__init__.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVarTuple

import trio

from pffs import retry
from pffs.cache.datasetroom import DatasetRoom
from pffs.cache.disk import DiskTier
from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey, BlockSource
from pffs.cache.memory import MemoryTier
from pffs.cache.readahead_engine import AheadUsage, ReadaheadEngine
from pffs.cache.singleflight import Flight, SingleFlight
from pffs.cache.stats import CacheStats
from pffs.cache.window import ReaderWindow, Windows
from pffs.config import CacheConfig
from pffs.errors import Corrupted
from pffs.flow.budget import AheadBudget

Ts = TypeVarTuple("Ts")


class Background:
    """The cache's background work: tasks started in the nursery it is given, and waiting for
    them (the `Tasks` its parts are handed: pffs.cache.keys).

    Disk writes behind a reader and readahead run here, so a read never waits for them; `idle`
    waits until none is left (before an unmount, so blocks fetched reach the disk). Without a
    nursery there is no background work: the cache then neither reads ahead nor writes behind."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._running = 0  # tasks started and not finished yet
        self._idle = trio.Event()
        self._idle.set()

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def attached(self) -> bool:
        return self._nursery is not None

    def spawn(self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        """Start `fn(*args)` in the nursery (one must be attached)."""
        assert self._nursery is not None

        async def tracked() -> None:
            try:
                await fn(*args)
            finally:
                self._running -= 1
                if self._running == 0:
                    self._idle.set()

        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        self._nursery.start_soon(tracked)

    async def idle(self) -> None:
        """Wait until no task started here is left."""
        await self._idle.wait()


class BlockCache:
    def __init__(
        self,
        config: CacheConfig,
        stats: CacheStats | None = None,
        *,
        memory_only: frozenset[str] = frozenset(),
    ) -> None:
        """`memory_only`: the sources whose blocks stay in memory, never written to disk (a
        mount table entry's `cache = "memory"`)."""
        self.config = config
        self.block_size = config.block_size
        self.stats = stats or CacheStats()
        # The mount's bytes held or loading ahead of readers, reserved out of the memory bound,
        # and the figures carved from it (pffs.flow.budget).
        self.ahead = AheadBudget(config)
        self._usage = AheadUsage(self.stats)
        self.memory = MemoryTier(self.ahead.memory_tier, self.stats, on_evict=self._usage.evicted)
        self.readahead_max = self.ahead.window_max(config.readahead_max)
        # Blocks a load ahead asks the store for in one request (stores that can stream them).
        self.run_blocks = max(1, config.fetch_size // config.block_size)
        # Sequential readers' windows and requests, by Little's law, sharing the budget.
        self.windows = Windows(
            self.ahead.total,
            self.readahead_max,
            self.ahead.largest_window,
            config.block_size,
            config.fetch_size,
        )
        self.disk = (
            DiskTier(config.disk_dir, config.disk_bytes, config.free_ratio, config.compress)
            if config.disk_dir
            else None
        )
        self._background = Background()
        self._flights = SingleFlight()
        # Datasets being consumed that do not fit keep a stable subset on disk (datasetroom.py).
        self.room = DatasetRoom(config.disk_bytes if self.disk is not None else 0)
        self._disk = DiskIO(
            self.disk,
            config.block_size,
            config.disk_threads,
            self.stats,
            self._background,
            memory_only=memory_only,
            # A random read of a compressed disk entry decompresses the whole block: keep it.
            keep_block=self.memory.put,
            admit=self.room.admit,
            write_room=self.ahead.write_room,
            on_written=self.memory.discard,
        )
        self._engine = ReadaheadEngine(
            self.ahead,
            self.run_blocks,
            self.memory,
            self._flights,
            self.is_cached_or_coming,
            self._disk,
            self._background,
            self.stats,
            self._usage,
        )
        self.memory_only = memory_only

    def gauges(self) -> dict[str, int]:
        """The cache's counters and gauges, as the metrics read them (any thread: reads only)."""
        values = self.stats.as_dict()
        values["memory_used_bytes"] = self.memory.used
        values["memory_capacity_bytes"] = self.memory.capacity
        values["memory_blocks"] = len(self.memory)
        values["ahead_in_flight_bytes"] = self.ahead.loading
        return values

    @property
    def flights(self) -> SingleFlight:
        """The blocks on their way to this cache (the one registry: pffs.cache.singleflight)."""
        return self._flights

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the cache a nursery for background work (disk writes, readahead)."""
        self._background.attach(nursery)

    async def flush(self) -> None:
        """Wait for background work, so blocks fetched before an unmount reach the disk."""
        await self._background.idle()

    # --- reading -----------------------------------------------------------------------------

    async def read(
        self, key: BlockKey, source: BlockSource, length: int, served: int | None = None
    ) -> bytes:
        """The block's `length` bytes, from the nearest tier that has them, else asked of
        `source` (the block source of the object the key names).

        `served` is how many of them the reader takes (for the bytes-served counters; default
        the whole block).
        """
        while True:
            data = self.memory.get(key)
            if data is not None:
                if len(data) != length:  # asked as another length (a peer's claim): not this
                    raise Corrupted(f"block {key.block} of {key.path}: {len(data)} bytes held")
                self.stats.memory_hits += 1
                self.stats.memory_bytes_served += len(data) if served is None else served
                self._usage.read(key)
                return data
            flight = self._flights.get(key)
            if flight is None:
                self.stats.memory_misses += 1
                return await self._load(key, source, length, served)
            self.stats.single_flight_waits += 1
            if flight.ahead:
                self.stats.readahead_used += 1
                flight.ahead = False
            data = await flight.outcome()
            if data is not None:
                self._count_served(flight.tier, len(data) if served is None else served)
                return data
            # The fetching task was cancelled (its reader was interrupted): try again ourselves.

    async def read_part(
        self,
        key: BlockKey,
        start: int,
        length: int,
        source: BlockSource,
        block_length: int,
        *,
        cold_start: bool = False,
        alone: bool = False,
    ) -> bytes | memoryview:
        """Bytes [start, start+length) of a block of `block_length` bytes, for random reads
        and first reads (of a block in memory, a view of it: no copy).

        From memory when the block is there; else only the chunks needed are read from the disk
        tier (a 4 KiB read costs a 64 KiB read, not 4 MiB); else, with `cold_start` (a reader
        wanting a small part of a block nobody holds), the block's flight is started (loaded
        in the background) and the reader's bytes are asked of `source`: where the flight
        streams (a cache group's mount) the source takes them from the flight's pieces once
        they came, one request for the block (pffs.store.fetching, pffs.group.sources), else
        it asks for them on their own (the reader waits one round trip, not the whole block's
        transfer); or with `alone` only the reader's bytes are asked for, the block left
        unloaded; else the whole block is fetched and cached as usual.
        """
        if not self.is_cached_or_coming(key):
            if self._disk.holds(key):
                data = await self._disk.get_range(key, start, length)
                if data is not None:
                    self.stats.memory_misses += 1
                    self.stats.disk_bytes_served += len(data)
                    return data
            if cold_start and (alone or self._start_cold(key, block_length, source)):
                data = await source.part(key.block * self.block_size + start, length)
                self.stats.memory_misses += 1
                self.stats.store_bytes_served += len(data)
                return data
        block = await self.read(key, source, block_length, served=length)
        return memoryview(block)[start : start + length]

    def part_reader(
        self, key: BlockKey, start: int, length: int
    ) -> Callable[[], bytes | memoryview | None] | None:
        """A function for a worker thread returning bytes [start, start+length) of a block this
        cache holds, or None when neither tier may hold it.

        For pushing cached bytes into the kernel's page cache (pffs.fs.pagecache): it never asks
        the store and counts nothing as served. The function touches bytes, or the disk tier's
        files (checksums verified; None when the entry is gone or damaged), never the cache's
        state, so it may run in any thread.
        """
        block = self.memory.get(key)
        if block is not None:
            view = memoryview(block)[start : start + length]
            return lambda: view
        disk = self.disk
        if disk is None or not self._disk.holds(key):
            return None
        name = self._disk.name(key)

        def read_disk() -> bytes | None:
            found = disk.get_range(name, start, length)
            if found.data is None or not found.whole:
                return found.data
            return found.data[start : start + length]  # a compressed entry, read whole

        return read_disk

    def _start_cold(self, key: BlockKey, size: int, source: BlockSource) -> bool:
        """Load a block no one holds in the background; False when it could not start (no
        background tasks, or the budget of bytes ahead is spent: the reader then loads it)."""
        if key in self._flights:  # arrived on its way while the disk was asked
            return False
        return self._engine.start([key], [size], source, coalesce=False, at_end=True) > 0

    def _count_served(self, tier: str, count: int) -> None:
        if tier == "disk":
            self.stats.disk_bytes_served += count
        else:
            self.stats.store_bytes_served += count

    def load_for_peer(self, key: BlockKey, source: BlockSource, length: int) -> Flight | None:
        """Start loading a block nobody holds for a cache group's peer, among the background
        tasks: its flight, registered now (the peer streams its pieces as they arrive), or None
        when there are no background tasks. Its reader's bound on retries starts now."""
        if not self._background.attached:
            return None
        flight = self._flights.start(key)
        self.stats.memory_misses += 1
        self._background.spawn(self._load_for_peer, key, flight, source, length)
        return flight

    async def _load_for_peer(
        self, key: BlockKey, flight: Flight, source: BlockSource, length: int
    ) -> None:
        with contextlib.suppress(Exception), retry.asking():  # its error ends the flight
            await self._fill(key, flight, source, length, None)

    async def _load(
        self, key: BlockKey, source: BlockSource, length: int, served: int | None
    ) -> bytes:
        """Load a block a reader asked for: from disk, else from its source."""
        return await self._fill(key, self._flights.start(key), source, length, served)

    async def _fill(
        self, key: BlockKey, flight: Flight, source: BlockSource, length: int, served: int | None
    ) -> bytes:
        """Load the block of `flight`: from disk, else from its source."""
        try:
            data = await self._disk.get(key)
            fetched = data is None
            if data is None:
                data = await source.part(key.block * self.block_size, length)
                self.stats.count_fetched(data)
            tier = "store" if fetched else "disk"
            self._count_served(tier, len(data) if served is None else served)
            self.memory.put(key, data)
            self._flights.land(key, flight, data, tier)
        except BaseException as exc:
            self._flights.abandon(key, flight, exc if isinstance(exc, Exception) else None)
            raise
        if fetched:
            self._disk.write_behind(key, data)
        return data

    def passed(self, key: BlockKey) -> None:
        """A sequential reader has read past the block (drop-behind): it leaves the memory tier
        once the disk tier holds it, now or when its write behind is done, so the heap reuses
        its memory for the blocks ahead rather than growing. A block never going to disk (no
        tier, a memory-only source, a write declined) stays. Another reader of it finds it on
        disk, or in the kernel's page cache."""
        if key in self.memory and self._disk.passed(key):
            self.memory.discard(key)

    def expect_reads(self) -> None:
        """Reads may follow soon (a name was looked up): the disk tier's key filter is brought
        up to date meanwhile, so the first read after a quiet while needs no index lookup."""
        self._disk.follow()

    async def held(self, key: BlockKey) -> bytes | None:
        """The block when a tier holds it now; never a fetch, never waiting on one (a cache
        group's previous owner answers with this: joining a fetch there could wait on the asker)."""
        data = self.memory.get(key)
        return data if data is not None else await self._disk.get(key)

    def is_cached_or_coming(self, key: BlockKey) -> bool:
        return key in self.memory or key in self._flights

    def may_hold(self, key: BlockKey) -> bool:
        """Whether a tier may hold the block, or it is on its way (False: a read of it asks the
        store)."""
        return self.is_cached_or_coming(key) or self._disk.may_hold(key)

    def background(self, fn: Callable[[], Awaitable[None]]) -> bool:
        """Run `fn()` among the cache's background tasks (an unmount waits for them); False
        when there are none (nothing started)."""
        if not self._background.attached:
            return False
        self._background.spawn(fn)
        return True

    # --- readahead and preload --------------------------------------------------------------

    def read_ahead(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        source: BlockSource,
        *,
        coalesce: bool = False,
        at_end: bool = True,
        window: ReaderWindow | None = None,
        landed: Callable[[], None] | None = None,
    ) -> int:
        """Start loading a reader's readahead window; returns how many blocks were started.

        `keys` are consecutive blocks of one object and `sizes` their lengths. Blocks not in
        memory or on their way are loaded in the background: from disk when they are there,
        else from `source` (the store, or a tier before it): with `coalesce`, in runs of up to
        `run_blocks` consecutive blocks, one request per run. Fewer, larger requests cost the
        store and the client less per byte, so until the window's end (`at_end`) is reached, nothing
        is asked for before a run's worth of blocks is missing. The mount's budget of bytes ahead
        (`ahead`, pffs.flow.budget) bounds the bytes in flight. With the reader's `window`, a run is
        at most its part, and the window is told how long each request took. `landed` is called
        after each block landed, its budget given back (a swept file asks for its next blocks:
        pffs.cache.sweeps).
        """
        return self._engine.start(
            keys, sizes, source, coalesce=coalesce, at_end=at_end, window=window, landed=landed
        )

    def load_soon(self, keys: Sequence[BlockKey], sizes: Sequence[int], source: BlockSource) -> int:
        """Start loading blocks a reader is about to ask for (a small file's one block, at its
        open), in the background like a readahead window but not counted as readahead; how
        many blocks were started."""
        return self._engine.start(keys, sizes, source, coalesce=False, at_end=True, counted=False)

    async def load(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        source: BlockSource,
        *,
        read_disk: bool,
        in_flight: int,
    ) -> int:
        """Load one object's blocks (`keys`, `sizes`) into the cache and wait for them.

        For the preload engine (pffs.cache.preload): blocks not cached or on their way get a
        flight readers join, are taken from the disk tier when it holds them, else fetched in
        runs of up to `run_blocks` blocks, one request of `source` each, as many at once as
        `in_flight` bytes hold; each lands in memory and is written behind to disk. Returns the
        bytes fetched from the store; a store error is raised (the blocks not loaded are given
        up, so a reader fetches them itself). Without `read_disk` (warmup), blocks the disk tier
        holds are only checked for, not read.
        """
        return await self._engine.load(
            keys, sizes, source, read_disk=read_disk, in_flight=in_flight
        )

    async def cached_bytes(self, keys: Sequence[BlockKey], sizes: Sequence[int]) -> int:
        """Bytes of these blocks the disk tier holds (one lookup for them all)."""
        if self.disk is None or not keys:
            return 0
        present = await self._disk.present(list(keys))
        return sum(size for size, here in zip(sizes, present, strict=True) if here)

    def disk_holds(self, source: str) -> bool:
        """Whether blocks of `source` go to the disk tier (it exists, and not memory only)."""
        return self.disk is not None and source not in self.memory_only

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

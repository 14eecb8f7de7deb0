"""The prefetch engine: readers' readahead windows loaded in the background, within a budget.

A window's blocks that are neither in memory nor on their way get a flight each at once (a
reader arriving first waits for it), as long as the global budget of prefetch bytes in flight
allows; the rest of the window is skipped. Then, in the background: blocks the disk tier holds
are read from it, in parallel; the others are asked of the store in runs of consecutive blocks,
one request per run (up to `run_blocks` blocks), and each is handed over as soon as it arrives:
into memory, to its waiters, and written behind. Before each request a prefetch waits until the
disk has taken what was handed to it before (DiskIO.wait_for_room), so it runs at the disk's
pace without ever holding up a request's stream. A block's budget comes back when it lands, or
when its flight is given up: the store failed (its reader will fetch it and see the error) or
the task was cancelled.

The engine also counts what prefetching was worth: blocks used by a reader, and blocks evicted
from memory before any reader asked for them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pffs.cache.background import Background
from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey, FetchRun
from pffs.cache.memory import MemoryTier
from pffs.cache.singleflight import Flight, SingleFlight
from pffs.cache.stats import CacheStats

log = logging.getLogger("pffs.cache")


class _Run:
    """Blocks of one readahead window being prefetched: position -> (key, size, flight)."""

    def __init__(self, blocks: dict[int, tuple[BlockKey, int, Flight]], fetch: FetchRun) -> None:
        self.blocks = blocks
        self.fetch = fetch
        self.on_disk: set[int] = set()  # found in the disk tier: not asked of the store

    def spans(self, most: int) -> list[tuple[int, int]]:
        """(first, count) of consecutive positions not on disk, at most `most` long each."""
        if len(self.blocks) == 1 and not self.on_disk:  # a small file: most runs are this
            return [(next(iter(self.blocks)), 1)]
        spans: list[tuple[int, int]] = []
        for position in sorted(p for p in self.blocks if p not in self.on_disk):
            first, count = spans[-1] if spans else (-2, 0)
            if position == first + count and count < most:
                spans[-1] = (first, count + 1)
            else:
                spans.append((position, 1))
        return spans


class Prefetcher:
    def __init__(
        self,
        budget: int,
        run_blocks: int,
        memory: MemoryTier,
        flights: SingleFlight,
        disk: DiskIO,
        background: Background,
        stats: CacheStats,
    ) -> None:
        self.budget = budget  # bytes of prefetched blocks in flight at most
        self.run_blocks = run_blocks  # blocks asked of the store in one request at most
        self.memory = memory
        self.flights = flights
        self.disk = disk
        self.background = background
        self.stats = stats
        self._in_flight = 0
        self._prefetched: set[BlockKey] = set()  # landed in memory, not yet read

    @property
    def in_flight(self) -> int:
        """Bytes of prefetched blocks asked for and not yet landed or given up."""
        return self._in_flight

    def start(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        fetch_run: FetchRun,
        coalesce: bool,
        at_end: bool,
    ) -> int:
        """Start loading a window; how many blocks were started (see BlockCache.prefetch)."""
        if not self.background.attached:
            return 0
        run_blocks = self.run_blocks if coalesce else 1
        missing = [i for i, key in enumerate(keys) if not self._cached_or_coming(key)]
        if not missing or (len(missing) < min(run_blocks, len(keys)) and not at_end):
            return 0
        started: list[int] = []
        for position in missing:
            if self._in_flight + sizes[position] > self.budget:
                self.stats.prefetch_skipped_budget += 1
                break
            self._in_flight += sizes[position]
            # Registered now: a reader arriving first waits for it.
            self.flights.start(keys[position], prefetch=True)
            started.append(position)
        self.stats.prefetch_issued += len(started)
        if started:
            blocks = {p: (keys[p], sizes[p], self._flight(keys[p])) for p in started}
            self.background.spawn(self._load, _Run(blocks, fetch_run), run_blocks)
        return len(started)

    def _cached_or_coming(self, key: BlockKey) -> bool:
        return key in self.memory or key in self.flights

    def _flight(self, key: BlockKey) -> Flight:
        flight = self.flights.get(key)
        assert flight is not None
        return flight

    # --- loading a window --------------------------------------------------------------------

    async def _load(self, run: _Run, run_blocks: int) -> None:
        if self.disk.tier is not None:
            try:
                await self._find_on_disk(run)
            except BaseException:  # cancelled: what no task took over is given back
                self._release(run, [p for p in run.blocks if p not in run.on_disk])
                raise
        spans = run.spans(run_blocks)
        if len(spans) == 1:  # fetched in this task: a task of its own costs a spawn per file
            await self._fetch_span(run, *spans[0])
            return
        for first, count in spans:
            self.background.spawn(self._fetch_span, run, first, count)

    async def _find_on_disk(self, run: _Run) -> None:
        """Start a disk read of each block of the run the disk tier holds (in parallel).

        A lone block is read at once (a miss then costs what asking costs, and a small file's
        block rides in a batch of reads); for several, the tier is asked which it holds first,
        so the missing ones are fetched from the store in runs.
        """
        wanted = [p for p, (key, _, _) in run.blocks.items() if self.disk.holds(key)]
        if not wanted:
            return
        if len(wanted) == 1:  # read here: this task has nothing else to do meanwhile
            run.on_disk.add(wanted[0])
            await self._disk_block(run, wanted[0])
            return
        present = await self.disk.present([run.blocks[p][0] for p in wanted])
        for position, here in zip(wanted, present, strict=True):
            if here:
                run.on_disk.add(position)
                self.background.spawn(self._disk_block, run, position)
            else:
                self.stats.disk_misses += 1

    async def _disk_block(self, run: _Run, position: int) -> None:
        key, size, flight = run.blocks[position]
        try:
            data = await self.disk.get(key, size)
        except BaseException:
            self._release(run, [position])
            raise
        if data is not None:
            self._land(key, flight, data, "disk")
            self._release(run, [position])
            return
        # Gone or damaged since it was seen: one block from the store instead.
        self.background.spawn(self._fetch_span, run, position, 1)

    async def _fetch_span(self, run: _Run, first: int, count: int) -> None:
        try:
            await self._fetch(run, first, count)
        except Exception as exc:  # a reader will fetch the block itself and see the error
            log.debug("prefetch of %d blocks failed: %s", count, exc)

    async def _fetch(self, run: _Run, first: int, count: int) -> int:
        """Blocks first..first+count-1 of a run from the store; the bytes fetched."""
        fetched = 0

        async def deliver(position: int, data: bytes) -> None:
            nonlocal fetched
            key, _, flight = run.blocks[position]
            self.stats.count_fetched(data)
            fetched += len(data)
            self._land(key, flight, data, "store")
            self._release(run, [position])
            self.disk.write_behind(key, data)

        try:
            await self.disk.wait_for_room()  # before the request: prefetch at the disk's pace
            await run.fetch(first, count, deliver)
        finally:
            self._release(run, [p for p in range(first, first + count) if p in run.blocks])
        return fetched

    # --- loading a whole file, awaited (the preload engine) -------------------------------------

    async def load(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        fetch_run: FetchRun,
        run_blocks: int,
        read_disk: bool = True,
    ) -> int:
        """Load every block of one object not cached or coming, and wait for them.

        Returns the bytes fetched from the store (0: all were cached, on disk or on their way).
        A store error is raised once the blocks not loaded are given up (their readers then
        fetch them and see the error themselves). The bytes count against the same budget
        gauge as readahead; the caller bounds them (see pffs.cache.preload).
        """
        missing = [i for i, key in enumerate(keys) if not self._cached_or_coming(key)]
        if not missing:
            return 0
        for position in missing:
            self._in_flight += sizes[position]
            self.flights.start(keys[position], prefetch=True)
        run = _Run({p: (keys[p], sizes[p], self._flight(keys[p])) for p in missing}, fetch_run)
        try:
            if self.disk.tier is not None:
                await self._take_from_disk(run, read_disk)
            fetched = 0
            for first, count in run.spans(run_blocks):
                fetched += await self._fetch(run, first, count)
            return fetched
        finally:  # an error or a cancellation: what is left is given back
            self._release(run, list(run.blocks))

    async def _take_from_disk(self, run: _Run, read: bool) -> None:
        """Land the blocks of the run the disk tier holds (one after another); without `read`,
        only give up their flights (they are there: nothing to fetch). A lone block to read is
        read at once, as in `_find_on_disk`."""
        wanted = [p for p, (key, _, _) in run.blocks.items() if self.disk.holds(key)]
        if not wanted:
            return
        if read and len(wanted) == 1:
            present = [True]
        else:
            present = await self.disk.present([run.blocks[p][0] for p in wanted])
        for position, here in zip(wanted, present, strict=True):
            if not here:
                self.stats.disk_misses += 1
                continue
            if not read:
                self._release(run, [position])
                continue
            key, size, flight = run.blocks[position]
            data = await self.disk.get(key, size)
            if data is not None:  # else gone or damaged since: fetched from the store
                self._land(key, flight, data, "disk")
                self._release(run, [position])

    def _land(self, key: BlockKey, flight: Flight, data: bytes, tier: str) -> None:
        """A block arrived: into memory, and to everyone waiting on its flight."""
        self.memory.put(key, data)
        if flight.prefetch:  # loaded ahead and not yet asked for
            self._note_prefetched(key)
        self.flights.land(key, flight, data, tier)

    def _release(self, run: _Run, positions: Sequence[int]) -> None:
        """Give back the budget of blocks that are done; undelivered ones are abandoned."""
        for position in positions:
            key, size, flight = run.blocks.pop(position)
            self._in_flight -= size
            if not flight.done.is_set():
                self.flights.abandon(key, flight, None)

    # --- what prefetching was worth ----------------------------------------------------------

    def _note_prefetched(self, key: BlockKey) -> None:
        # Remembered only to count prefetch hits; bounded so blocks evicted unread are forgotten.
        if len(self._prefetched) > 4 * max(1, len(self.memory)):
            self._prefetched.clear()
        self._prefetched.add(key)

    def read_from_memory(self, key: BlockKey) -> None:
        """A reader took the block from memory: count it as used if it was loaded ahead."""
        if key in self._prefetched:
            self._prefetched.discard(key)
            self.stats.prefetch_used += 1

    def evicted(self, key: object) -> None:
        """The memory tier dropped the block: wasted if it was loaded ahead and never read."""
        if key in self._prefetched:
            self._prefetched.discard(key)
            self.stats.prefetch_wasted += 1

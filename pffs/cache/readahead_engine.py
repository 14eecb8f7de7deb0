"""The readahead engine: blocks loaded ahead of their readers, in the background within a
budget (`start`: a reader's readahead window) or awaited (`load`: a whole file, for the preload
engine, pffs.cache.preload).

Blocks that are neither in memory nor on their way get a flight each at once (a reader arriving
first waits for it); of a window, only as many as the mount's budget of bytes ahead allows
(pffs.flow.budget), and the rest of the window is skipped. Then blocks the disk tier holds are read
from it, in parallel; the others are asked of the store in runs of consecutive blocks, one request
per run (up to `run_blocks` blocks; a window's runs at once, each in a task of its own; a whole
file's as many at once as the preload's bytes in flight hold), and each is
handed over as soon as it arrives: into memory, to its waiters, and written behind. Before each
request the engine waits until the disk has taken what was handed to it before
(DiskIO.wait_for_room), so it runs at the disk's pace without ever holding up a request's stream. A
block's budget comes back when it lands, or when its flight is given up: the store failed (its
reader will fetch it and see the error) or the task was cancelled.

The engine also counts what readahead was worth: blocks of windows used by a reader, and those
evicted from memory before any reader asked for them (preload counts its files itself). A
reader's own read (memory, then a flight, then disk, then the source) is BlockCache's
(pffs.cache.blocks); what a source does with a run is pffs.store.fetching's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey, BlockSource, Tasks
from pffs.cache.memory import MemoryTier
from pffs.cache.singleflight import Flight, SingleFlight
from pffs.cache.stats import CacheStats
from pffs.cache.window import ReaderWindow
from pffs.flow.budget import AheadBudget, Kind

log = logging.getLogger("pffs.cache")


class _Run:
    """Blocks of one object being loaded ahead: index in the object -> (key, size, flight)."""

    def __init__(
        self,
        blocks: dict[int, tuple[BlockKey, int, Flight]],
        source: BlockSource,
        kind: Kind,
        window: ReaderWindow | None = None,
        landed: Callable[[], None] | None = None,
    ) -> None:
        self.blocks = blocks
        self.source = source
        self.kind = kind  # whose bytes of the budget its blocks are
        self.window = window  # the reader's, told how long each request took
        self.landed = landed  # told after each of its blocks landed (its budget given back)

    def spans(self, most: int) -> list[tuple[int, int]]:
        """(first, count) of consecutive blocks left to load, at most `most` long each."""
        if len(self.blocks) == 1:  # a small file: most runs are this
            return [(next(iter(self.blocks)), 1)]
        spans: list[tuple[int, int]] = []
        for position in sorted(self.blocks):
            first, count = spans[-1] if spans else (-2, 0)
            if position == first + count and count < most:
                spans[-1] = (first, count + 1)
            else:
                spans.append((position, 1))
        return spans

    def take(self, first: int, count: int) -> _Run:
        """Blocks first..first+count-1 (a span of this run) as a run of their own."""
        taken = {p: self.blocks.pop(p) for p in range(first, first + count)}
        return _Run(taken, self.source, self.kind, self.window, self.landed)


class AheadUsage:
    """What loading ahead was worth: blocks loaded ahead into memory are counted used when a
    reader takes one, wasted when the memory tier evicts one unread."""

    def __init__(self, stats: CacheStats) -> None:
        self.stats = stats
        self._unread: set[object] = set()  # loaded ahead into memory, not yet read

    def loaded(self, key: BlockKey, in_memory: int) -> None:
        """A block loaded ahead landed in memory (which holds `in_memory` blocks)."""
        # Remembered only to count the blocks loaded ahead that are used; bounded, so blocks
        # evicted unread are forgotten.
        if len(self._unread) > 4 * max(1, in_memory):
            self._unread.clear()
        self._unread.add(key)

    def read(self, key: BlockKey) -> None:
        """A reader took the block from memory: count it as used if it was loaded ahead."""
        if key in self._unread:
            self._unread.discard(key)
            self.stats.readahead_used += 1

    def evicted(self, key: object) -> None:
        """The memory tier dropped the block: wasted if it was loaded ahead and never read."""
        if key in self._unread:
            self._unread.discard(key)
            self.stats.readahead_wasted += 1


class ReadaheadEngine:
    def __init__(
        self,
        budget: AheadBudget,
        run_blocks: int,
        memory: MemoryTier,
        flights: SingleFlight,
        cached_or_coming: Callable[[BlockKey], bool],
        disk: DiskIO,
        background: Tasks,
        stats: CacheStats,
        usage: AheadUsage,
    ) -> None:
        self.budget = budget  # the mount's bytes ahead: readahead's and preload's blocks count
        self.run_blocks = run_blocks  # blocks asked of the store in one request at most
        self.memory = memory
        self.flights = flights
        self.cached_or_coming = cached_or_coming  # BlockCache.is_cached_or_coming
        self.disk = disk
        self.background = background
        self.stats = stats
        self.usage = usage

    def start(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        source: BlockSource,
        *,
        coalesce: bool,
        at_end: bool,
        window: ReaderWindow | None = None,
        counted: bool = True,
        landed: Callable[[], None] | None = None,
    ) -> int:
        """Start loading a window in the background, within the budget; how many blocks were
        started (see BlockCache.read_ahead). Unless `counted`, its blocks are not readahead's
        (a small file's GET at open: its reader surely wants them). `landed` is called after
        each of its blocks landed, its bytes of the budget given back (not after a failure:
        what asks again on it would ask again and again)."""
        if not self.background.attached:
            return 0
        run_blocks = 1
        if coalesce:
            run_blocks = self.run_blocks if window is None else min(self.run_blocks, window.part)
        missing = [i for i, key in enumerate(keys) if not self.cached_or_coming(key)]
        if not missing or (len(missing) < min(run_blocks, len(keys)) and not at_end):
            return 0
        run = self._claim(keys, sizes, missing, source, "readahead", ahead=counted)
        run.window = window
        run.landed = landed
        if counted:
            self.stats.readahead_issued += len(run.blocks)
        if run.blocks:
            self.background.spawn(self._load_quietly, run, run_blocks)
        return len(run.blocks)

    async def load(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        source: BlockSource,
        *,
        read_disk: bool,
        in_flight: int,
    ) -> int:
        """Load every block of one object not cached or coming, and wait for them.

        Returns the bytes fetched from the store (0: all were cached, on disk or on their way).
        A store error is raised once the blocks not loaded are given up (their readers then
        fetch them and see the error themselves). The bytes count in the same budget as
        readahead's; the caller checked they fit when the file started (pffs.cache.preload).
        A file of several runs has them asked at once, as many as `in_flight` bytes hold (one
        at least).
        """
        missing = [i for i, key in enumerate(keys) if not self.cached_or_coming(key)]
        if not missing:
            return 0
        run = self._claim(keys, sizes, missing, source, "preload")
        # In series each run would wait a round trip and the run before it (a scan opening a
        # 36 MiB file mid-preload waited on three in turn).
        at_once = max(1, in_flight // (self.run_blocks * sizes[0]))
        return await self._load(run, self.run_blocks, read_disk=read_disk, at_once=at_once)

    def _claim(
        self,
        keys: Sequence[BlockKey],
        sizes: Sequence[int],
        missing: Sequence[int],
        source: BlockSource,
        kind: Kind,
        *,
        ahead: bool | None = None,
    ) -> _Run:
        """Register a flight for each missing position (a reader arriving first waits for it)
        and count its bytes in the budget as `kind`'s: readahead's only while they fit, a
        preload's all (checked when its file started). `ahead` (default: readahead's): its
        flights count as readahead used or wasted."""
        blocks: dict[int, tuple[BlockKey, int, Flight]] = {}
        for position in missing:
            size = sizes[position]
            if kind == "preload":
                self.budget.add(kind, size)
            elif not self.budget.take(kind, size):
                self.stats.readahead_skipped_budget += 1
                break
            # Only a window's blocks count as readahead used or wasted (preload counts files).
            flight = self.flights.start(
                keys[position], ahead=kind == "readahead" if ahead is None else ahead
            )
            blocks[keys[position].block] = (keys[position], size, flight)
        return _Run(blocks, source, kind)

    # --- loading a run -----------------------------------------------------------------------

    async def _load_quietly(self, run: _Run, run_blocks: int) -> None:
        count = len(run.blocks)
        try:
            await self._load(run, run_blocks, read_disk=True, at_once=None)
        except Exception as exc:  # a reader will fetch the block itself and see the error
            log.debug("loading %d blocks ahead failed: %s", count, exc)

    async def _fetch_quietly(self, run: _Run, first: int, count: int) -> None:
        """A span of a window in a task of its own (see `_load`)."""
        try:
            await self._fetch(run, first, count)
        except Exception as exc:  # a reader will fetch the block itself and see the error
            log.debug("loading %d blocks ahead failed: %s", count, exc)
        finally:
            self._release(run, list(run.blocks))

    async def _load(
        self, run: _Run, run_blocks: int, *, read_disk: bool, at_once: int | None
    ) -> int:
        """Load a run's blocks: those the disk tier holds from it, the others from the store in
        spans of up to `run_blocks` blocks, one request each. Without `at_once` (readahead),
        several spans are fetched at once in tasks of their own (whose errors only their readers
        see); with it (a preload's file), they are awaited, `at_once` at a time, and an error
        is raised. Returns the bytes fetched by this task; what is left at an error or a
        cancellation is given back."""
        try:
            if self.disk.tier is not None:
                await self._from_disk(run, read_disk)
            spans = run.spans(run_blocks)
            if len(spans) == 1:  # one span (the usual case) costs no task of its own
                return await self._fetch(run, *spans[0])
            if at_once is None:
                for first, count in spans:
                    self.background.spawn(self._fetch_quietly, run.take(first, count), first, count)
                return 0
            limiter = trio.CapacityLimiter(at_once)
            fetched: list[int] = []
            failed: list[Exception] = []

            async def fetch(first: int, count: int) -> None:
                async with limiter:
                    try:
                        fetched.append(await self._fetch(run, first, count))
                    except Exception as exc:  # raised as itself below, not in a group
                        failed.append(exc)

            async with trio.open_nursery() as nursery:
                for first, count in spans:
                    nursery.start_soon(fetch, first, count)
            if failed:
                raise failed[0]
            return sum(fetched)
        finally:
            self._release(run, list(run.blocks))

    async def _from_disk(self, run: _Run, read: bool) -> None:
        """Land the blocks of the run the disk tier holds (several read at once); without
        `read`, only give up their flights (they are there: nothing to fetch). Blocks gone or
        damaged since are left to the store.

        A lone block is read at once (a miss then costs what asking costs, and a small file's
        block rides in a batch of reads); for several, the tier is asked which it holds first,
        so the missing ones are fetched from the store in runs.
        """
        wanted = [p for p, (key, _, _) in run.blocks.items() if self.disk.holds(key)]
        if not wanted:
            return
        if read and len(wanted) == 1:
            await self._disk_block(run, wanted[0])
            return
        present = await self.disk.present([run.blocks[p][0] for p in wanted])
        here = [p for p, there in zip(wanted, present, strict=True) if there]
        self.stats.disk_misses += len(wanted) - len(here)
        if not read:
            self._release(run, here)
            return
        async with trio.open_nursery() as nursery:
            for position in here:
                nursery.start_soon(self._disk_block, run, position)

    async def _disk_block(self, run: _Run, position: int) -> None:
        key, size, flight = run.blocks[position]
        data = await self.disk.get(key, size)
        if data is not None:  # else gone or damaged since it was seen: left to the store
            self._land(key, flight, data, "disk")
            self._release(run, [position])
            if run.landed is not None:
                run.landed()

    async def _fetch(self, run: _Run, first: int, count: int) -> int:
        """Blocks first..first+count-1 of a run from the store; the bytes fetched."""
        fetched = 0

        await self.disk.wait_for_room()  # before the request: load at the disk's pace
        asked = trio.current_time()
        async with run.source.run(first, count) as landing:
            async for index, data in landing:
                key, _, flight = run.blocks[index]
                self.stats.count_fetched(data)
                fetched += len(data)
                self._land(key, flight, data, "store")
                self._release(run, [index])
                self.disk.write_behind(key, data)
                if run.landed is not None:
                    run.landed()
        if run.window is not None:
            run.window.fetched(trio.current_time() - asked)
        return fetched

    def _land(self, key: BlockKey, flight: Flight, data: bytes, tier: str) -> None:
        """A block arrived: into memory, and to everyone waiting on its flight."""
        self.memory.put(key, data)
        if flight.ahead:  # loaded ahead and not yet asked for
            self.usage.loaded(key, len(self.memory))
        self.flights.land(key, flight, data, tier)

    def _release(self, run: _Run, positions: Sequence[int]) -> None:
        """Give back the budget of blocks that are done; undelivered ones are abandoned."""
        for position in positions:
            key, size, flight = run.blocks.pop(position)
            self.budget.give_back(run.kind, size)
            if not flight.done.is_set():
                self.flights.abandon(key, flight, None)

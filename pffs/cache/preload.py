"""The preload engine: whole files loaded into the cache in the background, ahead of readers.

Path-free like the rest of the cache. Callers (dataset detection, a job's order list, warmup)
hand it jobs, each the receiving end of a bounded channel of items (`job_channel`) that the
caller's own task fills as it lists (the cache never lists a store); an item is one file: its
block keys and sizes and the block source that gives a run of its blocks (as readahead runs are
fetched). Items are taken from a job only when the bounds let one start, so a job over a
million files holds a channel's worth at a time, and its sender waits.
Each item is loaded through `BlockCache.load`: flights a reader joins, the memory tier, and the
disk tier through the cache's write-behind.

Bounds, all from the mount's budget of bytes ahead (pffs.flow.budget, `BlockCache.ahead`): items
in flight <= the concurrency; bytes in flight <= the budget given (preload's share of it), and
with readahead's within the mount's budget (the memory it reserves for blocks in flight); bytes
loaded and not yet used by a reader <= its `unread_max`, so loading ahead never pushes out what
it loaded before the readers get to it. One item at least is always allowed, however large (a
file larger than the budget is loaded alone). Files the cache would not keep (outside the stable
subset of a dataset larger than the cache, `BlockCache.room`) are passed over.

How many requests reach the store is not the engine's to decide: each item's requests take
permits of its source's flow (pffs.flow.permits: halved when the store throttles, readahead
served first). The engine's `concurrency`, the files it works on at once, is what its caller
reads off the flows (the permits preload or warmup may hold now), so the files it starts find
permits and none waits in the flow's queue: a file still queued here is left to a reader who
opens it, where one waiting for a permit would keep its reader waiting behind the preload. A
failed item is dropped (debug log, counter): its reader fetches the file itself and sees exactly
what it would without preload.

Priority: the engine has none to give readers, because it never serves them. A reader's open of
a file still queued here tells the engine (`used`), which then never loads it; the reader's
reads fetch it themselves, at once (a first GET at the open, first in the source's flow as
readahead; a cold read's own request, with a reader's permit: pffs.fs.reads), and a file the
engine is loading already is joined through its blocks' flights. So a file a reader asks for is
always ahead of this queue, and moving it to the queue's front would only load it twice. Jobs
end when their channel ends, when cancelled, or when no reader has touched them for `idle_after`
seconds. A job may be held (`hold`): its caller sees its files read by ranges, not whole, so
loading them whole would fetch what no reader wants; nothing is taken from it until released.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey, BlockSource

log = logging.getLogger("pffs.cache")

# Files opened while no job runs, remembered so a job starting soon leaves them to their readers.
OPENS_KEPT_WITHOUT_JOBS = 4096
# Items a job's channel holds before its sender waits for the engine to take one.
ITEMS_QUEUED = 256


@dataclass(frozen=True, eq=False)
class PreloadItem:
    """One file to load: `ident` names it for `used` (the same file, the same ident), `keys`
    and `sizes` its blocks, `source` gives them."""

    ident: Hashable
    keys: Sequence[BlockKey]
    sizes: Sequence[int]
    source: BlockSource

    @property
    def size(self) -> int:
        return sum(self.sizes)


@dataclass
class PreloadStats:
    """Counters of the engine (pffs.metrics reads them as `pffs_preload_files_*`)."""

    files_queued: int = 0  # items taken from a job to be loaded
    files_fetched: int = 0  # loaded, with at least one block from the store
    files_cached: int = 0  # nothing to load: every block was cached or on its way
    files_failed: int = 0
    bytes_fetched: int = 0
    files_used: int = 0  # loaded ahead, then opened by a reader
    files_wasted: int = 0  # loaded ahead, and the job ended before a reader opened it

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# Told of each item of a job when it is done: the bytes fetched from the store, or the error.
Report = Callable[[PreloadItem, "int | Exception"], None]
Items = trio.MemoryReceiveChannel[PreloadItem]


def job_channel() -> tuple[trio.MemorySendChannel[PreloadItem], Items]:
    """A job's channel: the caller sends items as it lists them, the engine receives them
    (`Preloader.add`). The sender closes it after the last item; a job the engine ends closes
    the receiving end, and the sender's next send raises `trio.BrokenResourceError`."""
    return trio.open_memory_channel[PreloadItem](ITEMS_QUEUED)


@dataclass(eq=False)
class _Job:
    name: Hashable
    items: Items
    touched: float
    report: Report | None = None
    # Loads wait for readers (dataset preload); a fill of the disk tier (warmup) does not.
    for_readers: bool = True
    loaded: set[Hashable] = field(default_factory=set)  # loaded, not yet used by a reader
    # Its channel ended; it stays (its loads counted as unread) until its readers go idle.
    exhausted: bool = False
    # Held by its caller (`Preloader.hold`): nothing is taken from it meanwhile.
    held: bool = False


class Preloader:
    def __init__(
        self,
        cache: BlockCache,
        budget: int,
        *,
        concurrency: int | Callable[[], int] = 64,
        idle_after: float = 30.0,
        unread_max: int | None = None,
    ) -> None:
        self.cache = cache
        self.budget = budget  # bytes in flight at most
        # Bytes loaded ahead and not yet read, at most (not the cache's `room`, the datasets').
        self.unread_max = cache.ahead.unread_max if unread_max is None else unread_max
        # Files at once: a number, or a function asked before each file starts.
        self._concurrency = concurrency
        self.idle_after = idle_after
        self.stats = PreloadStats()
        self.files_in_flight = 0
        self.bytes_in_flight = 0
        self._unread: dict[Hashable, int] = {}  # loaded ahead, not yet used: ident -> bytes
        self._unread_bytes = 0  # their sum, kept (the dispatcher asks before every item)
        self._handled: set[Hashable] = set()  # loaded, being loaded or taken by a reader
        self._loading: set[Hashable] = set()  # being loaded, no reader has opened it yet
        self._jobs: deque[_Job] = deque()
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    # --- what callers use --------------------------------------------------------------------

    def gauges(self) -> dict[str, int]:
        """The engine's counters and gauges, as the metrics read them (any thread: reads only)."""
        values = {f"preload_{k}": v for k, v in self.stats.as_dict().items()}
        values["preload_files_in_flight"] = self.files_in_flight
        values["preload_bytes_in_flight"] = self.bytes_in_flight
        return values

    def attach(self, nursery: trio.Nursery) -> None:
        """Start the engine's dispatcher in `nursery` (cancelling it stops the engine)."""
        self._nursery = nursery
        nursery.start_soon(self._dispatch)
        nursery.start_soon(self._tick)

    @property
    def concurrency(self) -> int:
        """Files the engine may work on at once now."""
        concurrency = self._concurrency
        return concurrency if isinstance(concurrency, int) else concurrency()

    @property
    def unread_bytes(self) -> int:
        return self._unread_bytes

    def add(
        self,
        name: Hashable,
        items: Items,
        *,
        report: Report | None = None,
        for_readers: bool = True,
        held: bool = False,
    ) -> None:
        """Queue a job: its items (from `job_channel`) are loaded in their order, after earlier
        jobs' items.

        `report` is told of each item done. Without `for_readers` (warmup filling the disk
        tier), what is loaded does not count against the bound on unread files, and blocks the
        disk tier holds are not read back. `held`: it starts held (see `hold`).
        """
        job = _Job(name, items, trio.current_time(), report, for_readers, held=held)
        self._jobs.append(job)
        self._wake()

    def hold(self, name: Hashable, held: bool) -> None:
        """Hold job `name` (take nothing from it, its loads under way finish) or release it."""
        for job in self._jobs:
            if job.name == name and job.held != held:
                job.held = held
                self._wake()

    def has_job(self, name: Hashable) -> bool:
        return any(job.name == name for job in self._jobs)

    def touch(self, name: Hashable) -> None:
        """A reader is at work in job `name`: it stays alive `idle_after` seconds more."""
        for job in self._jobs:
            if job.name == name:
                job.touched = trio.current_time()

    def cancel(self, name: Hashable) -> None:
        """End job `name` (its loads under way finish; nothing more is taken from it)."""
        for job in [j for j in self._jobs if j.name == name]:
            self._end(job)
        self._wake()

    def used(self, ident: Hashable) -> None:
        """A reader opened the file: what it loaded ahead is used; if not loaded, never load it
        (the reader fetches it itself)."""
        if self._take_unread(ident) or ident in self._loading:
            self.stats.files_used += 1
            self._loading.discard(ident)
            self._wake()
        if not self._jobs and len(self._handled) >= OPENS_KEPT_WITHOUT_JOBS:
            self._handled.clear()  # bounded while no job clears it (see _end)
        self._handled.add(ident)

    def idle(self) -> bool:
        """Whether nothing is queued or loading (a held job's files wait for its release)."""
        streaming = any(not job.exhausted and not job.held for job in self._jobs)
        return not streaming and self.files_in_flight == 0

    async def wait_idle(self) -> None:
        """Wait until every job's channel has ended and every load has finished."""
        while not self.idle():
            await self._wait_change()

    # --- the dispatcher ----------------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        # Woken by any change, and by `_tick` at least once a second to end idle jobs (one
        # task's sleep, not a cancel scope around every wait: the dispatcher waits per file).
        await self._changed.wait()

    async def _tick(self) -> None:
        while True:
            await trio.sleep(1.0)
            self._wake()

    async def _dispatch(self) -> None:
        assert self._nursery is not None
        while True:
            item, job = await self._next()
            if not await self._wait_for_unread_bound(item, job):
                continue
            self._handled.add(item.ident)
            self._loading.add(item.ident)
            self.stats.files_queued += 1
            self.files_in_flight += 1
            self.bytes_in_flight += item.size
            self._nursery.start_soon(self._load, item, job)

    async def _wait_for_unread_bound(self, item: PreloadItem, job: _Job) -> bool:
        """Wait until `item` may start (True), or until its job ended (False: it is dropped)."""
        while True:
            self._end_idle_jobs()  # readers that went away give back what they held unread
            if job not in self._jobs:
                return False
            if self._fits_unread(item):
                return True
            await self._wait_change()

    def _fits_unread(self, item: PreloadItem) -> bool:
        if self.files_in_flight == 0:
            return self.unread_bytes < self.unread_max  # one item at least, however large
        return (
            self.files_in_flight < self.concurrency
            and self.bytes_in_flight + item.size <= self.budget
            and self.unread_bytes + self.bytes_in_flight + item.size <= self.unread_max
            # The mount's budget of bytes ahead, shared with readers' readahead, goes first.
            and self.cache.ahead.fits("preload", item.size)
        )

    async def _next(self) -> tuple[PreloadItem, _Job]:
        """The next item to load: the oldest live job's next one."""
        while True:
            self._end_idle_jobs()
            streaming = [job for job in self._jobs if not job.exhausted and not job.held]
            if not streaming:
                await self._wait_change()
                continue
            job = streaming[0]
            try:
                item = await job.items.receive()
            except trio.EndOfChannel:  # its sender is done (a listing that failed, too)
                job.exhausted = True
                self._wake()
                continue
            except trio.ClosedResourceError:  # the job ended while this waited
                continue
            # A file the cache would not keep (outside the stable subset of a dataset larger
            # than the cache: datasetroom.py) would be fetched only to be dropped.
            if item.ident not in self._handled and self.cache.room.keeps(item.keys[0]):
                return item, job

    def _end_idle_jobs(self) -> None:
        now = trio.current_time()
        for job in [j for j in self._jobs if now - j.touched > self.idle_after]:
            log.debug("preload job %s ended: no reader for %.0f s", job.name, self.idle_after)
            self._end(job)

    def _end(self, job: _Job) -> None:
        """A job ends (cancelled, or idle): what it loaded and no reader
        used is wasted, and its bytes leave the unread bound."""
        if job in self._jobs:
            self._jobs.remove(job)
        job.items.close()  # its sender stops at its next send
        for ident in job.loaded:
            if self._take_unread(ident):
                self.stats.files_wasted += 1
        job.loaded.clear()
        if not self._jobs:
            self._handled.clear()  # bounded: forgotten once no job is left

    # --- one item ----------------------------------------------------------------------------

    async def _load(self, item: PreloadItem, job: _Job) -> None:
        for_readers = job.for_readers
        try:
            fetched = await self.cache.load(
                item.keys, item.sizes, item.source, read_disk=for_readers, in_flight=self.budget
            )
        except Exception as exc:
            self._failed(item, exc, job)
        else:
            if job.report is not None:
                job.report(item, fetched)
            if fetched:
                self.stats.files_fetched += 1
                self.stats.bytes_fetched += fetched
            else:
                self.stats.files_cached += 1
            if fetched and for_readers and item.ident in self._loading:  # not opened yet
                self._unread[item.ident] = item.size
                self._unread_bytes += item.size
                job.loaded.add(item.ident)
        finally:
            self._loading.discard(item.ident)
            self.files_in_flight -= 1
            self.bytes_in_flight -= item.size
            self._wake()

    def _take_unread(self, ident: Hashable) -> bool:
        size = self._unread.pop(ident, None)
        if size is None:
            return False
        self._unread_bytes -= size
        return True

    def _failed(self, item: PreloadItem, exc: Exception, job: _Job) -> None:
        self.stats.files_failed += 1
        log.debug("preload of %s failed: %s", item.ident, exc)
        if job.report is not None:
            job.report(item, exc)

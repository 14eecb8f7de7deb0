"""The disk tier as trio tasks use it: every call in a worker thread, counted, written behind.

DiskTier (disk.py) blocks; here each of its calls runs in a worker thread
(`pffs.workers.run_blocking`) under one limiter (`disk_threads` at once), and what it found is
counted in CacheStats. The one exception is a random read the tier can serve without waiting (an
open entry, its chunks in the page cache): it is tried first, in the trio task, since a thread
hop costs more CPU than the read. A block fetched from the store is written behind: it queues
for a write slot in the background, and a load ahead waits for the disk's backlog before its
request (`wait_for_room`: loading ahead then runs at the disk's pace). The slots, with the
budget of bytes loaded ahead, cap the blocks waiting for the disk, memory the memory tier's bound
does not see. Queued blocks are written in batches by at most two writer tasks: one worker-thread
hop and one index transaction per batch (DiskTier.put_batch), not per block; a writer finding
less than a batch waits a few milliseconds for more.

Whole-block reads are batched the same way: a read queues its key, and a reader task takes
what is queued (up to `_READ_BATCH_BLOCKS` blocks or `_READ_BATCH_BYTES`) into one
worker-thread hop and one index lookup (DiskTier.get_many, which also has the kernel read the
batch's entries ahead together). Reads arriving together (the preload engine's files, the
opens of a data loader's workers) then share a hop and a SELECT instead of paying one each; a
large block is a batch of its own, and a reader task starts beside the busy ones (up to
`disk_threads`) while a whole batch is queued, so large blocks are still read several at once.

A random read of a compressed entry gets the whole block from the tier; it is handed to
`keep_block` (the block cache puts it in the memory tier), so the next reads of that block do
not decompress it again.

Whether a block has an entry is first asked of a filter of the tier's keys held here
(diskkeys.py): a block it knows is absent, as every block of a cold read is, costs no thread
hop. The filter is read from the index again every second while blocks are looked up, since
other processes (mounts, `pffs warmup`) sharing the directory write to it too.

Drop-behind: a block a sequential reader has passed leaves the memory tier once its entry is
written (`passed`): at once when the tier holds it already, else when its write-behind batch
is written (`on_written` is told). Blocks whose write is pending are tracked here until their
batch is written, skipped or failed, so the set is bounded by the write slots.

Blocks of the sources in `memory_only` (a mount table entry's `cache = "memory"`) are never
looked up or written here; without a tier (`--cache-dir none`) no block is.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVarTuple

import trio

from pffs.cache.disk import MISS, DiskRead, DiskTier, entry_key
from pffs.cache.diskkeys import DiskKeys, keys_after, load_keys
from pffs.cache.keys import BlockKey, Tasks
from pffs.cache.stats import CacheStats
from pffs.workers import run_blocking

Ts = TypeVarTuple("Ts")
log = logging.getLogger("pffs.cache")

# A write-behind batch: up to this many blocks or bytes, whichever comes first, in one worker
# thread hop and one index transaction: paid per block, a hop and a transaction's BEGIN/COMMIT
# would be most of the CPU of a 100 KiB block's write.
_BATCH_BLOCKS = 16
_BATCH_BYTES = 32 * 1024 * 1024
# How long a writer waits for a batch to fill before writing what it has: long enough for the
# large blocks of a fast cold read to fill a batch (a shorter wait wrote them one per batch,
# each paying a hop, an index transaction and a statvfs); a full batch never waits, and the
# write slots bound what is held meanwhile (docs/notes/cost-of-a-byte.md).
_LINGER = 0.1
# Writers at once: two, so that one batch's index transaction or fsync-free O_DIRECT write
# overlaps the other's, and a large block never holds the whole queue behind it alone.
_WRITERS = 2
# How often the key filter reads the rows other processes added to the index: a block another
# process cached is fetched from the store for at most about this long (one thread hop and an
# indexed SQLite read per period, against the hop per block the filter saves).
_FOLLOW_PERIOD = 1.0
# A batch of whole-block reads: up to this many blocks or bytes (a block of unknown size counts
# as a whole block), whichever comes first: 16 training files of 100 KiB share a hop, a 4 MiB
# block is read alone, so warm sequential reads keep several blocks in flight.
_READ_BATCH_BLOCKS = 16
_READ_BATCH_BYTES = 2 * 1024 * 1024
# Before taking a batch short of full, a reader task yields this many times: the tasks its
# last batch woke land their blocks and start the next loads (a preload item landing frees
# the room for the next one a few scheduler passes later), whose reads then join this batch.
# Each pass costs microseconds, and nothing when no other task is runnable.
_READ_GATHER = 4


@dataclass(eq=False)
class _QueuedRead:
    """A whole-block read waiting for a batch: its entry key, its size, and what was found."""

    name: str
    size: int
    done: trio.Event = field(default_factory=trio.Event)
    found: DiskRead = MISS


class DiskIO:
    def __init__(
        self,
        tier: DiskTier | None,
        block_size: int,
        threads: int,
        stats: CacheStats,
        background: Tasks,
        *,
        memory_only: frozenset[str] = frozenset(),
        keep_block: Callable[[BlockKey, bytes], None] | None = None,
        admit: Callable[[BlockKey, int], bool] | None = None,
        write_room: int = 0,
        on_written: Callable[[BlockKey], None] | None = None,
    ) -> None:
        """`memory_only`: sources whose blocks never come here; `keep_block`: where a whole
        block read for a part of it goes (the memory tier), if anywhere; `admit`: whether a
        fetched block may be written (a dataset's stable subset: datasetroom.py);
        `write_room`: bytes of whole blocks that may wait for the disk at once (two budgets of
        bytes loaded ahead: pffs.flow.budget), when that is more blocks than two per thread;
        `on_written`: told of each block `passed` was told of once its pending write is done
        (the memory tier drops it)."""
        self.tier = tier
        self.block_size = block_size
        self.stats = stats
        self.limiter = trio.CapacityLimiter(threads)
        # Room for windows' GETs to land while the writers catch up: with fewer slots a burst
        # of them filled every slot, and loads ahead waited, nothing in flight, until a batch
        # was written (stop and go: docs/notes/rgw-sequential.md, clients-full-load-waits.md).
        slots = max(2 * threads, write_room // block_size)
        self._write_slots = trio.Semaphore(slots)
        # A batch is full at this many blocks: never more than the slots, so that a writer
        # does not wait for blocks that cannot come (every slot already queued).
        self._batch_blocks = min(_BATCH_BLOCKS, slots)
        self._background = background
        # Blocks waiting for a writer (each holds a write slot), and the writers running.
        self._pending: list[tuple[BlockKey, bytes]] = []
        self._pending_bytes = 0
        self._batch_ready = trio.Event()  # set once a whole batch is pending
        self._writers = 0
        # Blocks handed to the write-behind and not yet written, skipped or failed: whether a
        # reader passed them meanwhile (`passed`), so that `on_written` is told once written.
        self._writing: dict[BlockKey, bool] = {}
        self.on_written = on_written
        # Whole-block reads waiting for a reader task, the tasks running, and whether one of
        # them has not taken its first batch yet (it will take what queues meanwhile).
        self._reads: list[_QueuedRead] = []
        self._queued_bytes = 0
        self._readers = 0
        self._collecting = False
        self.memory_only = memory_only
        self.keep_block = keep_block
        self.admit = admit
        # The tier's keys, read from its index by _read_keys at most every _FOLLOW_PERIOD
        # while blocks are looked up, and when (trio clock) the last read began.
        self.keys = DiskKeys(0)
        self._keys_read_at = -math.inf
        self._keys_reading = False

    def holds(self, key: BlockKey) -> bool:
        """Whether the block belongs in the disk tier (there is one, and its source uses it)."""
        return self.tier is not None and key.source not in self.memory_only

    def name(self, key: BlockKey) -> str:
        """The block's entry key in the tier."""
        return entry_key(key, self.block_size)

    # --- reading -----------------------------------------------------------------------------

    def may_hold(self, key: BlockKey) -> bool:
        """Whether the tier may hold the block: False only when it takes none of its source's,
        or its key filter, fresh, knows it holds no such entry (nothing counted)."""
        if not self.holds(key):
            return False
        now = self.follow()
        return now - self._keys_read_at > 2 * _FOLLOW_PERIOD or self.keys.might_hold(self.name(key))

    def _known_absent(self, name: str) -> bool:
        """The key filter knows the tier holds no entry of this name (a disk miss, no hop).

        Only a filter read from the index within the last two periods answers; an older one
        (an idle mount: other processes may have written since) answers nothing until the
        refresh it starts here lands, so the index is asked as if there were no filter.
        """
        now = self.follow()
        if now - self._keys_read_at > 2 * _FOLLOW_PERIOD or self.keys.might_hold(name):
            return False
        self.stats.disk_misses_known += 1
        return True

    def follow(self) -> float:
        """Start bringing the key filter up to the index when it is a period old; the trio
        clock's time. Called ahead of reads too (BlockCache.expect_reads), so the first read
        after a quiet while finds the filter fresh rather than asking the index itself."""
        now = trio.current_time()
        stale = now - self._keys_read_at > _FOLLOW_PERIOD
        if stale and not self._keys_reading and self.tier is not None and self._background.attached:
            self._keys_reading = True
            self._background.spawn(self._read_keys)
        return now

    async def _read_keys(self) -> None:
        """Bring the key filter up to the index: the rows added since the last read (by any
        process), or every key when there is no filter yet or it is full."""
        assert self.tier is not None
        started = trio.current_time()
        try:
            if self._keys_read_at == -math.inf or self.keys.full:
                self.keys = await run_blocking(self.limiter, load_keys, self.tier.index)
            else:
                rows = await run_blocking(
                    self.limiter, keys_after, self.tier.index, self.keys.last_rowid
                )
                self.keys.add_rows(rows)
            self._keys_read_at = started  # rows committed after the query began are not in it
        except Exception as exc:  # a locked or damaged index: the index is asked meanwhile
            log.debug("disk tier key filter not refreshed: %s", exc)
        finally:
            self._keys_reading = False

    async def get(self, key: BlockKey, size: int | None = None) -> bytes | None:
        """The whole block from the tier, or None (a miss is counted). `size` is the block's
        length when the caller knows it (small blocks are read in batches)."""
        if self.tier is None or not self.holds(key):
            return None
        name = self.name(key)
        if self._known_absent(name):
            self.stats.disk_misses += 1
            return None
        if self._background.attached:
            found = self._count(await self._read_batched(name, size or self.block_size))
        else:
            found = await self._read(self.tier.get, name)
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
        if self._known_absent(name):
            return None
        found = await self._read(self.tier.get_range, name, start, length)
        if found.data is None or not found.whole:
            return found.data
        if self.keep_block is not None:
            self.keep_block(key, found.data)
        return found.data[start : start + length]

    async def _read(self, reader: Callable[[*Ts], DiskRead], *args: *Ts) -> DiskRead:
        """Run a tier read in a worker thread and count what it found."""
        return self._count(await run_blocking(self.limiter, reader, *args))

    def _count(self, found: DiskRead) -> DiskRead:
        if found.corrupt:
            self.stats.disk_corrupt += 1
        if found.data is not None:
            self.stats.disk_hits += 1
        return found

    async def _read_batched(self, name: str, size: int) -> DiskRead:
        """Queue a whole-block read for a reader task and wait for what it found."""
        queued = _QueuedRead(name, size)
        self._reads.append(queued)
        self._queued_bytes += size
        self._start_reader()
        try:
            await queued.done.wait()
        except BaseException:  # cancelled: a batch not yet taken leaves it out
            if queued in self._reads:
                self._reads.remove(queued)
                self._queued_bytes -= size
            raise
        return queued.found

    def _start_reader(self) -> None:
        """Start a reader task for what is queued: when none runs, or a whole batch waits
        (large blocks, a burst) and fewer than `disk_threads` run. Less than a batch waits for
        a running task to come back from its hop and take it with the rest then queued, rather
        than pay a hop of its own."""
        if self._collecting or self._readers >= self.limiter.total_tokens:
            return
        if self._readers and not self._batch_waiting():
            return
        self._readers += 1
        self._collecting = True
        self._background.spawn(self._read_batches)

    async def _read_batches(self) -> None:
        """Read queued blocks in batches until none is left, one worker-thread hop each."""
        assert self.tier is not None
        collecting, batch = True, []
        try:
            while self._reads:
                for _ in range(_READ_GATHER):
                    if self._batch_waiting():
                        break
                    await trio.lowlevel.checkpoint()
                if not self._reads:
                    break  # another task took them meanwhile
                batch = self._take_reads()
                if collecting:
                    self._collecting = collecting = False
                if self._batch_waiting():  # another task reads beside this one
                    self._start_reader()
                try:
                    found = await run_blocking(
                        self.limiter, self.tier.get_many, [read.name for read in batch]
                    )
                except Exception as exc:  # not expected (the tier reports misses): all missed
                    log.warning("disk cache reads of %d blocks failed: %s", len(batch), exc)
                    found = [MISS] * len(batch)
                for read, result in zip(batch, found, strict=True):
                    read.found = result
                    read.done.set()
                batch = []
        finally:
            if collecting:
                self._collecting = False
            self._readers -= 1
            for read in batch:  # cancelled during its hop: its readers see misses
                read.done.set()

    def _batch_waiting(self) -> bool:
        return len(self._reads) >= _READ_BATCH_BLOCKS or self._queued_bytes >= _READ_BATCH_BYTES

    def _take_reads(self) -> list[_QueuedRead]:
        """The oldest queued reads, up to a batch's worth (at least one)."""
        count, size = 0, 0
        while count < len(self._reads) and count < _READ_BATCH_BLOCKS:
            if count and size + self._reads[count].size > _READ_BATCH_BYTES:
                break
            size += self._reads[count].size
            count += 1
        batch, self._reads = self._reads[:count], self._reads[count:]
        self._queued_bytes -= size
        return batch

    async def present(self, keys: list[BlockKey]) -> list[bool]:
        """Which of the blocks have an entry (one worker-thread hop for them all)."""
        assert self.tier is not None
        names = [self.name(key) for key in keys]
        asked = [name for name in names if not self._known_absent(name)]
        if not asked:
            return [False] * len(names)
        found = await run_blocking(self.limiter, self.tier.present, asked)
        held = {name for name, here in zip(asked, found, strict=True) if here}
        return [name in held for name in names]

    # --- writing -----------------------------------------------------------------------------

    def passed(self, key: BlockKey) -> bool:
        """A reader is done with the block: whether the tier holds its entry now (the memory
        tier may drop it). A block whose write is pending is marked instead, and `on_written`
        is told of it once that write is done.

        "Holds" is the key filter's answer (the entries this process wrote, and the index's
        rows it has read): about 1% of blocks the tier does not hold (a write declined or
        skipped) answer yes, and such a block, dropped, is fetched again if read again.
        """
        if not self.holds(key):
            return False  # never going to disk (no tier, a memory-only source): kept
        if key in self._writing:
            self._writing[key] = True
            return False
        return self.keys.might_hold(self.name(key))

    def write_behind(self, key: BlockKey, data: bytes) -> None:
        """Store a fetched block on disk, behind: nobody waits for it.

        It takes a write slot at once when one is free, else a background task waits for one.
        Blocks waiting for the disk are memory the memory tier's bound does not see: loads ahead
        bound them by asking `wait_for_room` before each request (see there).
        """
        if not self.holds(key) or not self._background.attached:
            return
        if self.admit is not None and not self.admit(key, len(data)):
            self.stats.disk_writes_declined += 1
            return
        self._writing.setdefault(key, False)
        try:  # a free slot: queued at once, without a background task to wait for one
            self._write_slots.acquire_nowait()
        except trio.WouldBlock:
            self._background.spawn(self._queue_when_free, key, data)
        else:
            self._queue(key, data)

    async def wait_for_room(self) -> None:
        """Wait until every block handed to `write_behind` so far has a write slot and one is
        free: loading ahead then runs at the disk's pace.

        A load ahead asks before its request, not while the request's body streams in: a
        stream stalled on the disk stalls the store's connection too (its receive window
        fills), which on a far store costs the bandwidth of a round trip. The blocks waiting
        for the disk stay bounded: the slots plus the budget of bytes loaded ahead in flight.
        """
        if self.tier is None or self._write_slots.value > 0:
            return  # a free slot means nobody waits for one (no schedule point: every file asks)
        async with self._write_slots:  # FIFO: behind every block already waiting for a slot
            pass

    async def _queue_when_free(self, key: BlockKey, data: bytes) -> None:
        try:
            await self._write_slots.acquire()
        except BaseException:  # cancelled (the mount ends): never written
            self._writing.pop(key, None)
            raise
        self._queue(key, data)

    def _queue(self, key: BlockKey, data: bytes) -> None:
        """Queue a block for a writer (its write slot taken), starting one if none is free."""
        self._pending.append((key, data))
        self._pending_bytes += len(data)
        if len(self._pending) >= self._batch_blocks or self._pending_bytes >= _BATCH_BYTES:
            self._batch_ready.set()
        if self._writers < _WRITERS:
            self._writers += 1
            self._background.spawn(self._write_batches)

    async def _write_batches(self) -> None:
        """Write queued blocks in batches until none is left: one worker-thread hop and one
        index transaction per batch rather than per block.

        A writer finding less than a batch waits up to _LINGER for more: blocks arriving a
        few at a time would otherwise be batches of their own, each paying the hop and the
        transaction alone. Nobody waits for a write behind, so the wait costs only memory,
        which the write slots bound.
        """
        assert self.tier is not None
        try:
            while self._pending:
                if not self._batch_ready.is_set():
                    with trio.move_on_after(_LINGER):
                        await self._batch_ready.wait()
                    if not self._pending:
                        break  # the other writer took them meanwhile
                batch = self._take_batch()
                names = [(self.name(key), data, key.source) for key, data in batch]
                stored = [False] * len(batch)
                try:
                    stored = await run_blocking(self.limiter, self.tier.put_batch, names)
                finally:
                    for (key, _data), here in zip(batch, stored, strict=True):
                        self._write_slots.release()
                        self._written(key, here)
                written = sum(stored)
                self.stats.disk_writes += written
                self.stats.disk_write_skips += len(batch) - written
        finally:
            self._writers -= 1

    def _written(self, key: BlockKey, here: bool) -> None:
        """A block's write is done (`here`: its entry stored): it leaves the pending set, and
        `on_written` is told when a reader passed it meanwhile."""
        passed = self._writing.pop(key, False)
        if here:
            self.keys.add(self.name(key))
            if passed and self.on_written is not None:
                self.on_written(key)

    def _take_batch(self) -> list[tuple[BlockKey, bytes]]:
        """The oldest queued blocks, up to a batch's worth (at least one)."""
        count, size = 0, 0
        while count < len(self._pending) and count < self._batch_blocks:
            size += len(self._pending[count][1])
            count += 1
            if size >= _BATCH_BYTES:
                break
        batch, self._pending = self._pending[:count], self._pending[count:]
        self._pending_bytes -= size
        if len(self._pending) < self._batch_blocks and self._pending_bytes < _BATCH_BYTES:
            self._batch_ready = trio.Event()
        return batch

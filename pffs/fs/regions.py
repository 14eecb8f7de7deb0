"""A region's bytes streamed just ahead of its reader, for one open file.

A memory-mapped reader copying a tensor out of a large checkpoint (safetensors' `safe_open`)
reads a region: a forward run of the kernel's read-around and readahead READs (1 MiB each)
starting in the middle of the file and ending where the tensor ends, which nobody knows in
advance. Whole blocks ahead of such a run cost a round trip per block in series (each asked for
only when the run enters the one before) and a block past the region's end. So while a region
run is short (pffs.cache.readahead: `Readahead.stream_to`), its bytes come from spans: ranged
GETs streamed in pieces (`StoreBlocks.stream`), each asked for as soon as the run's reads come
near the end of the spans before it, so the next span's round trip overlaps the transfer of the
one before. A READ waits only for the pieces it reads. The bytes are not cached as blocks (a
span starts anywhere): the kernel keeps what it read in its page cache, so a span is dropped
once read to its end. Their bytes held or coming are the mount's budget of bytes ahead
(pffs.flow.budget: at most `region_per_file` per open file, and a bound across all of them, so
many open files each with a region run do not hold memory without bound); past either the READs
go through the block cache. A span that failed is asked for again by each READ that wants it, on
its own, which sees the error.

Each byte is fetched once: a file's region may turn out to be part of a walk of the whole file
(an Arrow file's metadata hops, then the kernel's readahead of it front to back), whose blocks
then cover bytes its spans hold or are still fetching. Once a handle streams regions, its blocks
come through `SpansFirst`: a block load (a reader's, or a readahead run's) takes what the spans
hold, waiting for their pieces, and asks the store only for the rest. A span dropped while its
file is open (read to its end, or to make room) is parked (pffs.fs.parking: on local disk, not
in memory), where such a load finds it too: the walk may come long after the regions (an Arrow
file's metadata hops, then its bodies).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial

import trio

from pffs.cache.keys import Blocks
from pffs.flow.budget import AheadBudget
from pffs.fs.parking import ParkedSpans
from pffs.store.fetching import StoreBlocks, piece_lengths

log = logging.getLogger("pffs.fs")

# Spawns a task in the cache's background nursery; False when there is none (nothing fetched).
Spawn = Callable[[Callable[[], Awaitable[None]]], bool]


class _Span:
    __slots__ = ("changed", "data", "done", "end", "failed", "number", "start", "taken")

    def __init__(self, number: int, start: int, end: int) -> None:
        self.number = number  # the order spans were asked for in
        self.start = start
        self.end = end
        self.data = bytearray()  # the pieces arrived so far, in order
        self.taken = 0  # bytes READs took from it
        self.done = False
        self.failed = False
        self.changed = trio.Event()

    def arrived(self, piece: bytes) -> None:
        self.data += piece
        self._wake()

    def copy(self, start: int, stop: int) -> bytes:
        """The file's bytes [start, stop), arrived: copied once (a bytearray slice then bytes
        would be two), since the span may still grow and no view of it may outlive the call."""
        with memoryview(self.data) as view:
            return bytes(view[start - self.start : stop - self.start])

    def ended(self, failed: bool) -> None:
        self.done = True
        self.failed = failed or len(self.data) < self.end - self.start
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


# A part of a READ or a block load (not a span's arriving piece): bytes got elsewhere, or a
# span's [start, stop) of the file.
_Part = bytes | memoryview | tuple[_Span, int, int]


def _joined(parts: list[_Part]) -> bytes | memoryview:
    """The parts put together, each span's bytes copied once, here, after the last wait: a
    span may still grow while its reader waits for more (a bytearray with a view of it
    cannot), and its bytes never change once arrived. The views made for the join end with
    the call."""
    if len(parts) == 1:
        part = parts[0]
        return part[0].copy(part[1], part[2]) if isinstance(part, tuple) else part
    return b"".join(
        memoryview(p[0].data)[p[1] - p[0].start : p[2] - p[0].start] if isinstance(p, tuple) else p
        for p in parts
    )


class RegionStreams:
    """The spans streamed for the region runs of one open file."""

    def __init__(
        self,
        source: StoreBlocks,
        spawn: Spawn,
        budget: AheadBudget,
        parked: ParkedSpans | None = None,
    ) -> None:
        """`parked`: where the file's dropped spans go (None: they are let go)."""
        self._source = source
        self._spawn = spawn
        self._budget = budget
        self._parked = parked
        self._spans: list[_Span] = []  # by start; none overlap
        self._started = 0

    @property
    def held(self) -> int:
        """Bytes of spans held or coming."""
        return sum(span.end - span.start for span in self._spans)

    def close(self) -> None:
        """The file is closed: its spans are dropped (one still coming ends unread)."""
        for span in list(self._spans):
            self._drop(span, park=False)
        if self._parked is not None:
            self._parked.close()

    def covers(self, offset: int) -> bool:
        return self._covering(offset) is not None

    def overlaps(self, offset: int, end: int) -> bool:
        """Whether a span holds, is fetching or parked any of bytes [offset, end)."""
        spans = any(span.start < end and offset < span.end for span in self._spans)
        return spans or (self._parked is not None and self._parked.overlaps(offset, end))

    async def assemble(
        self, offset: int, end: int, fetch: Callable[[int, int], Awaitable[bytes]]
    ) -> bytes:
        """Bytes [offset, end) for a block load: what spans hold or are fetching taken from
        them (waiting for their pieces; a failed span's part fetched instead), what was
        parked read back, the gaps between them from `fetch(offset, length)`, one call per
        gap. Not counted as taken by a READ: the spans stay for the READs they were streamed
        for."""
        parts: list[_Part] = []
        position = offset
        while position < end:
            span = self._covering(position)
            if span is None:
                stop = min(end, self._next_start(position, end))
                parked, data = self._parked, None
                if parked is not None:
                    parked_end = parked.covering(position)
                    if parked_end is None:
                        stop = parked.next_start(position, stop)  # the gap up to the next one
                    else:  # the parked span's bytes (the store's, should they be gone)
                        stop = min(end, parked_end)
                        data = await parked.read(position, stop)
                parts.append(data if data is not None else await fetch(position, stop - position))
                position = stop
                continue
            stop = min(end, span.end)
            while len(span.data) < stop - span.start and not span.done:
                await span.changed.wait()
            if span.failed and len(span.data) < stop - span.start:
                parts.append(await fetch(position, stop - position))
            else:
                parts.append((span, position, stop))
            position = stop
        return bytes(_joined(parts))

    def reach(self, offset: int, target: int, least: int) -> None:
        """Have spans cover [offset, target): what no span covers and none parked holds is
        asked for as new spans, when the one it would follow ends within `least` bytes of
        `offset`'s run reaching `target` (so a run's spans come a few at a time, not one per
        READ); nothing beyond the bound of bytes held."""
        position = offset
        while position < target:
            span = self._covering(position)
            if span is not None:
                position = span.end
                continue
            parked = self._parked
            parked_end = parked.covering(position) if parked is not None else None
            if parked_end is not None:  # fetched before: the READ reads it back (SpansFirst)
                position = parked_end
                continue
            if position > offset and target - position < least:
                return  # the spans ahead still reach far enough: ask for more later
            stop = min(target, self._next_start(position, target))
            if parked is not None:
                stop = parked.next_start(position, stop)
            if not self._room(stop - position):
                return
            self._start(position, stop)
            position = stop

    async def take(
        self, offset: int, end: int, rest: Callable[[int, int], Awaitable[bytes | memoryview]]
    ) -> bytes | memoryview | None:
        """Bytes [offset, end) when a span covers `offset` (waiting for their pieces; past the
        spans, the rest from `rest(position, end)`: the block cache, which may hold it), else
        None (the caller reads through the block cache)."""
        parts: list[_Part] = []
        position = offset
        while position < end:
            span = self._covering(position)
            if span is None:
                if position == offset:
                    return None
                parts.append(await rest(position, end))
                break
            stop = min(end, span.end)
            while len(span.data) < stop - span.start and not span.done:
                await span.changed.wait()
            if span.failed:
                parts.append(await self._source.part(position, stop - position))
            else:
                parts.append((span, position, stop))
            span.taken += stop - position
            if span.taken >= span.end - span.start and span.done:
                self._drop(span)  # parked as it is: its bytes stay what they are
            position = stop
        return _joined(parts)

    def _room(self, size: int) -> bool:
        """Whether `size` more bytes may be held, dropping spans that arrived whole, oldest
        first, to make room (a region's overshoot nobody read)."""
        for span in sorted(self._spans, key=lambda s: s.number):
            if self._fits(size):
                break
            if span.done:
                self._drop(span)
        return self._fits(size)

    def _fits(self, size: int) -> bool:
        budget = self._budget
        return self.held + size <= budget.region_per_file and budget.fits("region", size)

    def _drop(self, span: _Span, park: bool = True) -> None:
        self._spans.remove(span)
        self._budget.give_back("region", span.end - span.start)
        if park and span.done and not span.failed:
            self.park(span.start, span.data)  # no copy: nothing changes a dropped span's bytes

    def park(self, offset: int, data: bytes | bytearray) -> None:
        """Bytes [offset, offset+len(data)) of the file a block load may come over later: a
        dropped span's, or those a READ fetched alone (a region's first READ, before its run
        is known)."""
        if self._parked is not None:
            self._parked.park(offset, data)

    def _covering(self, offset: int) -> _Span | None:
        for span in self._spans:
            if span.start <= offset < span.end:
                return span
        return None

    def _next_start(self, offset: int, end: int) -> int:
        """Where the first span starting in (offset, end) starts, else `end`."""
        return min((s.start for s in self._spans if offset < s.start < end), default=end)

    def _start(self, start: int, end: int) -> None:
        self._started += 1
        span = _Span(self._started, start, end)
        if self._spawn(partial(self._fetch, span)):
            self._spans.append(span)
            self._spans.sort(key=lambda s: s.start)
            self._budget.add("region", end - start)

    async def _fetch(self, span: _Span) -> None:
        failed = True
        try:
            lengths = piece_lengths(span.end - span.start)
            async with self._source.stream(span.start, lengths, True) as pieces:
                async for piece in pieces:
                    span.arrived(piece)
            failed = False
        except Exception:  # the READs that want it ask again, each on its own, and see why
            log.debug("a region's span %d+%d failed", span.start, span.end - span.start)
        finally:
            span.ended(failed)
            if span.taken >= span.end - span.start and span in self._spans:
                self._drop(span)


class SpansFirst:
    """The block source (pffs.cache.keys.BlockSource) of a file whose region streams may hold
    some of a block's bytes: a block load takes those from the spans and asks the store for
    the rest only, so no byte of the file is fetched twice while its spans hold it."""

    def __init__(self, store: StoreBlocks, regions: RegionStreams) -> None:
        self.store = store
        self.regions = regions

    async def part(self, offset: int, length: int) -> bytes:
        if self.regions.overlaps(offset, offset + length):
            return await self.regions.assemble(offset, offset + length, self.store.part)
        data = await self.store.part(offset, length)
        blocks = self.store.blocks
        index = offset // blocks.block_size
        if offset != blocks.start(index) or length != blocks.length(index):
            self.regions.park(offset, data)  # a READ's bytes alone: a walk may come over them
        return data

    def run(self, first: int, count: int) -> Blocks:
        blocks = self.store.blocks
        last = first + count - 1
        if not self.regions.overlaps(blocks.start(first), blocks.start(last) + blocks.length(last)):
            return self.store.run(first, count)
        return self._assembled(first, count)

    @trio.as_safe_channel
    async def _assembled(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """Blocks first..first+count-1, each yielded in order once in: those no span touches
        in runs of the store's, the others put together from their spans and the store's
        ranges of the rest; all asked for at once."""
        blocks, regions = self.store.blocks, self.regions
        stop = first + count
        landed: dict[int, bytes] = {}
        changed = trio.Event()

        def land(index: int, data: bytes) -> None:
            nonlocal changed
            landed[index] = data
            changed.set()
            changed = trio.Event()

        def touched(index: int) -> bool:
            start = blocks.start(index)
            return regions.overlaps(start, start + blocks.length(index))

        async def plain(index: int, end: int) -> None:
            async with self.store.run(index, end - index) as arriving:
                async for number, data in arriving:
                    land(number, data)

        async def assembled(index: int) -> None:
            start = blocks.start(index)
            land(index, await regions.assemble(start, start + blocks.length(index), self._ahead))

        async with trio.open_nursery() as nursery:
            index = first
            while index < stop:
                if touched(index):
                    nursery.start_soon(assembled, index)
                    index += 1
                    continue
                end = index
                while end < stop and not touched(end):
                    end += 1
                nursery.start_soon(plain, index, end)
                index = end
            for index in range(first, stop):
                while index not in landed:
                    await changed.wait()
                yield index, landed.pop(index)

    async def _ahead(self, offset: int, length: int) -> bytes:
        """Bytes of a block loaded ahead that no span holds: one streamed request, in a place
        of the pace like the rest of the load."""
        async with self.store.stream(offset, piece_lengths(length), True) as pieces:
            return b"".join([piece async for piece in pieces])

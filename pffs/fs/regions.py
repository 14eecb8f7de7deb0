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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from pffs.flow.budget import AheadBudget
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

    def ended(self, failed: bool) -> None:
        self.done = True
        self.failed = failed or len(self.data) < self.end - self.start
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class RegionStreams:
    """The spans streamed for the region runs of one open file."""

    def __init__(self, source: StoreBlocks, spawn: Spawn, budget: AheadBudget) -> None:
        self._source = source
        self._spawn = spawn
        self._budget = budget
        self._spans: list[_Span] = []  # by start; none overlap
        self._started = 0

    @property
    def held(self) -> int:
        """Bytes of spans held or coming."""
        return sum(span.end - span.start for span in self._spans)

    def close(self) -> None:
        """The file is closed: its spans are dropped (one still coming ends unread)."""
        for span in list(self._spans):
            self._drop(span)

    def covers(self, offset: int) -> bool:
        return self._covering(offset) is not None

    def reach(self, offset: int, target: int, least: int) -> None:
        """Have spans cover [offset, target): what no span covers is asked for as new spans,
        when the one it would follow ends within `least` bytes of `offset`'s run reaching
        `target` (so a run's spans come a few at a time, not one per READ); nothing beyond
        the bound of bytes held."""
        position = offset
        while position < target:
            span = self._covering(position)
            if span is not None:
                position = span.end
                continue
            if position > offset and target - position < least:
                return  # the spans ahead still reach far enough: ask for more later
            stop = min(target, self._next_start(position, target))
            if not self._room(stop - position):
                return
            self._start(position, stop)
            position = stop

    async def take(self, offset: int, end: int) -> bytes | None:
        """Bytes [offset, end) when spans cover them all (waiting for their pieces), else
        None (the caller reads through the block cache)."""
        pieces: list[bytes] = []
        position = offset
        while position < end:
            span = self._covering(position)
            if span is None:
                if position == offset:
                    return None
                pieces.append(await self._source.part(position, end - position))
                break
            stop = min(end, span.end)
            while len(span.data) < stop - span.start and not span.done:
                await span.changed.wait()
            if span.failed:
                pieces.append(await self._source.part(position, stop - position))
            else:
                pieces.append(bytes(span.data[position - span.start : stop - span.start]))
            span.taken += stop - position
            if span.taken >= span.end - span.start and span.done:
                self._drop(span)
            position = stop
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

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

    def _drop(self, span: _Span) -> None:
        self._spans.remove(span)
        self._budget.give_back("region", span.end - span.start)

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

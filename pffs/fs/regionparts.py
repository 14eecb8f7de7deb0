"""Parts of a region fetched just ahead of its reader, for one open file.

A memory-mapped reader copying a tensor out of a large checkpoint (safetensors' `safe_open`)
reads a region: a run of the kernel's read-around and readahead READs (1 MiB each) starting in
the middle of the file and ending where the tensor ends, which nobody knows in advance. Whole
blocks ahead of such a run fetch up to a block past the region's last READ for each region, and
a block is loaded whole for the READ that only enters it. So while a region is short, its READs
are served from parts of the READs' own size, asked of the store a few at once just ahead of the
run (`ahead`), and taken by the READs that arrive for them (`take`): the bytes fetched are the
kernel's READs and the window ahead, no more. The kernel keeps what it read in its page cache,
so each part is read once and dropped when taken; parts never taken are dropped oldest first
beyond a bound. A part that failed is fetched again by the READ that wants it, on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import trio

from pffs.cache.keys import BlockSource

# Spawns a task in the cache's background nursery; False when there is none (no fetch ahead).
Spawn = Callable[[Callable[[], Awaitable[None]]], bool]


class _Part:
    __slots__ = ("data", "done", "end", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.data: bytes | None = None  # None once done: the fetch failed
        self.done = trio.Event()


class RegionParts:
    """The parts fetched ahead for the region runs of one open file."""

    def __init__(self, source: BlockSource, spawn: Spawn, held_max: int) -> None:
        """`held_max`: bytes of parts held or coming at most (the oldest beyond are dropped)."""
        self._source = source
        self._spawn = spawn
        self._held_max = held_max
        self._parts: dict[int, _Part] = {}  # by start, oldest first
        self._held = 0

    def ahead(self, start: int, end: int, part_size: int) -> int:
        """Fetch [start, end) in parts of `part_size` (those not held or coming); the bytes
        asked for."""
        asked = 0
        offset = start
        while offset < end:
            covering = self._covering(offset)
            if covering is not None:
                offset = covering.end
                continue
            part = _Part(offset, min(end, offset + part_size, self._next_start(offset, end)))
            if not self._spawn(partial(self._fetch, part)):
                break
            self._parts[part.start] = part
            self._held += part.end - part.start
            asked += part.end - part.start
            offset = part.end
        while self._held > self._held_max and self._parts:
            self._drop(next(iter(self._parts.values())))
        return asked

    async def take(self, offset: int, end: int) -> bytes | None:
        """Bytes [offset, end) when parts held or coming start them (what they do not cover
        asked of the store now), each part dropped once read to its end; None when no part
        starts them."""
        if self._covering(offset) is None:
            return None
        pieces: list[bytes] = []
        while offset < end:
            part = self._covering(offset)
            if part is None:
                stop = self._next_start(offset, end)
                pieces.append(await self._source.part(offset, stop - offset))
                offset = stop
                continue
            await part.done.wait()
            stop = min(end, part.end)
            data = part.data
            if data is None:  # its fetch failed: the reader asks for it itself
                data = await self._source.part(part.start, part.end - part.start)
            pieces.append(data[offset - part.start : stop - part.start])
            if stop >= part.end:
                self._drop(part)
            offset = stop
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    @property
    def held(self) -> int:
        """Bytes of parts held or coming."""
        return self._held

    def _covering(self, offset: int) -> _Part | None:
        for part in self._parts.values():
            if part.start <= offset < part.end:
                return part
        return None

    def _next_start(self, offset: int, end: int) -> int:
        """Where the first part starting in (offset, end) starts, else `end`."""
        return min((p.start for p in self._parts.values() if offset < p.start < end), default=end)

    def _drop(self, part: _Part) -> None:
        if self._parts.pop(part.start, None) is part:
            self._held -= part.end - part.start

    async def _fetch(self, part: _Part) -> None:
        try:
            part.data = await self._source.part(part.start, part.end - part.start)
        except Exception:  # the reader that wants it asks again, and sees why
            part.data = None
        finally:
            part.done.set()

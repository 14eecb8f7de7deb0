"""Parking: the bytes of a file's region spans, kept on local disk while the file is open.

A span (pffs.fs.regions) is dropped once the kernel read it to its end, or to make room; its
bytes are in the kernel's page cache then, but a block load of the same file may come over them
later (an Arrow file's walk front to back after its metadata hops: blocks are coarser than the
kernel's READs, so a block covers bytes the kernel already holds). Such a load takes the bytes
from here instead of asking the store again: each byte of the file is fetched once.

Most parked bytes are never asked for again (a lazy loader's tensors), and a walk may come long
after its regions, so they are not kept in memory: each open file that parks gets a scratch
file in the staging directory, unnamed (O_TMPFILE, gone with its descriptor), written at the
object's own offsets (a sparse file), from a worker thread. A span's bytes stay in memory only
until their write is done; the scratch file goes when the file is closed. The kernel keeps the
scratch file's pages in its page cache, reclaimable, not in the mount's resident memory
(docs/notes/parked-spans-rss.md measured both).

Bounded: at most `ROOM` bytes parked across the mount, UNWRITTEN of them in memory (a slow disk
must not turn parking back into resident memory), and PARKED_MAX spans per open file; past any,
a dropped span is let go (a block load over it asks the store). A scratch file that
cannot be written (a full disk) parks nothing more; the spans it failed to take are let go.
Sources whose blocks never go to disk (`cache = "memory"`) park nothing. Threading rule as in
the cache: worker threads only move bytes (pwrite, pread); the records are touched only from
trio tasks.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable

import trio

from pffs.workers import run_blocking

log = logging.getLogger("pffs.fs")

# Bytes parked across the mount at most (its open files' scratch files together).
ROOM = 1 << 30
# Bytes parked and not yet written across the mount at most: what parking holds in memory.
UNWRITTEN = 32 << 20
# Spans parked per open file at most (each lookup walks them).
PARKED_MAX = 1024
# Worker threads writing or reading scratch files at once.
THREADS = 2

# Spawns a task in the cache's background nursery; False when there is none.
Spawn = Callable[[Callable[[], Awaitable[None]]], bool]


class Parking:
    """The mount's parking: where scratch files go, and the room they share."""

    def __init__(
        self,
        directory: str,
        room: int = ROOM,
        unwritten: int = UNWRITTEN,
        free_ratio: float = 0.1,
    ) -> None:
        self.directory = directory
        self.room = room
        # The share of the directory's disk parking leaves free, as the disk tier does
        # (--cache-free-ratio): staged writes share this disk, and must never meet it full.
        self.free_ratio = free_ratio
        self.unwritten_max = unwritten
        self.used = 0  # bytes parked now, across the open files
        self.unwritten = 0  # of them, bytes still in memory (their writes not done)
        self.limiter = trio.CapacityLimiter(THREADS)

    def take(self, size: int) -> bool:
        """Count `size` bytes parked, in memory until written, if they fit (True)."""
        if self.used + size > self.room or self.unwritten + size > self.unwritten_max:
            return False
        if not self._disk_has_room(size):
            return False
        self.used += size
        self.unwritten += size
        return True

    def _disk_has_room(self, size: int) -> bool:
        """Whether `size` more bytes leave the disk's free share (one statvfs: a span is MiBs)."""
        try:
            usage = shutil.disk_usage(self.directory)
        except OSError:
            return False
        return usage.free - size >= self.free_ratio * usage.total

    def written(self, size: int) -> None:
        self.unwritten -= size

    def give_back(self, size: int) -> None:
        self.used -= size


class _Parked:
    __slots__ = ("data", "end", "start")

    def __init__(self, start: int, data: bytes | bytearray) -> None:
        self.start = start
        self.end = start + len(data)
        self.data: bytes | bytearray | None = data  # until written to the scratch file


class ParkedSpans:
    """One open file's parked spans: in memory until written, then in its scratch file."""

    def __init__(self, parking: Parking, spawn: Spawn) -> None:
        self._parking = parking
        self._spawn = spawn
        self._parked: list[_Parked] = []  # oldest first
        self._scratch: int | None = None  # the scratch file's descriptor, once opened
        self._opening = trio.Lock()
        self._users = 0  # tasks writing or reading the scratch file now
        self._closed = False
        self._broken = False  # a write failed: park nothing more

    @property
    def held(self) -> int:
        """Bytes of this file parked and still in memory (their write not done yet)."""
        return sum(p.end - p.start for p in self._parked if p.data is not None)

    def park(self, offset: int, data: bytes | bytearray) -> None:
        """Keep bytes [offset, offset+len(data)) of the file (`data` is not changed after)."""
        size = len(data)
        if self._closed or self._broken or not size or len(self._parked) >= PARKED_MAX:
            return
        if not self._parking.take(size):
            return
        parked = _Parked(offset, data)
        self._parked.append(parked)
        self._users += 1  # the write's: the scratch file stays until it is done
        if not self._spawn(lambda: self._write(parked)):
            self._users -= 1
            self._forget(parked)

    def overlaps(self, offset: int, end: int) -> bool:
        return any(p.start < end and offset < p.end for p in self._parked)

    def next_start(self, offset: int, end: int) -> int:
        """Where the first parked span starting in (offset, end) starts, else `end`."""
        return min((p.start for p in self._parked if offset < p.start < end), default=end)

    def covering(self, offset: int) -> int | None:
        """The end of a parked span holding byte `offset` (the newest), else None."""
        for parked in reversed(self._parked):
            if parked.start <= offset < parked.end:
                return parked.end
        return None

    async def read(self, offset: int, end: int) -> bytes | None:
        """Bytes [offset, end) of one parked span, or None when they are gone (the file was
        closed meanwhile, or its scratch file failed): the caller asks the store."""
        parked = next((p for p in reversed(self._parked) if p.start <= offset < p.end), None)
        if parked is None or end > parked.end:
            return None
        if parked.data is not None:
            return bytes(memoryview(parked.data)[offset - parked.start : end - parked.start])
        scratch = self._scratch
        if scratch is None:
            return None
        self._users += 1
        try:
            limiter = self._parking.limiter
            data = await run_blocking(limiter, os.pread, scratch, end - offset, offset)
        except OSError as exc:
            log.debug("a parked span could not be read back: %s", exc)
            return None
        finally:
            self._users -= 1
            self._close_when_idle()
        return data if len(data) == end - offset else None

    def close(self) -> None:
        """The file is closed: its spans are let go, its scratch file too once no worker uses it."""
        self._closed = True
        for parked in list(self._parked):
            self._forget(parked)
        self._close_when_idle()

    async def _write(self, parked: _Parked) -> None:
        data = parked.data  # None once let go (the file closed before the write started)
        try:
            if self._closed or self._broken or data is None:
                return
            scratch = await self._open()
            await run_blocking(self._parking.limiter, _write_all, scratch, data, parked.start)
            self._drop_bytes(parked)  # on disk now: its memory goes
        except OSError as exc:
            log.warning("parking region spans failed, they are let go: %s", exc)
            self._broken = True
            self._forget(parked)
        finally:
            self._users -= 1
            self._close_when_idle()

    async def _open(self) -> int:
        async with self._opening:
            if self._scratch is None:
                directory = self._parking.directory
                self._scratch = await run_blocking(self._parking.limiter, _scratch_file, directory)
            return self._scratch

    def _drop_bytes(self, parked: _Parked) -> None:
        if parked.data is not None:
            parked.data = None
            self._parking.written(parked.end - parked.start)

    def _forget(self, parked: _Parked) -> None:
        if parked in self._parked:
            self._parked.remove(parked)
            self._drop_bytes(parked)
            self._parking.give_back(parked.end - parked.start)

    def _close_when_idle(self) -> None:
        if self._closed and self._users == 0 and self._scratch is not None:
            os.close(self._scratch)
            self._scratch = None


def _scratch_file(directory: str) -> int:
    """An unnamed file in `directory`, gone when closed (O_TMPFILE where the file system has
    it, else created and unlinked at once)."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    fd, path = tempfile.mkstemp(dir=directory, prefix="parked-")
    os.unlink(path)
    return fd


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written

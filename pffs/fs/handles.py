"""Open handles by role, numbered for the kernel: a file read through the block cache (the
version opened, its readahead, its pages in the kernel's page cache), a file being written (its
staging file), a directory (its listing); and pffs's own files under `.pffs` (pffs.fs.special):
a generated file read (its snapshot), `.pffs/preload` written (its order list) and `.pffs`
listed. The facade (pffs.fs.vfs) finds any handle here and routes on its role."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.cache.readahead import Readahead
from pffs.cache.sweeps import FileSweep
from pffs.errors import NotFound
from pffs.fs.inodes import Inode
from pffs.fs.listings import DirListing
from pffs.fs.orders import OrderBuffer, Sender
from pffs.fs.pagecache import HandlePages
from pffs.fs.readshape import ReadShape
from pffs.fs.regions import RegionStreams
from pffs.fs.staging import Staged
from pffs.routing.table import Mounted


@dataclass(eq=False)
class ReadHandle:
    """A file open for reading through the block cache: pinned to the version and size seen at
    open (`blocks`), so one open never mixes versions."""

    inode: Inode
    blocks: ObjectBlocks
    readahead: Readahead
    mounted: Mounted
    source: BlockSource  # where its blocks come from (pffs.store.fetching.open_blocks)
    pages: HandlePages = field(default_factory=HandlePages)
    regions: RegionStreams | None = None  # its region runs' streamed bytes, once it has some
    shape: ReadShape | None = None  # how it is read, for its dataset's preload (pffs.fs.datasets)
    sweep: FileSweep | None = None  # its load whole while read at random (pffs.cache.sweeps)


@dataclass(eq=False)
class WriteHandle:
    """A file being written (opened for writing, or opened while a writer has it open): its
    reads and writes go to the staging file."""

    inode: Inode
    staged: Staged


@dataclass(eq=False)
class DirHandle:
    inode: Inode
    listing: DirListing


@dataclass(eq=False)
class SnapshotHandle:
    """A generated file open for reading (`.pffs/stats`, or the report of `.pffs/preload`):
    one consistent snapshot, taken at open and read with direct_io."""

    content: bytes


@dataclass(eq=False)
class OrderHandle:
    """`.pffs/preload` open for writing: the order list it is given, who opened it, the
    report of its last list (what it reads)."""

    buffer: OrderBuffer
    sender: Sender
    report: bytes = b""


@dataclass(eq=False)
class HiddenDirHandle:
    """The hidden `.pffs` directory open for listing (its entries: pffs.fs.special)."""


Handle = ReadHandle | WriteHandle | DirHandle | SnapshotHandle | OrderHandle | HiddenDirHandle


class Handles:
    """The open handles of a mount by number."""

    def __init__(self) -> None:
        self._open: dict[int, Handle] = {}
        self._numbers = itertools.count(1)

    def add(self, handle: Handle) -> int:
        fh = next(self._numbers)
        self._open[fh] = handle
        return fh

    def get(self, fh: int) -> Handle | None:
        return self._open.get(fh)

    def reading(self, fh: int) -> ReadHandle:
        handle = self._open.get(fh)
        if not isinstance(handle, ReadHandle):
            raise NotFound(f"file handle {fh} is not open for reading")
        return handle

    def directory(self, fh: int) -> DirHandle:
        handle = self._open.get(fh)
        if not isinstance(handle, DirHandle):
            raise NotFound(f"directory handle {fh} is not open")
        return handle

    def pop(self, fh: int) -> Handle | None:
        return self._open.pop(fh, None)

    def readers(self) -> Iterator[ReadHandle]:
        return (h for h in self._open.values() if isinstance(h, ReadHandle))

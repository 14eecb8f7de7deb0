"""Open handles by role, numbered for the kernel: a file read through the block cache (the
version opened, its readahead, its pages in the kernel's page cache), a file being written (its
staging file), or a directory (its listing)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.cache.readahead import Readahead
from pffs.errors import NotFound
from pffs.fs.inodes import Inode
from pffs.fs.listings import DirListing
from pffs.fs.pagecache import HandlePages
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
    source: BlockSource  # where its blocks come from (pffs.fs.fetching.open_blocks)
    pages: HandlePages = field(default_factory=HandlePages)


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


class Handles:
    """The open handles of a mount by number."""

    def __init__(self) -> None:
        self._open: dict[int, ReadHandle | WriteHandle | DirHandle] = {}
        self._numbers = itertools.count(1)

    def number(self) -> int:
        """A fresh handle number (also for handles kept elsewhere, like the stats file's)."""
        return next(self._numbers)

    def add(self, handle: ReadHandle | WriteHandle | DirHandle) -> int:
        fh = self.number()
        self._open[fh] = handle
        return fh

    def file(self, fh: int) -> ReadHandle | WriteHandle:
        handle = self._open.get(fh)
        if not isinstance(handle, (ReadHandle, WriteHandle)):
            raise NotFound(f"file handle {fh} is not open")
        return handle

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

    def pop(self, fh: int) -> ReadHandle | WriteHandle | DirHandle | None:
        return self._open.pop(fh, None)

    def readers(self) -> Iterator[ReadHandle]:
        return (h for h in self._open.values() if isinstance(h, ReadHandle))

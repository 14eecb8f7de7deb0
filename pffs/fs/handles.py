"""Open handles: a file (the version opened, its readahead, or its staging file while written)
or a directory (its listing), numbered for the kernel."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from pffs.cache.readahead import Readahead
from pffs.errors import NotFound
from pffs.fs.inodes import Inode
from pffs.fs.listings import DirListing
from pffs.fs.staging import Staged
from pffs.routing.table import Mounted


@dataclass(eq=False)
class FileHandle:
    """An open file: the version and size seen at open, so one open never mixes versions."""

    inode: Inode
    version: str
    size: int
    readahead: Readahead
    mounted: Mounted
    path_in_source: str
    # Set while the file is open for writing anywhere: reads then come from the staging file.
    staged: Staged | None = None
    # Bytes pushed into the kernel's page cache around the last random read (pffs.fs.pagecache).
    push_window: int = 0
    # Its windows queued or pushed, by (start, size), each set once stored or given up.
    pushing: dict[tuple[int, int], threading.Event] = field(default_factory=dict)


@dataclass(eq=False)
class DirHandle:
    inode: Inode
    listing: DirListing


class Handles:
    """The open handles of a mount by number."""

    def __init__(self) -> None:
        self._open: dict[int, FileHandle | DirHandle] = {}
        self._numbers = itertools.count(1)

    def number(self) -> int:
        """A fresh handle number (also for handles kept elsewhere, like the stats file's)."""
        return next(self._numbers)

    def add(self, handle: FileHandle | DirHandle) -> int:
        fh = self.number()
        self._open[fh] = handle
        return fh

    def file(self, fh: int) -> FileHandle:
        handle = self._open.get(fh)
        if not isinstance(handle, FileHandle):
            raise NotFound(f"file handle {fh} is not open")
        return handle

    def directory(self, fh: int) -> DirHandle:
        handle = self._open.get(fh)
        if not isinstance(handle, DirHandle):
            raise NotFound(f"directory handle {fh} is not open")
        return handle

    def pop(self, fh: int) -> FileHandle | DirHandle | None:
        return self._open.pop(fh, None)

    def files(self) -> Iterator[FileHandle]:
        return (h for h in self._open.values() if isinstance(h, FileHandle))

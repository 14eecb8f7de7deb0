"""Entry files created ahead: a bounded pool of empty files where the disk tier writes blocks.

Creating a file is most of what a block's entry costs besides its copy and CRC: ext4 looks for
a free inode near the directory, 5 us of CPU in one directory of this machine's disk and
200-500 us in another, depending on how full the block groups around it are
(docs/notes/disk-write-behind.md). A cold read pays it for every block it writes behind, on
the cores the reader needs. So the disk tier creates files ahead when nothing is written, and
a block's write takes one (`take`): its entry is then an open of an existing empty file and
its write. The CPU is the same; it is spent between bursts instead of inside them. A mount
fills the pool in a thread of its own (`start_filling`): at once, then whenever no block was
written for `QUIET` seconds and the pool is short, `SLICE` files at a time (a write wakes it
and stops it, through `wrote`); a tier without it (`pffs warmup`) fills nothing and creates
each file as it writes.

Crash safety is the tier's as before. A pool file is an empty file that no index row names:
the orphan sweep removes it once older than its grace, so a crash or a kill leaves at most the
pool's count of empty files, for a while; `close` removes those left. No pool file is taken
older than `MAX_AGE` (a quarter of the sweep's grace): `fill` brings older ones up to date
(their mtime), and `take` discards one it finds older. Another process's sweep (a mount
starting, `pffs cache clear`) therefore never takes a pool file for an orphan: one it listed
as old and then removed after a write had made it an entry would leave a row naming no file.

Thread-safe: worker threads take files while another fills (one lock, never held for I/O).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

from pffs.cache.orphans import GRACE

# How many empty files are kept ready: 512 MiB of 4 MiB blocks, the largest cold burst a
# client's file (a checkpoint's shard, a Parquet set) writes behind at once. They cost an
# inode each and no data block.
POOL_FILES = 128
# The oldest a pool file may be when taken (see the module doc).
MAX_AGE = GRACE / 4
# The filler thread waits for this long without writes, and creates this many files before it
# looks again (a few milliseconds).
QUIET = 0.2
SLICE = 16


class EntryPool:
    def __init__(
        self,
        directory: str,
        new_name: Callable[[], str],
        size: int = POOL_FILES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`new_name`: a fresh entry file name, relative to `directory` (the tier's)."""
        self.directory = directory
        self.size = size
        self._new_name = new_name
        self._clock = clock
        self._ready: list[tuple[str, float]] = []  # (file name, when created or touched)
        self._lock = threading.Lock()
        self._closed = False
        self._last_write = -float("inf")
        self._wake = threading.Condition(self._lock)
        self._filler: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._ready)

    @property
    def short(self) -> bool:
        """Whether `fill` has files to create."""
        return not self._closed and len(self._ready) < self.size

    def wrote(self) -> None:
        """A block was written (with a pool file or not): the filler waits for quiet again."""
        with self._lock:
            self._last_write = self._clock()
            if self._filler is not None:
                self._wake.notify()

    def start_filling(self) -> None:
        """Fill the pool in a thread of its own, now and after each burst of writes; `close`
        stops it."""
        self._filler = threading.Thread(target=self._fill_when_quiet, name="pffs-entry-pool")
        self._filler.daemon = True
        self._filler.start()

    def _fill_when_quiet(self) -> None:
        while True:
            with self._lock:
                # Woken by a write, or every quarter of MAX_AGE to keep the files fresh.
                if not self._closed and len(self._ready) >= self.size:
                    self._wake.wait(MAX_AGE / 4)
                while not self._closed:
                    quiet = self._clock() - self._last_write
                    if quiet >= QUIET:
                        break
                    self._wake.wait(QUIET - quiet)
                if self._closed:
                    return
                held = len(self._ready)
            if self.fill(SLICE) and len(self._ready) <= held:
                with self._lock:  # none could be made (a full disk): not before a while
                    self._wake.wait(MAX_AGE / 4)

    def take(self) -> str | None:
        """An empty entry file created ahead (its name, relative to the directory), no longer
        the pool's; None when none is ready."""
        while True:
            with self._lock:
                if not self._ready:
                    return None
                name, stamp = self._ready.pop()
            if self._clock() - stamp <= MAX_AGE:
                return name
            self._remove(name)  # not kept up to date (no quiet spell since): not safe to use

    def fill(self, most: int) -> int:
        """Create up to `most` files, the pool's bound at most, and bring the ones near
        `MAX_AGE` up to date; how many the pool still misses (0: full)."""
        self._refresh()
        for _ in range(most):
            with self._lock:
                if self._closed or len(self._ready) >= self.size:
                    break
            name = self._new_name()
            try:
                fd = os.open(
                    os.path.join(self.directory, name),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                    0o600,
                )
            except OSError:  # a full disk, a directory cleared meanwhile: try again later
                break
            os.close(fd)
            with self._lock:
                kept = not self._closed
                if kept:
                    self._ready.append((name, self._clock()))
            if not kept:  # closed while this one was created
                self._remove(name)
        with self._lock:
            return 0 if self._closed else self.size - len(self._ready)

    def _refresh(self) -> None:
        """Set the mtime of files half way to MAX_AGE to now; drop those gone meanwhile."""
        now = self._clock()
        with self._lock:
            old = [entry for entry in self._ready if now - entry[1] > MAX_AGE / 2]
        for name, stamp in old:
            try:
                os.utime(os.path.join(self.directory, name))
            except OSError:  # removed by hand or by a clear: forget it
                fresh = None
            else:
                fresh = (name, now)
            with self._lock, contextlib.suppress(ValueError):  # taken meanwhile
                index = self._ready.index((name, stamp))
                if fresh is None:
                    del self._ready[index]
                else:
                    self._ready[index] = fresh

    def close(self) -> None:
        """Stop the filler and remove the files left; a `fill` still running removes what it
        creates after."""
        with self._lock:
            self._closed = True
            left, self._ready = self._ready, []
            self._wake.notify_all()
        if self._filler is not None:
            self._filler.join()
        for name, _stamp in left:
            self._remove(name)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self.directory, name))

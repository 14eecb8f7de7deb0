"""Filling the kernel's page cache around random reads (FUSE notify_store), so later reads
of the same neighbourhood are answered by the kernel and never reach Python.

A random read the kernel could not answer costs a FUSE round trip (about 120-135 us of pffs
CPU, most of it the request itself). After such a read of cached bytes, the pusher hands the
kernel a window of verified bytes around it: the 64 KiB chunk at first, a window that doubles
with each further miss of the handle while its reads stay random, up to `max_window`. Only
bytes the cache already holds are pushed (memory, else the disk tier, checksums verified);
the store is never asked. Sequential reads push nothing: the kernel's readahead already asks
for what comes next, and pushing too would copy every byte twice.

Never stale: a push carries the version its handle opened and is made only while the kernel
may keep that version's pages (the handle's version is the inode's `kernel_version`, which
open sets and writes clear). Whoever changes `kernel_version` calls `settle()` before
replying, which waits for a push that checked the old version to finish, so the open's page
cache invalidation (keep_cache false) always comes after it.

Never blocking a read: the kernel locks the pages of a read in progress, and storing into a
locked page waits until its read is answered. So pushes run in one thread of their own, fed
through a bounded queue (full: the push is dropped), never in the trio loop. The thread
touches bytes and the disk tier's files only (the cache's rule), through the reader that
`BlockCache.part_reader` hands over.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from pffs.cache.stats import CacheStats
from pffs.fs.handles import FileHandle

log = logging.getLogger("pffs.fs.pagecache")

KIB = 1 << 10
# The smallest push: the disk tier's checksum chunk, which a 4 KiB read has read and verified.
CHUNK = 64 * KIB
# Pushes waiting for the thread at most; a full queue drops the newest (readers never wait).
QUEUE_LIMIT = 8

# Windows remembered per handle (a few MiB at most); then forgotten.
PUSHING_LIMIT = 1 << 16

# Stores `data` into the kernel's page cache of inode `ino` at `offset` (pyfuse3.notify_store).
Store = Callable[[int, int, bytes | memoryview], None]
# Reads cached bytes in the pusher's thread; None when they are gone or damaged.
PartReader = Callable[[], bytes | memoryview | None]


@dataclass(frozen=True)
class _Push:
    handle: FileHandle
    offset: int
    read: PartReader
    # Set by the pusher thread once the window is stored or given up (threading.Event: the
    # one thing both sides touch).
    done: threading.Event = field(default_factory=threading.Event)


class PagePusher:
    """Pushes cached bytes around random reads into the kernel's page cache (see module doc).

    Off until `enable(store)` is called: without a kernel (tests of the VFS) there is nothing to
    push into.
    """

    def __init__(self, max_window: int, stats: CacheStats) -> None:
        self.max_window = max(CHUNK, max_window)
        # The cache's counters (so the metrics show them); the page_push* fields are bumped by
        # the pusher thread only, but page_push_dropped by trio tasks only.
        self.stats = stats
        self._store: Store | None = None
        self._queue: queue.Queue[_Push | None] = queue.Queue(QUEUE_LIMIT)
        self._thread: threading.Thread | None = None
        # Held by the thread from the version check to the end of the store (see settle).
        self._storing = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._store is not None

    def enable(self, store: Store) -> None:
        """Start pushing through `store` (the kernel edge's notify_store)."""
        self._store = store
        self._thread = threading.Thread(target=self._run, name="pffs-pagecache", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop pushing and wait for the thread: after this, `store` is never called again (the
        kernel session it writes to may then be closed)."""
        thread, self._thread, self._store = self._thread, None, None
        if thread is None:
            return
        while True:  # make room for the stop sign: what is queued is not worth pushing now
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        thread.join()

    # --- the trio side -----------------------------------------------------------------------

    def window(self, handle: FileHandle, offset: int, block_size: int) -> tuple[int, int] | None:
        """The range [start, stop) to push after a random read at `offset` reached pffs, or None
        (pushing off, a sequential reader, or a version the kernel may not keep).

        Each read that reaches pffs doubles the handle's window (the kernel is missing pages
        here, and reads stay random), up to `max_window` and the block; windows are aligned,
        so a larger one holds the smaller ones before it.
        """
        if self._store is None or handle.readahead.sequential:
            handle.push_window = 0
            return None
        if handle.inode.kernel_version != handle.version:
            return None
        limit = min(self.max_window, block_size)
        window = min(limit, handle.push_window * 2 if handle.push_window else CHUNK)
        handle.push_window = window
        start = offset - offset % window
        done = handle.pushing.get((start, window))
        if done is not None and not done.is_set():
            # Reads land in a window before it is stored: pushing it again would read and copy
            # the same bytes twice. One already stored is pushed again: the kernel evicted it.
            return None
        # Never past the block (one cache entry holds the bytes) nor the end of the file.
        block_end = start - start % block_size + block_size
        return start, min(start + window, block_end, handle.size)

    def push(self, handle: FileHandle, offset: int, read: PartReader) -> None:
        """Queue the bytes `read` returns for the kernel's page cache at `offset` (the start of
        the window `window` just gave); never waits."""
        if self._store is None:
            return
        job = _Push(handle, offset, read)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.stats.page_push_dropped += 1
            return
        if len(handle.pushing) >= PUSHING_LIMIT:
            handle.pushing.clear()
        handle.pushing[(offset, handle.push_window)] = job.done

    async def settle(self) -> None:
        """Wait until no push that checked an older `kernel_version` is still storing.

        Call it after changing an inode's `kernel_version` and before the open's reply, so the
        kernel's invalidation of old pages (an open without keep_cache) comes after every push
        of the old version. Costs nothing while no push is storing.
        """
        if self._storing.locked():
            await trio.to_thread.run_sync(self._wait_for_store)

    def _wait_for_store(self) -> None:
        with self._storing:
            pass

    # --- the pusher thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._push_now(job)
            except Exception:  # a push is an optimisation: it never takes the mount down
                self.stats.page_push_skipped += 1
                log.exception("pushing pages into the kernel's page cache failed")
            finally:
                job.done.set()

    def _push_now(self, job: _Push) -> None:
        handle = job.handle
        data = job.read()
        if not data:
            self.stats.page_push_skipped += 1
            return
        with self._storing:
            store = self._store
            # Checked under the lock: settle() waits for it, so no push of an old version can
            # land after an open's reply has told the kernel to drop that version's pages.
            if store is None or handle.inode.kernel_version != handle.version:
                self.stats.page_push_skipped += 1
                return
            try:
                store(handle.inode.ino, job.offset, data)
            except OSError as exc:
                # ENOENT: the kernel has forgotten the inode (closed and evicted): nothing to do.
                if exc.errno != errno.ENOENT:
                    log.debug("notify_store of inode %d refused: %s", handle.inode.ino, exc)
                self.stats.page_push_skipped += 1
                return
        self.stats.page_pushes += 1
        self.stats.page_pushed_bytes += len(data)

"""The kernel's page cache of the mount's files: the one owner of what it may hold of each
file, and of filling it around random reads (FUSE notify_store), so later reads of the same
neighbourhood are answered by the kernel and never reach Python.

`PageCache` is the part the facade (pffs.fs.vfs) composes; the read and write sides call it.
An open for reading keeps the kernel's pages only when they are of the version it opens
(`opened`: its keep_cache); a create, an open for writing and a truncate change the bytes
(`changing`); after a random read, the pusher fills the pages around it (`after_read`).

A random read the kernel could not answer costs a FUSE round trip, most of its CPU the request
itself. After such a read of cached bytes, the pusher hands the kernel a window of verified
bytes around it: the 64 KiB chunk at first, a window that doubles
with each further miss of the handle while its reads stay random, up to `max_window`. Only
bytes the cache already holds are pushed (memory, else the disk tier, checksums verified);
the store is never asked. Sequential reads push nothing: the kernel's readahead already asks
for what comes next, and pushing too would copy every byte twice. Nor do large random reads
(a page fault's read-around), which bring their neighbourhood themselves.

Never stale: a push carries the version its handle opened and is made only while the kernel
may keep that version's pages (the handle's version is the inode's `kernel_version`, which
`opened` sets and `changing` clears). Each change of `kernel_version` is followed by
`settle()` before the reply, which waits for a push that checked the old version to finish,
so the open's page cache invalidation (keep_cache false) comes after it.

Never stalled: that wait is bounded (`SETTLE_TIMEOUT`). A store into a page the kernel has
locked for a read in progress waits until that read is answered, and reads are answered by
FUSE tasks: were every FUSE task waiting in `settle` for such a store, nobody would answer the
read and the mount would hang. So once the bound passes the open answers anyway, and the push
in flight lands after the kernel dropped the old pages. The pusher makes up for it: after each
store it looks at the inode's `kernel_version` again and, when it changed during the store,
invalidates the inode's pages (`KernelCache.invalidate`, pyfuse3.invalidate_inode), from its
own thread, since an invalidation too waits for locked pages. Pushes still queued check the
version before they store, and are skipped. So no page of an old version stays in the
kernel: what a late store puts there is invalidated as soon as that store ends. What is left
is the time in between (the rest of that one store, then one call), when a read could be
answered from those pages, and only after an open has waited the whole bound for a stalled
push, that is, only where the mount would otherwise have hung. The invalidation also follows
a store that an open did wait for (the version changed during it): that is rare, and it costs
the kernel only pages the open's reply drops anyway.

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
from typing import Protocol

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import ObjectBlocks
from pffs.cache.readahead import LARGE_READ, Readahead
from pffs.cache.stats import CacheStats
from pffs.fs.inodeviews import Inode
from pffs.workers import run_blocking

log = logging.getLogger("pffs.fs.pagecache")

KIB = 1 << 10
# The smallest push: the disk tier's checksum chunk, which a 4 KiB read has read and verified.
CHUNK = 64 * KIB
# The largest window pushed around a random read: per byte a larger push costs little less,
# while the pusher's time per push and the page cache taken by bytes never read grow with it.
PUSH_MAX = 1 << 20
# Pushes waiting for the thread at most; a full queue drops the newest (readers never wait).
QUEUE_LIMIT = 8

# Windows remembered per handle (a few MiB at most); then forgotten.
PUSHING_LIMIT = 1 << 16

# The longest an open waits in `settle` for a push of the old version (see the module doc).
SETTLE_TIMEOUT = 2.0
# Reads cached bytes in the pusher's thread; None when they are gone or damaged.
PartReader = Callable[[], bytes | memoryview | None]


class KernelCache(Protocol):
    """The kernel's page cache as the pusher uses it (the kernel edge's pyfuse3 calls)."""

    def store(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        """Put `data` into inode `ino`'s pages at `offset` (notify_store)."""

    def invalidate(self, ino: int) -> None:
        """Drop inode `ino`'s pages (invalidate_inode)."""


@dataclass(eq=False)
class HandlePages:
    """The pusher's state of one read handle."""

    # Bytes pushed around the last random read that reached pffs (0: none yet, or sequential).
    window: int = 0
    # Its windows queued or pushed, by (start, size), each set once stored or given up.
    pushing: dict[tuple[int, int], threading.Event] = field(default_factory=dict)


class OpenFile(Protocol):
    """A file open for reading as the page cache sees it (pffs.fs.handles.ReadHandle)."""

    @property
    def inode(self) -> Inode: ...

    @property
    def blocks(self) -> ObjectBlocks: ...  # the version opened

    @property
    def readahead(self) -> Readahead: ...

    @property
    def pages(self) -> HandlePages: ...


class PageCache:
    """What the kernel's page cache may hold of each file (an inode's `kernel_version`), and
    the pusher that fills it from the block cache (see the module doc)."""

    def __init__(self, cache: BlockCache) -> None:
        self.cache = cache
        self.pusher = PagePusher(PUSH_MAX, cache.stats)

    def connect(self, kernel: KernelCache | None) -> None:
        """Push into `kernel` (the kernel edge's notify_store and invalidate_inode); None stops
        pushing, once the push under way is done."""
        if kernel is None:
            self.pusher.close()
        else:
            self.pusher.enable(kernel)

    async def opened(self, inode: Inode, version: str) -> bool:
        """An open for reading of `version`: whether the kernel may keep the pages it holds
        (keep_cache), true only when they came from that version. The kernel drops them at the
        reply otherwise, so no push of the old version may land after it."""
        keep_cache = inode.kernel_version == version
        inode.kernel_version = version
        if not keep_cache:
            await self.pusher.settle()
        return keep_cache

    async def changing(self, inode: Inode) -> None:
        """The file's bytes change (a create, an open for writing, a truncate): the kernel's
        pages may no longer be the store's, and no page of the version read may land after
        the reply."""
        inode.kernel_version = None
        await self.pusher.settle()

    def after_read(self, handle: OpenFile, offset: int, end: int) -> None:
        """After a read of [offset, end) reached pffs, hand the kernel the cached bytes around
        it when reads are random, so the next reads nearby are answered by its page cache.

        Not after a large read (the kernel's read-around of a page fault, its readahead): the
        kernel brought that neighbourhood itself, in READs as large as the window, so a push
        around one copies mostly its own bytes into the pages a second time, and costs the
        mount more than the few READs it saves (docs/notes/clients-machine-cpu.md)."""
        if not self.pusher.enabled or end - offset >= LARGE_READ:
            return
        window = self.pusher.window(handle, offset)
        if window is None:
            return
        start, stop = window
        blocks = handle.blocks
        [(index, first, last)] = blocks.spans(start, stop)  # a window never crosses a block
        read = self.cache.part_reader(blocks.key(index), first, last - first)
        if read is not None:
            self.pusher.push(handle, start, read)


@dataclass(frozen=True)
class _Push:
    handle: OpenFile
    offset: int
    read: PartReader
    # Set by the pusher thread once the window is stored or given up (threading.Event: the
    # one thing both sides touch).
    done: threading.Event = field(default_factory=threading.Event)


class PagePusher:
    """Pushes cached bytes around random reads into the kernel's page cache (see module doc).

    Off until `enable(kernel)` is called: without a kernel (tests of the VFS) there is nothing to
    push into.
    """

    def __init__(self, max_window: int, stats: CacheStats) -> None:
        self.max_window = max(CHUNK, max_window)
        # The cache's counters (so the metrics show them); the page_push* fields are bumped by
        # the pusher thread only, but page_push_dropped by trio tasks only.
        self.stats = stats
        self._kernel: KernelCache | None = None
        # How long `settle` waits (tests shorten it).
        self.settle_timeout = SETTLE_TIMEOUT
        self._queue: queue.Queue[_Push | None] = queue.Queue(QUEUE_LIMIT)
        self._thread: threading.Thread | None = None
        # Held by the thread from the version check to the end of the store (see settle).
        self._storing = threading.Lock()
        # `settle` waits for that lock in a worker thread, one open at a time.
        self._settling = trio.CapacityLimiter(1)

    @property
    def enabled(self) -> bool:
        return self._kernel is not None

    def enable(self, kernel: KernelCache) -> None:
        """Start pushing into `kernel` (the kernel edge's notify_store and invalidate_inode)."""
        self._kernel = kernel
        self._thread = threading.Thread(target=self._run, name="pffs-pagecache", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop pushing and wait for the thread: after this, the kernel is never called again
        (the session it writes to may then be closed)."""
        thread, self._thread, self._kernel = self._thread, None, None
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

    def window(self, handle: OpenFile, offset: int) -> tuple[int, int] | None:
        """The range [start, stop) to push after a random read at `offset` reached pffs, or None
        (pushing off, a sequential reader, or a version the kernel may not keep).

        Each read that reaches pffs doubles the handle's window (the kernel is missing pages
        here, and reads stay random), up to `max_window` and the block; windows are aligned,
        so a larger one holds the smaller ones before it.
        """
        pages, blocks = handle.pages, handle.blocks
        if self._kernel is None or handle.readahead.sequential:
            pages.window = 0
            return None
        if handle.inode.kernel_version != blocks.version:
            return None
        block_size = blocks.block_size
        limit = min(self.max_window, block_size)
        window = min(limit, pages.window * 2 if pages.window else CHUNK)
        pages.window = window
        start = offset - offset % window
        done = pages.pushing.get((start, window))
        if done is not None and not done.is_set():
            # Reads land in a window before it is stored: pushing it again would read and copy
            # the same bytes twice. One already stored is pushed again: the kernel evicted it.
            return None
        # Never past the block (one cache entry holds the bytes) nor the end of the file.
        block_end = start - start % block_size + block_size
        return start, min(start + window, block_end, blocks.size)

    def push(self, handle: OpenFile, offset: int, read: PartReader) -> None:
        """Queue the bytes `read` returns for the kernel's page cache at `offset` (the start of
        the window `window` just gave); never waits."""
        if self._kernel is None:
            return
        job = _Push(handle, offset, read)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.stats.page_push_dropped += 1
            return
        pushing = handle.pages.pushing
        if len(pushing) >= PUSHING_LIMIT:
            pushing.clear()
        pushing[(offset, handle.pages.window)] = job.done

    async def settle(self) -> None:
        """Wait until no push that checked an older `kernel_version` is still storing, for
        `settle_timeout` seconds at most.

        Call it after changing an inode's `kernel_version` and before the open's reply, so the
        kernel's invalidation of old pages (an open without keep_cache) comes after every push
        of the old version. Costs nothing while no push is storing. A push still storing when
        the time is up has its pages invalidated once it ends (see the module doc).
        """
        if self._storing.locked():
            settled = await run_blocking(self._settling, self._wait_for_store, self.settle_timeout)
            if not settled:
                log.info(
                    "a page cache push held for %.1f s: the open answers, and the pages of the"
                    " old version are invalidated once the push ends",
                    self.settle_timeout,
                )

    def _wait_for_store(self, timeout: float) -> bool:
        if not self._storing.acquire(timeout=timeout):
            return False
        self._storing.release()
        return True

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
        ino = handle.inode.ino
        with self._storing:
            kernel = self._kernel
            # Checked under the lock: settle() waits for it, so no push of an old version can
            # land after an open's reply has told the kernel to drop that version's pages.
            if kernel is None or handle.inode.kernel_version != handle.blocks.version:
                self.stats.page_push_skipped += 1
                return
            try:
                kernel.store(ino, job.offset, data)
            except OSError as exc:
                self._refused("notify_store", ino, exc)
                self.stats.page_push_skipped += 1
                return
            # Changed while the store waited: an open may have answered before it ended.
            late = handle.inode.kernel_version != handle.blocks.version
        self.stats.page_pushes += 1
        self.stats.page_pushed_bytes += len(data)
        if late:
            try:
                kernel.invalidate(ino)
            except OSError as exc:
                self._refused("invalidate_inode", ino, exc)

    @staticmethod
    def _refused(call: str, ino: int, exc: OSError) -> None:
        # ENOENT: the kernel has forgotten the inode (closed and evicted): nothing to do.
        if exc.errno != errno.ENOENT:
            log.debug("%s of inode %d refused: %s", call, ino, exc)

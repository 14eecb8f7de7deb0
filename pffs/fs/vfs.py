"""The file system's one facade: every operation the kernel adapter (pffs.fuse_ops) calls.

It composes the parts and routes each operation to the part that owns it: names in the hidden
`.pffs` directory first (pffs.fs.special), then names and directories (namespace), reads (reads),
writes of files (writes) and name changes (renames); an operation on an open handle goes by the
handle's role (handles), the `.pffs` files' handles included. The kernel's page cache
(pagecache) is shared by reads and writes. Read-only opens are told to preload (datasets),
which also takes the order lists written to `.pffs/preload` or its socket. It holds no
behaviour of its own beyond that routing, the open-files gauge and statfs. It never imports
pyfuse3: it speaks trio and pffs types, and is tested without a kernel.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from pffs import metrics
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, FuseConfig, MetaConfig, PreloadConfig
from pffs.errors import NotFound, PffsError, TooLarge, Unsupported
from pffs.fs.datasets import DatasetPreload
from pffs.fs.handles import (
    DirHandle,
    Handles,
    HiddenDirHandle,
    OrderHandle,
    ReadHandle,
    SnapshotHandle,
    WriteHandle,
)
from pffs.fs.inodes import ROOT_INODE, Inode
from pffs.fs.namespace import Namespace
from pffs.fs.orders import UNKNOWN_SENDER, Sender, refusal, report
from pffs.fs.pagecache import KernelCache, PageCache
from pffs.fs.parking import Parking
from pffs.fs.reads import Reader
from pffs.fs.renames import Renamer
from pffs.fs.special import HIDDEN_DIR, SpecialFiles
from pffs.fs.writes import StagedFiles, Writer
from pffs.routing.table import MountTable

if TYPE_CHECKING:  # a mount without a group never imports pffs.group
    from pffs.group.sources import Joined

log = logging.getLogger(__name__)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


class Vfs:
    """The filesystem, minus the kernel. `staging_dir` holds data being written."""

    def __init__(
        self,
        table: MountTable,
        meta: MetaConfig,
        fuse: FuseConfig,
        cache: BlockCache | None = None,
        *,
        staging_dir: str,
        dataset: PreloadConfig | None = None,
        tier: Joined | None = None,
    ) -> None:
        """`tier`: the cache group or shared tier the mount joined, asked before each store."""
        self.table = table
        # The cache comes with its policy (which sources stay in memory) set at construction.
        self.cache = cache or BlockCache(CacheConfig(disk_dir=None))
        self.handles = Handles()
        staged = StagedFiles()  # the writer's; the namespace reads it
        self.namespace = Namespace(table, meta, self.handles, staged.view)
        self.pages = PageCache(self.cache)
        parking = Parking(staging_dir, free_ratio=self.cache.config.free_ratio)
        self.reader = Reader(self.namespace, self.handles, self.cache, self.pages, parking, tier)
        self.writer = Writer(self.namespace, self.handles, fuse, staging_dir, staged, self.pages)
        self.renamer = Renamer(self.namespace, self.writer)
        dataset = dataset or PreloadConfig()
        self.special = SpecialFiles(self.namespace.mount_time, dataset.orders)
        # Whether writes are refused in every source alike (a file is in one: Writer.is_read_only),
        # None when the sources differ.
        flags = {fuse.read_only or mounted.read_only for mounted in table.mounted}
        self._sources_read_only = flags.pop() if len(flags) == 1 else None
        self.datasets = DatasetPreload(self.namespace, self.cache, dataset, tier)

    def attach(self, nursery: trio.Nursery) -> None:
        """Hand the VFS a nursery for background work (listings, preload, uploads, disk writes)."""
        self.namespace.attach(nursery)
        self.writer.attach(nursery)
        self.cache.attach(nursery)
        self.datasets.attach(nursery)

    def push_pages(self, kernel: KernelCache | None) -> None:
        """Fill the kernel's page cache around random reads through `kernel` (the kernel edge's
        notify_store and invalidate_inode, pffs.fs.pagecache); None stops it, once the push
        under way is done."""
        self.pages.connect(kernel)

    async def drain(self) -> None:
        """Finish background work (disk cache writes) before shutting down."""
        await self.cache.flush()

    def file_is_read_only(self, inode: Inode) -> bool:
        """is_read_only for a file's inode; without rebuilding its path (every lookup asks)
        when it is not one of ours and every source says the same."""
        if self._sources_read_only is not None and inode.ino not in self.special.inodes:
            return self._sources_read_only
        return self.is_read_only(inode.path)

    def is_read_only(self, path: str) -> bool:
        """Whether writes under tree path `path` are refused."""
        return self.special.is_read_only(path) or (
            not self.special.claims_path(path) and self.writer.is_read_only(path)
        )

    def direct_io(self, fh: int) -> bool:
        """Whether reads of this handle must bypass the kernel page cache (generated files)."""
        return isinstance(self.handles.get(fh), SnapshotHandle | OrderHandle)

    # --- names and attributes ----------------------------------------------------------------

    async def lookup(self, parent_ino: int, name: str) -> Inode:
        ours = self.special.lookup(parent_ino, name, self.namespace.inode(ROOT_INODE))
        if ours is not None:
            return ours
        self.cache.expect_reads()  # during the lookup's round trip, if it takes one
        return await self.namespace.lookup(parent_ino, name)

    async def getattr(self, ino: int) -> Inode:
        return self.special.inode(ino) or await self.namespace.getattr(ino)

    def forget(self, ino: int, count: int) -> None:
        self.namespace.forget(ino, count)  # ours are not in the namespace: a no-op for them

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        self.special.check_opendir(ino)
        if ino == self.special.dir.ino:
            return self.handles.add(HiddenDirHandle())
        return await self.namespace.opendir(ino)

    async def readdir(self, fh: int, start: int, emit: Callable[[str, Inode, int], bool]) -> None:
        handle = self.handles.get(fh)
        if isinstance(handle, HiddenDirHandle):
            for position, inode in enumerate(self.special.listed()[start:], start + 1):
                if not emit(inode.info.name, inode, position):
                    break
            return
        if isinstance(handle, DirHandle) and handle.inode.ino == ROOT_INODE:
            # Hidden: a store object named .pffs at the root is shadowed by ours, so hide it too.
            def hiding(name: str, inode: Inode, next_id: int) -> bool:
                return True if name == HIDDEN_DIR else emit(name, inode, next_id)

            await self.namespace.readdir(fh, start, hiding)
            return
        await self.namespace.readdir(fh, start, emit)

    def releasedir(self, fh: int) -> None:
        self.handles.pop(fh)

    # --- files -------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int, sender: Sender = UNKNOWN_SENDER) -> tuple[int, bool]:
        """Open a file for `sender` (the calling process: whose order list's report a `.pffs`
        handle reads). Returns (handle, keep_cache): see Reader.open."""
        for_writing = bool(flags & WRITE_FLAGS)
        ours = self.special.open(ino, for_writing, sender)
        if ours is not None:
            return self.handles.add(ours), False
        if for_writing:
            fh, keep_cache = await self.writer.open(ino, flags), False
        elif (staged_fh := self.writer.open_if_staged(ino)) is not None:
            fh, keep_cache = staged_fh, False
        else:
            fh, keep_cache = await self.reader.open(ino)
            self.datasets.opened(self.handles.reading(fh))
        metrics.OPEN_FILES.inc()
        return fh, keep_cache

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        handle = self._file(fh)
        if isinstance(handle, SnapshotHandle):
            return handle.content[offset : offset + size]
        if isinstance(handle, OrderHandle):
            return handle.report[offset : offset + size]
        if isinstance(handle, WriteHandle):
            return await self.writer.read(handle.staged, offset, size)
        return await self.reader.read(handle, offset, size)

    def _file(self, fh: int) -> ReadHandle | WriteHandle | SnapshotHandle | OrderHandle:
        handle = self.handles.get(fh)
        if handle is None or isinstance(handle, DirHandle | HiddenDirHandle):
            raise NotFound(f"file handle {fh} is not open")
        return handle

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if isinstance(handle, OrderHandle):
            try:
                await self._hand_over(handle)
            finally:
                self.special.release(handle)
        elif isinstance(handle, WriteHandle):
            metrics.OPEN_FILES.dec()
            await self.writer.release(handle)
        elif isinstance(handle, ReadHandle):
            metrics.OPEN_FILES.dec()
            handle.readahead.close()
            if handle.regions is not None:
                handle.regions.close()
            self.datasets.closed(handle)

    def statfs(self) -> dict[str, int]:
        """Large, constant figures: object stores have no meaningful capacity."""
        block = 4096
        blocks = (1 << 50) // block  # 1 PiB: big enough that tools never think it is full
        return {
            "f_bsize": block,
            "f_frsize": block,
            "f_blocks": blocks,
            "f_bfree": blocks,
            "f_bavail": blocks,
            "f_files": 1 << 32,
            "f_ffree": 1 << 32,
            "f_favail": 1 << 32,
            "f_namemax": 255,
        }

    # --- changes -----------------------------------------------------------------------------

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, Inode]:
        if self.special.claims_name(parent_ino, name):
            raise self.special.refuse("create")
        fh, inode = await self.writer.create(parent_ino, name, flags)
        metrics.OPEN_FILES.inc()
        return fh, inode

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self._file(fh)
        if isinstance(handle, OrderHandle):
            return self.special.write_order(handle, offset, data)
        if isinstance(handle, WriteHandle):
            return await self.writer.write(handle, offset, data)
        raise PffsError(f"file handle {fh} is not open for writing")

    async def flush(self, fh: int) -> None:
        handle = self._file(fh)
        if isinstance(handle, OrderHandle):  # an order list is handed over when it is closed
            await self._hand_over(handle)
        elif isinstance(handle, WriteHandle):
            await self.writer.flush(handle)

    async def _hand_over(self, handle: OrderHandle) -> None:
        paths = self.special.take_order(handle)  # TooLarge over a cap: refused, reported
        if paths:
            self.special.note_report(handle, await self.take_order(paths, handle.sender))

    async def take_order(self, paths: list[str], sender: Sender = UNKNOWN_SENDER) -> bytes:
        """Hand a job's order list to preload (from `.pffs/preload` or its socket,
        pffs.mounting.ordersocket); its report, for `sender` alone."""
        try:
            errors = await self.datasets.preload_paths(paths, self.special.limits.max_listed)
        except TooLarge as exc:
            log.warning("order list from %s refused: %s", sender, exc)
            return refusal(str(exc))
        log.info("order list from %s: %d paths, %d bad", sender, len(paths), len(errors))
        return report(len(paths) - len(errors), errors)

    async def fsync(self, fh: int) -> None:
        handle = self._file(fh)
        if isinstance(handle, OrderHandle):  # an order list is handed over as at close
            await self._hand_over(handle)
        elif isinstance(handle, WriteHandle):
            await self.writer.fsync(handle)

    async def setattr(self, ino: int, size: int | None) -> Inode:
        ours = self.special.inode(ino)
        if ours is not None:
            if size is None or ours is self.special.preload_file:  # `>` truncates it: nothing kept
                return ours
            raise self.special.refuse("truncate")
        if size is None:  # chmod, chown, touch: no effect, but refused where writes are
            inode = await self.namespace.getattr(ino)
            if self.file_is_read_only(inode):
                raise self.writer.write_refused("setattr", inode.path)
            return inode
        return await self.writer.setattr(ino, size)

    async def unlink(self, parent_ino: int, name: str) -> None:
        if self.special.claims_name(parent_ino, name):
            raise self.special.refuse("unlink")
        await self.renamer.unlink(parent_ino, name)

    def mknod(self, parent_ino: int, name: str, is_socket: bool, caller_tid: int) -> Inode:
        """Only the preload socket's bind (pffs.fs.special); no store keeps special files."""
        if is_socket and self.special.claims_name(parent_ino, name):
            return self.special.bind_socket(parent_ino, name, caller_tid)
        raise Unsupported("mknod: only regular files and directories can be stored")

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        if self.special.claims_name(parent_ino, name):
            raise self.special.refuse_mkdir(parent_ino, name)
        return await self.renamer.mkdir(parent_ino, name)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        if self.special.claims_name(parent_ino, name):
            raise self.special.refuse("rmdir")
        await self.renamer.rmdir(parent_ino, name)

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        if self.special.claims_name(old_parent, old_name) or self.special.claims_name(
            new_parent, new_name
        ):
            raise self.special.refuse("rename")
        await self.renamer.rename(old_parent, old_name, new_parent, new_name, flags)

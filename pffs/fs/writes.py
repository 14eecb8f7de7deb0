"""The write side of the VFS: create, write, flush/fsync, truncate, unlink, mkdir, rmdir, rename.

Data goes to a staging file (pffs.fs.staging) and reaches the store on close (flush) and fsync,
which return only once it is there, or with the upload's error. After a commit the tree shows
the new object at once: its inode takes what the store returned, the parent's cached listing is
dropped, and the block cache cannot serve old blocks because its keys carry the version.

Opening an existing object for writing without O_TRUNC copies it into the staging file first
(lazily: a truncate to zero before any write skips the copy), so overwrites, appends and random
writes work on any store, at the cost of reading the object once.

Directories: mkdir makes a marker ("dir/" on S3), rmdir refuses non-empty directories
(ENOTEMPTY), rename moves files, and directories where the store can (on S3 by copying then
deleting every object under the prefix: not atomic, and as slow as the copies). Renames between
two sources answer EXDEV so tools copy instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import trio

from pffs import metrics
from pffs.backends.base import (
    ObjectInfo,
    WritableBackend,
    is_valid_name,
    join,
    multipart,
    writable,
)
from pffs.config import FuseConfig
from pffs.errors import (
    Busy,
    CrossDevice,
    Exists,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    PffsError,
    ReadOnly,
    Unsupported,
    UsageError,
)
from pffs.fs.handles import Handles, WriteHandle
from pffs.fs.inodes import Inode
from pffs.fs.namespace import Namespace
from pffs.fs.pagecache import PageCache
from pffs.fs.staging import (
    Staged,
    StagingArea,
    StreamingUpload,
    fill_from_store,
    read_at,
    truncate,
    upload,
    write_at,
    write_manifest,
)
from pffs.routing.table import Mounted, MountTable
from pffs.workers import run_blocking

T = TypeVar("T")
log = logging.getLogger(__name__)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # from linux/fs.h
# Staging file operations at once (pwrite/pread/ftruncate in worker threads).
STAGING_THREADS = 8


class Writer:
    """Writes through the mount. `staging_dir` holds staged data (under the cache directory);
    `staged` (shared with the namespace) holds the files being written, by inode number;
    `pages` is told of every change of a file's bytes."""

    def __init__(
        self,
        namespace: Namespace,
        handles: Handles,
        fuse: FuseConfig,
        staging_dir: str,
        staged: dict[int, Staged],
        pages: PageCache,
    ) -> None:
        self.namespace = namespace
        self.handles = handles
        self.pages = pages
        self.table: MountTable = namespace.table
        self.fuse = fuse
        self.staging = StagingArea(staging_dir)
        self.staged = staged
        self._staging_limiter = trio.CapacityLimiter(STAGING_THREADS)
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """A nursery for uploads streamed while a file is written."""
        self._nursery = nursery

    def is_read_only(self, path: str) -> bool:
        """Whether writes under tree path `path` are refused (the mount's or its entry's flag)."""
        if self.fuse.read_only:
            return True
        routed = self.table.route(path)
        return routed is None or routed[0].read_only

    def write_refused(self, what: str, path: str) -> ReadOnly:
        return ReadOnly(f"{what}: /{path} is read-only")

    # --- helpers -----------------------------------------------------------------------------

    def _writable(self, path: str, what: str) -> tuple[Mounted, WritableBackend, str]:
        """The source, its writable store and the path for a write at `path`, or EROFS /
        ENOTSUP."""
        if self.is_read_only(path):
            raise self.write_refused(what, path)
        mounted, inside = self.namespace.route(path)
        backend = writable(mounted.backend)
        if backend is None:
            raise Unsupported(f"{what}: {mounted.backend.source_id} does not take writes")
        if not inside:
            raise Busy(f"{what}: /{path} is the root of a source")
        return mounted, backend, inside

    async def _staging_call(self, fn: Callable[..., T], *args: object) -> T:
        return await run_blocking(self._staging_limiter, fn, *args)

    async def _stage(self, inode: Inode, fill: bool) -> Staged:
        mounted, _, inside = self._writable(inode.path, "write")
        filled = fill and inode.info.size > 0
        state = "clean" if filled else "writing"
        staged: Staged = await self._staging_call(self.staging.create, mounted, inside, state)
        if filled:
            staged.unfilled = (inode.info.size, inode.info.version)
            staged.dirty = False
        self.staged[inode.ino] = staged
        return staged

    async def _fill(self, staged: Staged) -> None:
        """Copy the object into its staging file before its bytes are read or changed."""
        if staged.unfilled is None:
            return
        async with staged.lock:
            if staged.unfilled is None:
                return  # another task filled it while this one waited
            size, version = staged.unfilled
            await fill_from_store(staged, size, version, run_blocking)
            staged.unfilled = None

    def _start_streaming(self, staged: Staged) -> None:
        """Upload the parts of a file written from empty while it is being written."""
        backend = multipart(staged.mounted.backend)
        if self._nursery is not None and backend is not None and not staged.size:
            staged.streaming = StreamingUpload(staged, run_blocking, self._nursery)

    async def _mark_dirty(self, staged: Staged) -> None:
        """The manifest says "writing" before the first change since the last upload, so a
        crash recovery knows the staging file holds bytes the store does not."""
        if not staged.dirty:
            await self._staging_call(write_manifest, staged, "writing")

    def _touch(self, inode: Inode, staged: Staged) -> None:
        """The inode shows the staged size and a current mtime."""
        inode.info = dataclasses.replace(inode.info, size=staged.size, mtime=time.time())

    # --- files -------------------------------------------------------------------------------

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, Inode]:
        """A new, empty file, open for writing; it reaches the store at its first close."""
        parent = self.namespace.inode(parent_ino)
        if not parent.is_dir:
            raise NotADirectory(f"{parent.path} is not a directory")
        if not is_valid_name(name):
            raise UsageError(f"{name!r} is not a valid file name")
        path = join(parent.path, name)
        info = ObjectInfo(name, 0, time.time(), None, is_dir=False)
        self._writable(path, "create")
        inode = self.namespace.remember(path, info)
        staged = await self._stage(inode, fill=False)
        inode.lookups += 1  # create counts as a lookup for the kernel
        await self.pages.changing(inode)
        self.namespace.changed(path)
        self._start_streaming(staged)
        return self.open_staged(inode, staged), inode

    async def open(self, ino: int, flags: int) -> int:
        """Open for writing: the file's staging file, filled from the store unless O_TRUNC."""
        staged = self.staged.get(ino)
        if staged is None:
            inode = await self.namespace.getattr(ino, ask_store=True)
            if inode.is_dir:
                raise IsADirectory(f"{inode.path} is a directory")
            staged = await self._stage(inode, fill=not flags & os.O_TRUNC)
        inode = self.namespace.inode(ino)
        await self.pages.changing(inode)
        fh = self.open_staged(inode, staged)
        if flags & os.O_TRUNC:
            await self._truncate(inode, staged, 0)
            self._start_streaming(staged)
        return fh

    def open_staged(self, inode: Inode, staged: Staged) -> int:
        """A handle on a file being written: its reads and writes go to the staging file."""
        staged.handles += 1
        return self.handles.add(WriteHandle(inode, staged))

    async def read(self, staged: Staged, offset: int, size: int) -> bytes:
        """Bytes of a file being written, from its staging file."""
        await self._fill(staged)
        return await self._staging_call(read_at, staged, offset, size)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self.handles.file(fh)
        if not isinstance(handle, WriteHandle):
            raise PffsError(f"{handle.inode.path} is not open for writing")
        staged = handle.staged
        await self._fill(staged)
        await self._mark_dirty(staged)
        written: int = await self._staging_call(write_at, staged, offset, data)
        metrics.STAGED_BYTES.inc(written)
        staged.size = max(staged.size, offset + written)
        staged.dirty = True
        self._touch(handle.inode, staged)
        if staged.streaming is not None:
            staged.streaming.wrote(offset)
        return written

    async def flush(self, fh: int) -> None:
        """close(): upload what changed; the error, if any, is close's."""
        handle = self.handles.file(fh)
        if not isinstance(handle, WriteHandle):
            return
        staged = handle.staged
        try:
            await self._commit(handle.inode, staged)
        except PffsError:
            if staged.handles == 1:  # the writer's last close: its content is complete
                with contextlib.suppress(OSError):
                    await self._staging_call(write_manifest, staged, "closed")
            raise

    async def fsync(self, fh: int) -> None:
        """fsync(): upload what changed; the error, if any, is fsync's. The file stays open,
        so a failed upload leaves its data marked as still being written."""
        handle = self.handles.file(fh)
        if isinstance(handle, WriteHandle):
            await self._commit(handle.inode, handle.staged)

    async def release(self, handle: WriteHandle) -> None:
        """A handle on a file being written is closed; the last one retires the staging file."""
        staged = handle.staged
        staged.handles -= 1
        if staged.handles > 0:
            return
        inode = handle.inode
        if staged.dirty:  # changed since close's flush (through mmap), or its upload failed
            with contextlib.suppress(PffsError):  # logged, and the data is kept
                await self._commit(inode, staged)
        await self._retire(inode.ino, staged)
        if inode.lookups == 0:
            self.namespace.inodes.drop(inode)

    async def _commit(self, inode: Inode, staged: Staged) -> None:
        """Upload the staged file if it changed since its last upload."""
        if not staged.dirty or staged.unlinked:
            return  # nothing to upload: not even the object's bytes to fetch first
        await self._fill(staged)
        async with staged.lock:
            if not staged.dirty or staged.unlinked:
                return
            source = staged.mounted.backend.source_id
            try:
                info = await upload(staged, run_blocking)
            except PffsError as exc:
                metrics.UPLOAD_FAILURES.labels(source).inc()
                log.error(
                    "upload of %s failed (%s); data kept in %s", staged.where, exc, staged.file
                )
                raise
            metrics.UPLOADS.labels(source).inc()
            metrics.UPLOADED_BYTES.labels(source).inc(staged.size)
            staged.dirty = False
            await self._staging_call(write_manifest, staged, "clean")
        path = inode.path
        inode.info = dataclasses.replace(info, name=path.rpartition("/")[2])
        inode.expires = self.namespace.now() + self.namespace.meta.attr_ttl
        self.namespace.changed(path)

    async def setattr(self, ino: int, size: int | None) -> Inode:
        """Truncate (or extend) to `size`; modes, owners and times are not kept by the stores."""
        inode = self.namespace.inode(ino)
        if size is None:
            return await self.namespace.getattr(ino)
        if inode.is_dir:
            raise IsADirectory(f"{inode.path} is a directory")
        await self.pages.changing(inode)
        staged = self.staged.get(ino)
        if staged is not None:
            await self._truncate(inode, staged, size)
            return inode
        # `truncate -s` without an open file: stage, change, upload, done.
        await self.namespace.getattr(ino, ask_store=True)
        staged = await self._stage(inode, fill=True)
        staged.handles += 1
        try:
            await self._truncate(inode, staged, size)
            await self._commit(inode, staged)
        finally:
            staged.handles -= 1
            await self._retire(ino, staged)
        return inode

    async def _retire(self, ino: int, staged: Staged) -> None:
        """Its last handle is gone: drop the staging file, or keep it if its data is not stored."""
        if self.staged.get(ino) is staged:
            del self.staged[ino]
        streaming, staged.streaming = staged.streaming, None
        if streaming is not None:  # unlinked, or its commit failed: abort what was sent
            streaming.give_up()
            await streaming.finish()
        if staged.dirty and not staged.unlinked:
            await self._staging_call(StagingArea.keep, staged)
        else:
            await self._staging_call(StagingArea.discard, staged)

    async def _truncate(self, inode: Inode, staged: Staged, size: int) -> None:
        if staged.streaming is not None and size != staged.size:
            staged.streaming.give_up()
        if size == 0:
            staged.unfilled = None  # nothing of the old bytes is needed
        else:
            await self._fill(staged)
        await self._mark_dirty(staged)
        await self._staging_call(truncate, staged, size)
        staged.size = size
        staged.dirty = True
        self._touch(inode, staged)

    # --- names -------------------------------------------------------------------------------

    async def unlink(self, parent_ino: int, name: str) -> None:
        path = join(self.namespace.inode(parent_ino).path, name)
        mounted, backend, inside = self._writable(path, "unlink")
        if self.table.leads_to_mount(path):
            raise Busy(f"/{path} leads to a mount table entry")
        inode = await self.namespace.resolve(parent_ino, name)
        if inode.is_dir:
            raise IsADirectory(f"/{path} is a directory")
        staged = self.staged.get(inode.ino)
        if staged is not None:
            staged.unlinked = True  # its data must not come back at close
            staged.unfilled = None
            del self.staged[inode.ino]
        try:
            await run_blocking(mounted.limiter, backend.delete, inside)
        except NotFound:
            if staged is None:
                raise
        self.namespace.gone(path)

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        parent = self.namespace.inode(parent_ino)
        if not is_valid_name(name):
            raise UsageError(f"{name!r} is not a valid directory name")
        path = join(parent.path, name)
        mounted, backend, inside = self._writable(path, "mkdir")
        try:
            await self.namespace.resolve(parent_ino, name)
        except NotFound:
            pass
        else:
            raise Exists(f"/{path} already exists")
        info = await run_blocking(mounted.limiter, backend.make_dir, inside)
        inode = self.namespace.remember(path, dataclasses.replace(info, name=name))
        inode.lookups += 1
        self.namespace.changed(path)
        return inode

    async def rmdir(self, parent_ino: int, name: str) -> None:
        path = join(self.namespace.inode(parent_ino).path, name)
        if self.table.leads_to_mount(path):
            raise Busy(f"/{path} is or leads to a mount table entry")
        mounted, backend, inside = self._writable(path, "rmdir")
        inode = await self.namespace.resolve(parent_ino, name)
        if not inode.is_dir:
            raise NotADirectory(f"/{path} is not a directory")
        await self._require_empty(mounted, inside, path)
        await run_blocking(mounted.limiter, backend.remove_dir, inside)
        self.namespace.gone(path)

    async def _require_empty(self, mounted: Mounted, inside: str, path: str) -> None:
        def first_entry() -> list[ObjectInfo]:
            return list(itertools.islice(mounted.backend.list(inside), 1))

        if await run_blocking(mounted.limiter, first_entry):
            raise NotEmpty(f"/{path} is not empty")

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        """Rename within one source; across two, EXDEV tells tools like mv to copy instead."""
        old_path = join(self.namespace.inode(old_parent).path, old_name)
        new_path = join(self.namespace.inode(new_parent).path, new_name)
        if flags & RENAME_EXCHANGE:
            raise Unsupported("rename: exchanging two names is not supported")
        old_route, new_route = self.table.route(old_path), self.table.route(new_path)
        if old_route and new_route and old_route[0] is not new_route[0]:
            raise CrossDevice(f"rename /{old_path} -> /{new_path}: they are in different sources")
        mounted, backend, old_inside = self._writable(old_path, "rename")
        _, _, new_inside = self._writable(new_path, "rename")
        if self.table.leads_to_mount(old_path) or self.table.leads_to_mount(new_path):
            raise Busy(f"rename /{old_path} -> /{new_path}: a mount table entry is in the way")
        if not is_valid_name(new_name):
            raise UsageError(f"{new_name!r} is not a valid name")
        source = await self.namespace.resolve(old_parent, old_name)
        await self._check_target(source, new_parent, new_name, new_path, flags)
        staged = self.staged.get(source.ino)
        if staged is not None:
            await self._commit(source, staged)  # the store must hold what is renamed
        await run_blocking(mounted.limiter, backend.rename, old_inside, new_inside)
        self.namespace.moved(old_path, new_path, new_inside)
        for moved in list(self.staged.values()):  # manifests name the new path from now on
            if moved.path_in_source.startswith(new_inside) and moved.fd >= 0:
                state = "writing" if moved.dirty else "clean"
                await self._staging_call(write_manifest, moved, state)

    async def _check_target(
        self, source: Inode, new_parent: int, new_name: str, new_path: str, flags: int
    ) -> None:
        try:
            target = await self.namespace.resolve(new_parent, new_name)
        except NotFound:
            return
        if flags & RENAME_NOREPLACE:
            raise Exists(f"/{new_path} exists")
        if target.is_dir and not source.is_dir:
            raise IsADirectory(f"/{new_path} is a directory")
        if source.is_dir and not target.is_dir:
            raise NotADirectory(f"/{new_path} is not a directory")
        if target.is_dir:
            mounted, inside = self.namespace.route(new_path)
            await self._require_empty(mounted, inside, new_path)

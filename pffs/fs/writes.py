"""The write side of the VFS for files: create, open for writing, write, flush/fsync, truncate.

Data goes to a staging file (pffs.fs.staging) and reaches the store on close (flush) and fsync,
which return only once it is there, or with the upload's error. After a commit the tree shows
the new object at once: its inode takes what the store returned, the parent's cached listing is
dropped, and the block cache cannot serve old blocks because its keys carry the version.

Opening an existing object for writing without O_TRUNC copies it into the staging file first
(lazily: a truncate to zero before any write skips the copy), so overwrites, appends and random
writes work on any store, at the cost of reading the object once.

The writer owns the registry of files being written (`StagedFiles`): the namespace reads it,
and name changes (pffs.fs.renames) ask the writer to commit or drop a file in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
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
    IsADirectory,
    NotADirectory,
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
# Staging file operations at once (pwrite/pread/ftruncate in worker threads).
STAGING_THREADS = 8


class StagedFiles:
    """The files being written, by inode number. The writer alone changes it; the namespace
    reads `view` (files being written are not in the store, or its listings, yet)."""

    def __init__(self) -> None:
        self._by_ino: dict[int, Staged] = {}
        self.view: Mapping[int, Staged] = MappingProxyType(self._by_ino)

    def get(self, ino: int) -> Staged | None:
        return self._by_ino.get(ino)

    def add(self, ino: int, staged: Staged) -> None:
        self._by_ino[ino] = staged

    def remove(self, ino: int, staged: Staged | None = None) -> None:
        """Forget `ino`'s file (only if it is still `staged`, when given)."""
        if staged is None or self._by_ino.get(ino) is staged:
            self._by_ino.pop(ino, None)

    def __len__(self) -> int:
        return len(self._by_ino)

    def __iter__(self) -> Iterator[Staged]:
        return iter(list(self._by_ino.values()))


class Writer:
    """Writes of files through the mount. `staging_dir` holds staged data (under the cache
    directory); `staged` holds the files being written (the writer is its one owner);
    `pages` is told of every change of a file's bytes."""

    def __init__(
        self,
        namespace: Namespace,
        handles: Handles,
        fuse: FuseConfig,
        staging_dir: str,
        staged: StagedFiles,
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

    def writable(self, path: str, what: str) -> tuple[Mounted, WritableBackend, str]:
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
        mounted, _, inside = self.writable(inode.path, "write")
        filled = fill and inode.info.size > 0
        state = "clean" if filled else "writing"
        staged: Staged = await self._staging_call(self.staging.create, mounted, inside, state)
        if filled:
            staged.unfilled = (inode.info.size, inode.info.version)
            staged.dirty = False
        self.staged.add(inode.ino, staged)
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
        self.writable(path, "create")
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

    def open_if_staged(self, ino: int) -> int | None:
        """A reading open of a file being written: a handle on its staging file, or None when
        the file is not being written."""
        staged = self.staged.get(ino)
        return None if staged is None else self.open_staged(self.namespace.inode(ino), staged)

    def open_staged(self, inode: Inode, staged: Staged) -> int:
        """A handle on a file being written: its reads and writes go to the staging file."""
        staged.handles += 1
        return self.handles.add(WriteHandle(inode, staged))

    async def read(self, staged: Staged, offset: int, size: int) -> bytes:
        """Bytes of a file being written, from its staging file."""
        await self._fill(staged)
        return await self._staging_call(read_at, staged, offset, size)

    async def write(self, handle: WriteHandle, offset: int, data: bytes) -> int:
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

    async def flush(self, handle: WriteHandle) -> None:
        """close(): upload what changed; the error, if any, is close's."""
        staged = handle.staged
        try:
            await self._commit(handle.inode, staged)
        except PffsError:
            if staged.handles == 1:  # the writer's last close: its content is complete
                with contextlib.suppress(OSError):
                    await self._staging_call(write_manifest, staged, "closed")
            raise

    async def fsync(self, handle: WriteHandle) -> None:
        """fsync(): upload what changed; the error, if any, is fsync's. The file stays open,
        so a failed upload leaves its data marked as still being written."""
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
        self.staged.remove(ino, staged)
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

    # --- for name changes (pffs.fs.renames) ----------------------------------------------------

    def unlinked(self, ino: int) -> bool:
        """A file was unlinked: if it is being written, its data must not come back at close.
        Whether it was being written."""
        staged = self.staged.get(ino)
        if staged is None:
            return False
        staged.unlinked = True
        staged.unfilled = None
        self.staged.remove(ino)
        return True

    async def commit_if_staged(self, inode: Inode) -> None:
        """Upload a file being written, if it is one, so the store holds what is renamed."""
        staged = self.staged.get(inode.ino)
        if staged is not None:
            await self._commit(inode, staged)

    async def renamed(self, new_inside: str) -> None:
        """Manifests of the files being written under `new_inside` name their new path."""
        for moved in self.staged:
            if moved.path_in_source.startswith(new_inside) and moved.fd >= 0:
                state = "writing" if moved.dirty else "clean"
                await self._staging_call(write_manifest, moved, state)

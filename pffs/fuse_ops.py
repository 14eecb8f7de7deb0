"""The kernel edge: pyfuse3 Operations over the VFS, and the one place errors become errno.

This is the ONLY module that imports pyfuse3. Every handler goes through `_errno_boundary`: a
pffs error becomes its errno, anything unexpected is logged with its traceback and becomes EIO.
Nothing else may escape a handler, because pyfuse3 ends the whole filesystem when one does.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from pffs import metrics
from pffs.config import MountConfig
from pffs.errors import MountFailed, NotFound, PffsError, Unsupported
from pffs.fs.inodes import Inode
from pffs.fs.orders import Sender
from pffs.fs.special import PRELOAD_SOCKET_INO
from pffs.fs.vfs import Vfs
from pffs.logfile import reopen_log_files

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("pffs.fuse")


def _errno_boundary(
    handler: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    # Counted and timed here, so every operation is, at one label lookup per process.
    op = metrics.fuse_op(handler.__name__)

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            result = await handler(*args, **kwargs)
        except pyfuse3.FUSEError as exc:
            op.done(started, exc.errno)
            raise
        except PffsError as exc:
            op.done(started, exc.errno)
            level = logging.DEBUG if exc.errno in (errno.ENOENT, errno.ENOTDIR) else logging.WARNING
            log.log(level, "%s: %s", handler.__name__, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception:
            op.done(started, errno.EIO)
            log.exception("%s failed unexpectedly", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
        op.done(started)
        return result

    return wrapper


class PffsOperations(pyfuse3.Operations):
    """Translate FUSE requests into VFS calls and VFS answers into FUSE replies."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, vfs: Vfs, config: MountConfig) -> None:
        super().__init__()
        self.vfs = vfs
        self.config = config
        # Set once the kernel's INIT request has been answered (see _after_init).
        self.initialized = trio.Event()

    def init(self) -> None:
        self.initialized.set()

    # --- attributes --------------------------------------------------------------------------

    def _entry(self, inode: Inode) -> pyfuse3.EntryAttributes:
        fuse, meta = self.config.fuse, self.config.meta
        is_dir, size, mtime = inode.stat_fields()
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(inode.ino)
        attr.generation = 0
        attr.entry_timeout = meta.entry_ttl
        attr.attr_timeout = meta.attr_ttl
        if is_dir:
            attr.st_mode = pyfuse3.ModeT(stat.S_IFDIR | fuse.dir_mode)
            attr.st_nlink = 2
        elif inode.ino == PRELOAD_SOCKET_INO:  # writable by whom `.pffs/preload` is
            attr.st_mode = pyfuse3.ModeT(stat.S_IFSOCK | fuse.file_mode)
            attr.st_nlink = 1
        else:
            read_only = self.vfs.file_is_read_only(inode)
            mode = fuse.file_mode & ~0o222 if read_only else fuse.file_mode
            attr.st_mode = pyfuse3.ModeT(stat.S_IFREG | mode)
            attr.st_nlink = 1
        attr.st_uid = fuse.uid
        attr.st_gid = fuse.gid
        attr.st_rdev = 0
        attr.st_size = size
        attr.st_blksize = 1 << 20  # large I/O hint: tools like cp then read in big chunks
        attr.st_blocks = (size + 511) // 512
        mtime_ns = int(mtime * 1e9)
        attr.st_atime_ns = mtime_ns
        attr.st_mtime_ns = mtime_ns
        attr.st_ctime_ns = mtime_ns
        return attr

    @_errno_boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        try:
            inode = await self.vfs.lookup(parent_inode, os.fsdecode(name))
        except NotFound:
            negative_ttl = self.config.meta.negative_ttl
            if negative_ttl <= 0:
                raise
            # A negative entry: the kernel answers "no such file" itself for the negative TTL
            # (a Python import or a shell's PATH search asks for many absent names). Creating
            # the name through the mount replaces it at once.
            absent = pyfuse3.EntryAttributes()
            absent.st_ino = pyfuse3.InodeT(0)
            absent.entry_timeout = negative_ttl
            return absent
        return self._entry(inode)

    @_errno_boundary
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self.vfs.getattr(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        # forget has no reply, so it must never raise.
        for ino, count in inode_list:
            try:
                self.vfs.forget(ino, count)
            except Exception:
                log.exception("forget(%d) failed", ino)

    # --- directories -------------------------------------------------------------------------

    @_errno_boundary
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        return pyfuse3.FileHandleT(await self.vfs.opendir(inode))

    @_errno_boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        def emit(name: str, inode: Inode, next_id: int) -> bool:
            return bool(
                pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(inode), next_id)
            )

        await self.vfs.readdir(fh, start_id, emit)

    @_errno_boundary
    async def releasedir(self, fh: int) -> None:
        self.vfs.releasedir(fh)

    # --- files -------------------------------------------------------------------------------

    @_errno_boundary
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        fh, keep_cache = await self.vfs.open(inode, flags, Sender(ctx.uid, ctx.pid))
        info = pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fh), keep_cache=keep_cache)
        # Generated files (.pffs/stats) have no fixed size: the kernel must not cache or clip.
        info.direct_io = self.vfs.direct_io(fh)
        return info

    @_errno_boundary
    async def read(self, fh: int, off: int, size: int) -> bytes:
        # pyfuse3 takes any contiguous buffer: a memoryview of a cached block saves a copy.
        return await self.vfs.read(fh, off, size)  # type: ignore[return-value]

    @_errno_boundary
    async def release(self, fh: int) -> None:
        await self.vfs.release(fh)

    @_errno_boundary
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        for key, value in self.vfs.statfs().items():
            setattr(data, key, value)
        return data

    # --- writes ------------------------------------------------------------------------------

    @_errno_boundary
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        fh, inode = await self.vfs.create(parent_inode, os.fsdecode(name), flags)
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fh)), self._entry(inode)

    @_errno_boundary
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.vfs.write(fh, off, buf)

    @_errno_boundary
    async def flush(self, fh: int) -> None:
        if self.config.fuse.read_only:
            # A read-only mount has nothing to hand over at close: no file is written (pffs
            # refuses every write with EROFS), and an order list is taken at fsync or release
            # instead (pffs.jobs fsyncs it). ENOSYS makes the kernel stop sending FLUSH for
            # good, one request less per file a data loader reads (pyfuse3 has no
            # FOPEN_NOFLUSH to say so per open).
            raise pyfuse3.FUSEError(errno.ENOSYS)
        await self.vfs.flush(fh)

    @_errno_boundary
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.vfs.fsync(fh)

    @_errno_boundary
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        size = attr.st_size if fields.update_size else None
        return self._entry(await self.vfs.setattr(inode, size))

    @_errno_boundary
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.vfs.unlink(parent_inode, os.fsdecode(name))

    @_errno_boundary
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self._entry(await self.vfs.mkdir(parent_inode, os.fsdecode(name)))

    @_errno_boundary
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.vfs.rmdir(parent_inode, os.fsdecode(name))

    @_errno_boundary
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        await self.vfs.rename(
            parent_inode_old,
            os.fsdecode(name_old),
            parent_inode_new,
            os.fsdecode(name_new),
            flags,
        )

    # Special files and links have no place in an object store: the one socket pffs binds in
    # `.pffs` itself aside.

    @_errno_boundary
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = self.vfs.mknod(parent_inode, os.fsdecode(name), stat.S_ISSOCK(mode), ctx.pid)
        return self._entry(inode)

    @_errno_boundary
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise Unsupported("symlink: links cannot be stored")

    @_errno_boundary
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise Unsupported("link: links cannot be stored")


def serve(
    ops: PffsOperations,
    mountpoint: str,
    on_ready: Callable[[], None] | None = None,
    after_init: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Mount `ops` at `mountpoint` and serve requests until unmounted or sent SIGINT/SIGTERM.

    `on_ready` runs once the mount is live, `after_init` once the kernel's INIT is answered (a
    task of the serving loop, cancelled when it ends).

    The kernel mount is always taken down on the way out, so no dead mount is left behind
    when the loop ends for any reason short of kill -9.
    """
    fuse = ops.config.fuse
    options = set(pyfuse3.default_options)
    # fsname shows in `mount` and lets pffs recognise its own (dead) mounts by type fuse.pffs.
    options |= {f"fsname={ops.config.name.replace(',', '_')}", "subtype=pffs"}
    # --read-only is pffs's to enforce, not the kernel's: a kernel `ro` mount would refuse the
    # order list written to .pffs/preload too (docs/notes/readonly-order.md).
    if fuse.allow_other:
        options.add("allow_other")
    try:
        pyfuse3.init(ops, mountpoint, options)
    except RuntimeError as exc:
        hint = "is /dev/fuse present and open to this user, and fuse3 installed?"
        if fuse.allow_other and os.getuid() != 0:  # fusermount3's own message is not shown
            hint = "--allow-other needs user_allow_other in /etc/fuse.conf for a non-root user"
        raise MountFailed(f"cannot mount at {mountpoint} ({exc}): {hint}") from None
    try:
        trio.run(_serve_until_done, ops, on_ready, after_init)
    finally:
        pyfuse3.close(unmount=True)


async def _serve_until_done(
    ops: PffsOperations,
    on_ready: Callable[[], None] | None,
    after_init: Callable[[], Awaitable[object]] | None,
) -> None:
    async with trio.open_nursery() as nursery:
        ops.vfs.attach(nursery)
        nursery.start_soon(_terminate_on_signal)
        if after_init is not None:
            nursery.start_soon(_after_init, ops, after_init)
        if on_ready is not None:
            on_ready()
        # Cached bytes around random reads go to the kernel's page cache (pffs.fs.pagecache);
        # stopped before the session closes, since notify_store writes to it.
        ops.vfs.push_pages(_KernelPages())
        try:
            await pyfuse3.main(min_tasks=4, max_tasks=ops.config.fuse.max_tasks)
        finally:
            ops.vfs.push_pages(None)
        log.info("file system unmounted, exiting")
        with trio.move_on_after(30):  # blocks already fetched are worth keeping on disk
            await ops.vfs.drain()
        nursery.cancel_scope.cancel()


class _KernelPages:
    """The kernel's page cache for pffs.fs.pagecache (its KernelCache), called from its thread."""

    def store(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        # pyfuse3 takes any contiguous buffer (its stub says bytes): a view of a block saves a
        # copy.
        pyfuse3.notify_store(ino, offset, data)  # type: ignore[arg-type]

    def invalidate(self, ino: int) -> None:
        pyfuse3.invalidate_inode(pyfuse3.InodeT(ino))


async def _after_init(ops: PffsOperations, action: Callable[[], Awaitable[object]]) -> None:
    """Run `action` once INIT is answered, not before. The kernel sets the mount's readahead
    from INIT's reply (128 KiB with libfuse), undoing an earlier change, and a 128 KiB readahead
    means 128 KiB read requests, eight times as many as 1 MiB ones."""
    await ops.initialized.wait()
    await trio.sleep(0)  # init() runs before libfuse sends the reply: let it go out first
    await action()


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            # SIGHUP to a mount writing a log file is logrotate's: the file is opened again.
            # On a terminal it is the terminal going away: unmount.
            if signum == signal.SIGHUP and reopen_log_files():
                log.info("received SIGHUP: the log file is opened again")
                continue
            log.info("received %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return

"""The namespace: inodes, attribute / directory / negative caches, and open handles.

The VFS speaks trio and pffs types only; it never imports pyfuse3 (fuse_ops.py adapts it to the
kernel). Blocking backend calls run in worker threads through `trio.to_thread.run_sync` under one
CapacityLimiter per backend; every piece of shared state here is touched only from trio tasks.

Inode numbers are stable for the life of a mount: a path keeps its number even after the kernel
forgets it and it is looked up again.

Offline: when the store cannot be reached (a Transient error after the retry policy gave up),
what the mount already knows is served stale rather than failed: attributes of known entries
and expired directory listings, each then trusted for one more TTL before the store is asked
again. Their blocks come from the cache as usual; only what was never seen fails, with EIO.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from pffs.backends.base import ObjectInfo, join
from pffs.cache.blocks import BlockCache, BlockKey, Deliver
from pffs.cache.readahead import Readahead
from pffs.config import CacheConfig, FuseConfig, MetaConfig
from pffs.errors import (
    Corrupted,
    IsADirectory,
    NotADirectory,
    NotFound,
    ReadOnly,
    Transient,
    Unsupported,
)
from pffs.fs.staging import Staged, read_at
from pffs.routing.table import Mounted, MountTable

T = TypeVar("T")
log = logging.getLogger("pffs.fs.vfs")

ROOT_INODE = 1
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
# Entries pulled from a backend listing per worker-thread hop: large enough that thread
# switches cost nothing next to the listing, small enough that `ls` starts printing at once.
LIST_CHUNK = 1000
# Directory listings kept at once before expired ones are swept out.
MAX_LISTINGS = 1024
# Lookups in one directory that ask the store before the directory is listed in the background.
LIST_AFTER_LOOKUPS = 3


@dataclass(eq=False)
class Inode:
    """One known path. `info` is what the store said; `expires` when to ask again."""

    ino: int
    path: str
    info: ObjectInfo
    expires: float
    lookups: int = 0
    # The object version whose pages the kernel may still hold (see open's keep_cache).
    kernel_version: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.info.is_dir


@dataclass(eq=False)
class DirListing:
    """A directory's entries as they stream in from the store, in the store's order.

    A complete and unexpired listing also answers lookups (including "no such name") without
    asking the store.
    """

    entries: dict[str, ObjectInfo] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    complete: bool = False
    expires: float = 0.0
    source: Iterator[ObjectInfo] | None = None
    lock: trio.Lock = field(default_factory=trio.Lock)

    def add(self, info: ObjectInfo) -> None:
        known = self.entries.get(info.name)
        if known is None:
            self.names.append(info.name)
            self.entries[info.name] = info
        elif info.is_dir and not known.is_dir:
            # A key that is both an object and a prefix: the directory wins.
            self.entries[info.name] = info


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


@dataclass(eq=False)
class DirHandle:
    inode: Inode
    listing: DirListing


class Vfs:
    """The filesystem, minus the kernel."""

    def __init__(
        self,
        table: MountTable,
        meta: MetaConfig,
        fuse: FuseConfig,
        cache: BlockCache | None = None,
    ) -> None:
        self.table = table
        self.meta = meta
        self.fuse = fuse
        self.cache = cache or BlockCache(CacheConfig(disk_dir=None))
        self.cache.memory_only |= {m.backend.source_id for m in table.mounted if not m.disk_cache}
        self.block_size = self.cache.block_size
        self.mount_time = time.time()
        root_info = ObjectInfo(name="", size=0, mtime=self.mount_time, etag=None, is_dir=True)
        root = Inode(ROOT_INODE, "", root_info, expires=float("inf"), lookups=1)
        self.inodes: dict[int, Inode] = {ROOT_INODE: root}
        self.ino_by_path: dict[str, int] = {"": ROOT_INODE}
        self._next_ino = itertools.count(ROOT_INODE + 1)
        # Complete listings by directory path. Kept by path, not inode, so a listing outlives
        # the kernel forgetting the directory's inode (as it does under memory pressure or
        # drop_caches) and still answers lookups until its TTL.
        self.listings: dict[str, DirListing] = {}
        self.negative: dict[str, float] = {}
        self._nursery: trio.Nursery | None = None
        # Lookups that had to ask the store, per unlisted directory (see _note_store_lookup).
        self._store_lookups: dict[str, int] = {}
        self._listing_in_background: set[str] = set()
        self.handles: dict[int, FileHandle | DirHandle] = {}
        self._next_fh = itertools.count(1)
        self._local_limiter = trio.CapacityLimiter(4)
        # Files open for writing, by inode number (see pffs.fs.staging and pffs.fs.writes).
        self.staged: dict[int, Staged] = {}

    # --- plumbing ----------------------------------------------------------------------------

    def attach(self, nursery: trio.Nursery) -> None:
        """Hand the VFS a nursery for background work (listings, prefetch, disk writes)."""
        self._nursery = nursery
        self.cache.attach(nursery)

    async def drain(self) -> None:
        """Finish background work (disk cache writes) before shutting down."""
        await self.cache.flush()

    async def _run(self, limiter: trio.CapacityLimiter, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking backend call in a worker thread, within that backend's limiter."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)

    def _route(self, path: str) -> tuple[Mounted, str]:
        routed = self.table.route(path)
        if routed is None:
            raise NotFound(f"/{path} is in no source of the mount table")
        return routed

    async def _stat(self, path: str) -> ObjectInfo:
        """What the tree holds at `path`: the source's entry, or a directory leading to one."""
        routed = self.table.route(path)
        leads_to_mount = self.table.leads_to_mount(path)
        if routed is not None:
            mounted, inside = routed
            try:
                info = await self._run(mounted.limiter, mounted.backend.stat, inside)
            except NotFound:
                if not leads_to_mount:
                    raise
            else:
                # A mount point hides what its parent source holds under the same name.
                if info.is_dir or not leads_to_mount:
                    return info
        elif not leads_to_mount:
            raise NotFound(f"/{path} does not exist")
        return ObjectInfo(path.rpartition("/")[2], 0, self.mount_time, None, is_dir=True)

    def _now(self) -> float:
        return time.monotonic()

    def _remember(self, path: str, info: ObjectInfo) -> Inode:
        """The inode for `path`, created or refreshed with what the store just said."""
        if info.is_dir and info.mtime == 0.0:
            info = ObjectInfo(info.name, 0, self.mount_time, None, True)
        expires = self._now() + self.meta.attr_ttl
        ino = self.ino_by_path.get(path)
        inode = self.inodes.get(ino) if ino is not None else None
        if inode is None:
            if ino is None:
                ino = next(self._next_ino)
                self.ino_by_path[path] = ino
            inode = Inode(ino, path, info, expires)
            self.inodes[ino] = inode
        else:
            inode.info = info
            inode.expires = expires
        self.negative.pop(path, None)
        return inode

    def inode(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise NotFound(f"inode {ino} is not known") from None

    def _fresh_listing(self, path: str) -> DirListing | None:
        listing = self.listings.get(path)
        if listing is None:
            return None
        if listing.expires > self._now():
            return listing
        return None  # expired, but kept (until swept) to answer while the store is offline

    def _keep_listing(self, path: str, listing: DirListing) -> None:
        now = self._now()
        if len(self.listings) >= MAX_LISTINGS:  # drop the expired before growing further
            for old in [p for p, entry in self.listings.items() if entry.expires <= now]:
                del self.listings[old]
        listing.expires = now + self.meta.dir_ttl
        self.listings[path] = listing

    # --- lookups and attributes --------------------------------------------------------------

    async def lookup(self, parent_ino: int, name: str) -> Inode:
        """Resolve `name` in a directory and count one kernel reference to the result."""
        inode = await self._resolve(parent_ino, name)
        inode.lookups += 1
        return inode

    async def _resolve(self, parent_ino: int, name: str) -> Inode:
        parent = self.inode(parent_ino)
        if not parent.is_dir:
            raise NotADirectory(f"{parent.path} is not a directory")
        if name == ".":
            return parent
        if name == "..":
            parent_path = parent.path.rpartition("/")[0]
            return self.inode(self.ino_by_path[parent_path])
        path = join(parent.path, name)
        known = self.ino_by_path.get(path)
        if known in self.staged:  # being written: not in the store (or its listing) yet
            return self.inodes[known]

        listing = self._fresh_listing(parent.path)
        if listing is not None:
            info = listing.entries.get(name)
            if info is None:
                raise NotFound(f"{path} does not exist")
            return self._remember(path, info)

        expiry = self.negative.get(path)
        if expiry is not None:
            if expiry > self._now():
                raise NotFound(f"{path} does not exist")
            del self.negative[path]

        known = self.ino_by_path.get(path)
        inode = self.inodes.get(known) if known is not None else None
        if inode is not None and inode.expires > self._now():
            return inode
        self._note_store_lookup(parent)
        try:
            info = await self._stat(path)
        except NotFound:
            self.negative[path] = self._now() + self.meta.negative_ttl
            raise
        except Transient as exc:
            stale = self._known_while_offline(path, exc)
            if stale is None:
                raise
            return stale
        return self._remember(path, info)

    def _known_while_offline(self, path: str, exc: Transient) -> Inode | None:
        """What is known of `path` when the store cannot be asked: the inode, else the entry of
        an expired listing, trusted for one more TTL (None when nothing is known)."""
        known = self.ino_by_path.get(path)
        inode = self.inodes.get(known) if known is not None else None
        if inode is None:
            parent_path, _, name = path.rpartition("/")
            stale_listing = self.listings.get(parent_path)
            info = stale_listing.entries.get(name) if stale_listing is not None else None
            if info is None:
                return None
            inode = self._remember(path, info)
        inode.expires = self._now() + self.meta.attr_ttl
        log.info("store unreachable, serving what is known of /%s: %s", path, exc)
        return inode

    def _note_store_lookup(self, parent: Inode) -> None:
        """List a directory in the background once lookups in it keep asking the store.

        A job opening many files of one directory by name (a data loader with an index file)
        would otherwise pay a HEAD per file; after a few, one paginated listing answers the
        rest, as it does after `ls`.
        """
        if self._nursery is None or parent.path in self._listing_in_background:
            return
        if len(self._store_lookups) > MAX_LISTINGS:
            self._store_lookups.clear()
        count = self._store_lookups.get(parent.path, 0) + 1
        self._store_lookups[parent.path] = count
        if count >= LIST_AFTER_LOOKUPS:
            self._listing_in_background.add(parent.path)
            self._nursery.start_soon(self._list_in_background, parent)

    async def _list_in_background(self, parent: Inode) -> None:
        handle = DirHandle(parent, DirListing())
        try:
            while await self._pull(handle):
                pass
        except Exception as exc:  # only an optimisation: lookups go on asking the store
            log.debug("background listing of %s failed: %s", parent.path or "/", exc)
        finally:
            self._listing_in_background.discard(parent.path)
            self._store_lookups.pop(parent.path, None)

    async def getattr(self, ino: int, *, ask_store: bool = False) -> Inode:
        """The inode with attributes no older than the attribute TTL.

        Expired attributes are taken from the parent's fresh listing when there is one (`ls -l`
        of a big directory then costs one listing), or from the store when `ask_store` is set,
        as open does so that a file overwritten at the source is seen after the TTL.
        """
        inode = self.inode(ino)
        if inode.expires > self._now() or ino == ROOT_INODE or ino in self.staged:
            return inode
        parent_path, _, name = inode.path.rpartition("/")
        listing = None if ask_store else self._fresh_listing(parent_path)
        info = listing.entries.get(name) if listing is not None else None
        if info is None:
            try:
                info = await self._stat(inode.path)
            except Transient as exc:
                stale = self._known_while_offline(inode.path, exc)
                if stale is None:
                    raise
                return stale
        return self._remember(inode.path, info)

    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped `count` references; an unreferenced inode is freed."""
        inode = self.inodes.get(ino)
        if inode is None or ino == ROOT_INODE:
            return
        inode.lookups = max(0, inode.lookups - count)
        if inode.lookups == 0 and ino not in self.staged:
            # Open handles keep their own reference to the Inode object; ino_by_path keeps the
            # number so a later lookup of the same path gets the same inode number.
            del self.inodes[ino]

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        inode = await self.getattr(ino)
        if not inode.is_dir:
            raise NotADirectory(f"{inode.path} is not a directory")
        listing = self._fresh_listing(inode.path)
        if listing is None:
            listing = DirListing(source=None)
        fh = next(self._next_fh)
        self.handles[fh] = DirHandle(inode, listing)
        return fh

    async def readdir(self, fh: int, start: int, emit: Callable[[str, Inode, int], bool]) -> None:
        """Send entries from position `start` to `emit(name, inode, next_position)`.

        `emit` returns False when the kernel's buffer is full; the entry was not taken and no
        reference is counted. Entries stream from the store as they are needed.
        """
        handle = self.handles.get(fh)
        if not isinstance(handle, DirHandle):
            raise NotFound(f"directory handle {fh} is not open")
        listing = handle.listing
        position = start
        while True:
            if position >= len(listing.names):
                if listing.complete or not await self._pull(handle):
                    return
                continue
            name = listing.names[position]
            inode = self._remember(join(handle.inode.path, name), listing.entries[name])
            if not emit(name, inode, position + 1):
                return
            inode.lookups += 1
            position += 1

    async def _pull(self, handle: DirHandle) -> bool:
        """Fetch the next chunk of a streaming listing; False when it is finished."""
        listing = handle.listing
        async with listing.lock:
            if listing.complete:
                return False
            path = handle.inode.path
            routed = self.table.route(path)
            # Synthesised directories have no source: their listing needs no limiter.
            limiter = routed[0].limiter if routed else self._local_limiter
            if listing.source is None:
                listing.source = self.table.listing(path, self.mount_time)
            try:
                chunk = await self._run(limiter, _take, listing.source, LIST_CHUNK)
            except Transient as exc:
                listing.source = None
                if self._use_stale_listing(path, listing, exc):
                    return True
                raise
            except BaseException:
                # The store failed mid-listing: start over next time. Entries already seen are
                # kept and de-duplicated by name, so a retried readdir continues seamlessly.
                listing.source = None
                raise
            for info in chunk:
                listing.add(info)
            if len(chunk) < LIST_CHUNK:
                listing.complete = True
                listing.source = None
                self._keep_listing(handle.inode.path, listing)
            return bool(chunk) or not listing.complete

    def _use_stale_listing(self, path: str, listing: DirListing, exc: Transient) -> bool:
        """Fill an empty listing from an expired one while the store is unreachable."""
        stale = self.listings.get(path)
        if listing.names or stale is None or stale is listing or not stale.complete:
            return False
        listing.entries, listing.names = dict(stale.entries), list(stale.names)
        listing.complete = True
        stale.expires = self._now() + self.meta.dir_ttl  # ask the store again after a TTL
        log.info("store unreachable, listing /%s as last seen: %s", path, exc)
        return True

    def releasedir(self, fh: int) -> None:
        self.handles.pop(fh, None)

    # --- files -------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """Open for reading. Returns (handle, keep_cache).

        keep_cache tells the kernel it may keep pages from an earlier open: true only when the
        object's version is the one those pages came from.
        """
        if flags & WRITE_FLAGS:
            raise self.write_refused("open for writing", self.inode(ino).path)
        staged = self.staged.get(ino)
        if staged is not None:
            return self._open_staged(self.inodes[ino], staged), False
        inode = await self.getattr(ino, ask_store=True)
        if inode.is_dir:
            raise IsADirectory(f"{inode.path} is a directory")
        version = inode.info.version
        keep_cache = inode.kernel_version == version
        inode.kernel_version = version
        fh = next(self._next_fh)
        size = inode.info.size
        readahead = Readahead(self.block_size, self.cache.readahead_limit, size)
        mounted, inside = self._route(inode.path)
        self.handles[fh] = FileHandle(inode, version, size, readahead, mounted, inside)
        return fh, keep_cache

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the version opened, through the block cache."""
        handle = self.handles.get(fh)
        if not isinstance(handle, FileHandle):
            raise NotFound(f"file handle {fh} is not open")
        if handle.staged is not None:
            staged = handle.staged
            await self.before_staged_read(staged)
            return await trio.to_thread.run_sync(read_at, staged, offset, size)
        if offset >= handle.size or size <= 0:
            return b""
        end = min(offset + size, handle.size)
        # Ask for blocks ahead before waiting on this one, so both travel at once.
        ahead = handle.readahead.on_read(offset, end)
        if ahead:
            self.cache.prefetch(
                [self._block_key(handle, index) for index in ahead],
                [self._block_length(handle, index) for index in ahead],
                functools.partial(self._fetch_run, handle, ahead.start),
                coalesce=hasattr(handle.mounted.backend, "read_blocks"),
                at_end=ahead.stop > handle.readahead.last_block,
            )
        first, last = offset // self.block_size, (end - 1) // self.block_size
        pieces: list[bytes | memoryview] = []
        for index in range(first, last + 1):
            key = self._block_key(handle, index)
            fetch = functools.partial(self._fetch_block, handle, index)
            start = max(offset - index * self.block_size, 0)
            stop = min(end - index * self.block_size, self._block_length(handle, index))
            if handle.readahead.sequential:
                block = await self.cache.read(key, fetch, served=stop - start)
                pieces.append(memoryview(block)[start:stop])
            else:  # random access: read only what is asked of the disk tier
                pieces.append(await self.cache.read_part(key, start, stop - start, fetch))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _block_key(self, handle: FileHandle, index: int) -> BlockKey:
        source_id = handle.mounted.backend.source_id
        return BlockKey(source_id, handle.path_in_source, handle.version, index)

    def _block_length(self, handle: FileHandle, index: int) -> int:
        return min(self.block_size, handle.size - index * self.block_size)

    async def _fetch_block(self, handle: FileHandle, index: int) -> bytes:
        length = self._block_length(handle, index)
        data = await self._run(
            handle.mounted.limiter,
            handle.mounted.backend.read_range,
            handle.path_in_source,
            index * self.block_size,
            length,
            handle.version,
        )
        if len(data) != length:
            raise Corrupted(
                f"{handle.inode.path}: block {index} came back with {len(data)} of {length} bytes"
            )
        return data

    async def _fetch_run(
        self, handle: FileHandle, base: int, first: int, count: int, deliver: Deliver
    ) -> None:
        """Blocks base+first .. base+first+count-1 for a prefetch, each delivered as it lands."""
        indices = range(base + first, base + first + count)
        backend = handle.mounted.backend
        if count == 1 or not hasattr(backend, "read_blocks"):
            for position, index in enumerate(indices, first):
                await deliver(position, await self._fetch_block(handle, index))
            return

        def hand_over(offset: int, data: bytes) -> None:  # in the worker thread
            trio.from_thread.run(deliver, first + offset, data)

        await self._run(
            handle.mounted.limiter,
            backend.read_blocks,
            handle.path_in_source,
            indices.start * self.block_size,
            [self._block_length(handle, index) for index in indices],
            handle.version,
            hand_over,
        )

    def _open_staged(self, inode: Inode, staged: Staged) -> int:
        """A handle on a file being written: its reads and writes go to the staging file."""
        fh = next(self._next_fh)
        readahead = Readahead(self.block_size, 0, 0)
        handle = FileHandle(inode, "", 0, readahead, staged.mounted, staged.path_in_source, staged)
        self.handles[fh] = handle
        staged.handles += 1
        return fh

    async def before_staged_read(self, staged: Staged) -> None:
        """Hook for the write side: make sure a staging file holds the object's bytes."""

    async def release(self, fh: int) -> None:
        self.handles.pop(fh, None)

    def direct_io(self, fh: int) -> bool:
        """Whether reads of this handle must bypass the kernel page cache (generated files)."""
        return False

    def is_read_only(self, path: str) -> bool:
        """Whether writes under tree path `path` are refused (the mount's or its entry's flag)."""
        if self.fuse.read_only:
            return True
        routed = self.table.route(path)
        return routed is None or routed[0].read_only

    def write_refused(self, what: str, path: str = "") -> ReadOnly | Unsupported:
        """The error for a write this VFS cannot take: EROFS where the mount or entry is
        read-only, else ENOTSUP (the read-only base class; pffs.fs.writes adds writing)."""
        if self.is_read_only(path):
            return ReadOnly(f"{what}: /{path} is read-only")
        return Unsupported(f"{what}: not supported")

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


def _take(source: Iterator[ObjectInfo], count: int) -> list[ObjectInfo]:
    return list(itertools.islice(source, count))

"""Observability of a mount: the hidden `.pffs/stats` file, the open-files gauge, the endpoint.

`ObservableVfs` is the writable VFS plus one generated directory at the root of the tree:
`.pffs/stats`, a read-only JSON snapshot of every metric (pffs.metrics.snapshot), fresh at each
open. `.pffs` is found by lookup but never listed by readdir, so `ls`, `find` and data loaders
walking the tree do not see it; a store object of the same name at the root is shadowed.
Everything under `.pffs` refuses changes (EROFS).

`start_observing` wires a mount to pffs.metrics: the cache's counters, the mount's facts shown
in the snapshot, the slow-request threshold and the Prometheus endpoint (`--metrics ADDR`).
Like the VFS, this module never imports pyfuse3.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pffs import metrics
from pffs.backends.base import ObjectInfo
from pffs.config import MountConfig
from pffs.errors import Exists, IsADirectory, NotADirectory, NotFound, ReadOnly, UsageError
from pffs.fs.vfs import ROOT_INODE, WRITE_FLAGS, DirHandle, FileHandle, Inode
from pffs.fs.writes import WritableVfs

log = logging.getLogger("pffs.fs.special")

STATS_DIR = ".pffs"
STATS_FILE = "stats"
# Inode numbers far above any the VFS hands out (it counts up from 2).
STATS_DIR_INO = (1 << 62) + 1
STATS_FILE_INO = (1 << 62) + 2


def stats_bytes() -> bytes:
    """The content of `.pffs/stats`: the metrics snapshot as indented JSON."""
    return json.dumps(metrics.snapshot(), indent=1, sort_keys=True).encode() + b"\n"


class ObservableVfs(WritableVfs):
    """The VFS with the hidden `.pffs/stats` file and the open-files gauge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        now = self.mount_time
        self._stats_dir = Inode(
            STATS_DIR_INO, STATS_DIR, ObjectInfo(STATS_DIR, 0, now, None, True), float("inf")
        )
        self._stats_file = Inode(
            STATS_FILE_INO,
            f"{STATS_DIR}/{STATS_FILE}",
            ObjectInfo(STATS_FILE, 0, now, None, False),
            float("inf"),
        )
        self._stats_reads: dict[int, bytes] = {}  # open stats file handles: their snapshot
        self._stats_dir_handles: set[int] = set()

    # --- what is ours ------------------------------------------------------------------------

    def _ours(self, ino: int) -> Inode | None:
        if ino == STATS_DIR_INO:
            return self._stats_dir
        if ino == STATS_FILE_INO:
            return self._stats_file
        return None

    def _is_stats_name(self, parent_ino: int, name: str) -> bool:
        return parent_ino == STATS_DIR_INO or (parent_ino == ROOT_INODE and name == STATS_DIR)

    def _refuse(self, what: str) -> ReadOnly:
        return ReadOnly(f"{what}: /{STATS_DIR} is read-only")

    def is_read_only(self, path: str) -> bool:
        if path == STATS_DIR or path.startswith(STATS_DIR + "/"):
            return True
        return super().is_read_only(path)

    def direct_io(self, fh: int) -> bool:
        return fh in self._stats_reads or super().direct_io(fh)

    # --- names and attributes ----------------------------------------------------------------

    async def lookup(self, parent_ino: int, name: str) -> Inode:
        if parent_ino == ROOT_INODE and name == STATS_DIR:
            return self._stats_dir
        if parent_ino == STATS_DIR_INO:
            if name in (STATS_FILE,):
                return self._stats_file
            if name == ".":
                return self._stats_dir
            if name == "..":
                return self.inode(ROOT_INODE)
            raise NotFound(f"/{STATS_DIR}/{name} does not exist")
        if parent_ino == STATS_FILE_INO:
            raise NotADirectory(f"/{self._stats_file.path} is not a directory")
        return await super().lookup(parent_ino, name)

    async def getattr(self, ino: int, *, ask_store: bool = False) -> Inode:
        ours = self._ours(ino)
        if ours is None:
            return await super().getattr(ino, ask_store=ask_store)
        if ours is self._stats_file:  # it changes all the time; its size is unknown (direct_io)
            ours.info = ObjectInfo(STATS_FILE, 0, time.time(), None, False)
        return ours

    def forget(self, ino: int, count: int) -> None:
        if self._ours(ino) is None:
            super().forget(ino, count)

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        if ino == STATS_FILE_INO:
            raise NotADirectory(f"/{self._stats_file.path} is not a directory")
        fh = await super().opendir(ino)
        if ino == STATS_DIR_INO:
            self._stats_dir_handles.add(fh)
        return fh

    async def readdir(self, fh: int, start: int, emit: Callable[[str, Inode, int], bool]) -> None:
        if fh in self._stats_dir_handles:
            if start == 0:
                emit(STATS_FILE, self._stats_file, 1)
            return
        handle = self.handles.get(fh)
        if isinstance(handle, DirHandle) and handle.inode.ino == ROOT_INODE:
            # Hidden: a store object named .pffs at the root is shadowed by ours, so hide it too.
            def hiding(name: str, inode: Inode, next_id: int) -> bool:
                return True if name == STATS_DIR else emit(name, inode, next_id)

            await super().readdir(fh, start, hiding)
            return
        await super().readdir(fh, start, emit)

    def releasedir(self, fh: int) -> None:
        self._stats_dir_handles.discard(fh)
        super().releasedir(fh)

    # --- files -------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        if ino == STATS_DIR_INO:
            raise IsADirectory(f"/{STATS_DIR} is a directory")
        if ino == STATS_FILE_INO:
            if flags & WRITE_FLAGS:
                raise self._refuse("open for writing")
            fh = next(self._next_fh)
            self._stats_reads[fh] = stats_bytes()  # one consistent snapshot per open
            return fh, False
        fh, keep_cache = await super().open(ino, flags)
        metrics.OPEN_FILES.inc()
        return fh, keep_cache

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        snapshot = self._stats_reads.get(fh)
        if snapshot is not None:
            return snapshot[offset : offset + size]
        return await super().read(fh, offset, size)

    async def flush(self, fh: int) -> None:
        if fh not in self._stats_reads:
            await super().flush(fh)

    async def fsync(self, fh: int) -> None:
        if fh not in self._stats_reads:
            await super().fsync(fh)

    async def release(self, fh: int) -> None:
        if self._stats_reads.pop(fh, None) is not None:
            return
        if isinstance(self.handles.get(fh), FileHandle):
            metrics.OPEN_FILES.dec()
        await super().release(fh)

    # --- changes: refused under .pffs --------------------------------------------------------

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, Inode]:
        if self._is_stats_name(parent_ino, name):
            raise self._refuse("create")
        fh, inode = await super().create(parent_ino, name, flags)
        metrics.OPEN_FILES.inc()
        return fh, inode

    async def setattr(self, ino: int, size: int | None) -> Inode:
        ours = self._ours(ino)
        if ours is not None:
            if size is None:
                return ours
            raise self._refuse("truncate")
        return await super().setattr(ino, size)

    async def unlink(self, parent_ino: int, name: str) -> None:
        if self._is_stats_name(parent_ino, name):
            raise self._refuse("unlink")
        await super().unlink(parent_ino, name)

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        if parent_ino == ROOT_INODE and name == STATS_DIR:
            raise Exists(f"/{STATS_DIR} exists")
        if self._is_stats_name(parent_ino, name):
            raise self._refuse("mkdir")
        return await super().mkdir(parent_ino, name)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        if self._is_stats_name(parent_ino, name):
            raise self._refuse("rmdir")
        await super().rmdir(parent_ino, name)

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        if self._is_stats_name(old_parent, old_name) or self._is_stats_name(new_parent, new_name):
            raise self._refuse("rename")
        await super().rename(old_parent, old_name, new_parent, new_name, flags)


def cache_reader(vfs: WritableVfs) -> Callable[[], Mapping[str, int]]:
    """What the metrics collector reads of a mount's cache (called from any thread)."""
    cache = vfs.cache

    def read() -> Mapping[str, int]:
        values = cache.stats.as_dict()
        values["memory_used_bytes"] = cache.memory.used
        values["memory_capacity_bytes"] = cache.memory.capacity
        values["memory_blocks"] = len(cache.memory)
        values["prefetch_in_flight_bytes"] = cache._prefetch_in_flight
        values["staged_files"] = len(vfs.staged)
        return values

    return read


def start_observing(config: MountConfig, vfs: WritableVfs) -> Callable[[], None]:
    """Connect a mount to pffs.metrics; returns the function that disconnects it.

    The Prometheus endpoint is started here, before the mount: an address in use is a
    one-line error, not a mount without the metrics the operator asked for.
    """
    observe = config.observe
    metrics.SETTINGS.slow_request = observe.slow_request
    metrics.set_info(
        mountpoint=config.fuse.mountpoint,
        name=config.name,
        sources=[m.backend.source_id for m in vfs.table.mounted],
        metrics_address=observe.metrics_address,
    )
    reader = cache_reader(vfs)
    metrics.watch_cache(reader)
    server = None
    if observe.metrics_address:
        try:
            server, _ = metrics.serve_http(observe.metrics_address)
        except OSError as exc:
            metrics.unwatch_cache(reader)
            raise UsageError(
                f"--metrics {observe.metrics_address}: cannot listen ({exc.strerror or exc})"
            ) from None
        log.info("Prometheus metrics at http://%s/metrics", observe.metrics_address)

    def stop() -> None:
        metrics.unwatch_cache(reader)
        if server is not None:
            server.shutdown()
            server.server_close()

    return stop

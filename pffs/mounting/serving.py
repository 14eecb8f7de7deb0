"""Serving a mount in this process: the preflight checks, assembling its parts, serving.

`serve_here` opens the backends of the mount table and checks each store, prepares the
mountpoint, opens the block cache, builds the VFS over them, recovers staged writes a crash
left behind, and serves FUSE until unmounted, with the preload socket in `.pffs` once the kernel's
INIT is answered (pffs.mounting.ordersocket). The foreground `pffs mount` calls it directly;
the background one calls it in the daemon it starts (pffs.mounting.daemon).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import trio

from pffs.backends import open_backend
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, MountConfig, TableEntry
from pffs.errors import CacheDirError, PffsError
from pffs.fs.vfs import Vfs
from pffs.fuse_ops import PffsOperations, serve
from pffs.mounting.daemon import note_to_parent
from pffs.mounting.kernel import prepare_mountpoint, set_kernel_readahead
from pffs.mounting.observe import start_observing
from pffs.mounting.ordersocket import serve_order_socket
from pffs.mounting.process import freeze_startup_objects, raise_descriptor_limit, tune_malloc
from pffs.mounting.recovery import recover_staged
from pffs.mounting.registry import register_mount, staging_dir
from pffs.routing.table import Mounted, MountTable

if TYPE_CHECKING:  # imported only with a group or a shared tier
    from pffs.group.sources import Joined
    from pffs.mounting.grouping import JoinedGroup

log = logging.getLogger("pffs.mounting.serving")


def serve_here(config: MountConfig, on_ready: Callable[[], None] | None = None) -> None:
    """Check everything that can be checked, mount, and serve until unmounted. `on_ready`
    runs once the mount serves, its preload socket bound (or known not to be)."""
    table = open_table(config.table)
    mountpoint = prepare_mountpoint(config.fuse.mountpoint)
    for mounted in table.mounted:
        with _naming_entry(mounted.path, len(table.mounted)):
            mounted.backend.check()
    # Cache blocks and logs hold the user's data: nobody else may read what this process writes.
    os.umask(0o077)
    tune_malloc(config.cache.block_size)
    raise_descriptor_limit()
    cache = open_cache(config.cache, table.memory_only)
    # The tier asked before the stores, handed to the VFS that opens block sources.
    joined: JoinedGroup | None = None
    shared: Joined | None = None
    tier: Joined | None = None
    if config.group is not None:  # imported only then: a mount without a group pays nothing
        from pffs.mounting.grouping import open_group

        joined = open_group(config.group, table, cache)
        tier = joined.tier
    if config.shared_cache is not None:
        from pffs.mounting.grouping import open_shared

        # Its writes among the cache's background tasks: in the mount's nursery.
        shared = tier = open_shared(config.shared_cache, str(mountpoint), cache.background)
    try:
        vfs = Vfs(
            table,
            config.meta,
            config.fuse,
            cache,
            staging_dir=staging_dir(config),
            dataset=config.dataset,
            tier=tier,
        )
    except OSError as exc:
        raise CacheDirError(f"staging directory {staging_dir(config)}: {exc.strerror}") from None
    if not config.fuse.read_only:
        recover_staged(staging_dir(config), table.mounted, notify=note_to_parent)
    stop_observing = start_observing(config, vfs)
    for mounted in table.mounted:
        log.info("mounting %s at %s/%s", mounted.backend.source_id, mountpoint, mounted.path)
    record = register_mount(mountpoint, config)
    freeze_startup_objects()
    try:
        if cache.disk is not None:  # files a crash left unindexed: swept while the mount serves
            cache.disk.sweep_in_background()

        async def after_init() -> None:
            set_kernel_readahead(mountpoint, config.fuse.kernel_readahead)
            # The mount's own tasks, cancelled with it: each source's probes while it is down.
            async with trio.open_nursery() as nursery:
                for mounted in table.mounted:
                    nursery.start_soon(mounted.health.watch)
                await nursery.start(serve_order_socket, vfs, mountpoint)
                if joined is not None:
                    await nursery.start(joined.run)
                if on_ready is not None:  # live, and a job may hand its order over at once
                    on_ready()

        serve(PffsOperations(vfs, config), mountpoint, after_init=after_init)
    finally:
        stop_observing()
        if joined is not None:
            joined.close()
        if shared is not None:
            shared.tier.close()
        log.info("cache counters at exit: %s", cache.stats.as_dict())
        retries = {m.backend.source_id: m.backend.retries for m in table.mounted}
        log.info("transient store failures retried: %s", retries)
        cache.close()
        with contextlib.suppress(OSError):
            os.unlink(record)


def open_table(entries: Sequence[TableEntry]) -> MountTable:
    """Backends for every entry (no network traffic yet), as the VFS's routing table."""
    mounted = []
    for entry in entries:
        with _naming_entry(entry.path, len(entries)):
            backend = open_backend(entry.source)
        read_only = entry.source.read_only
        mounted.append(Mounted(entry.path, backend, read_only, entry.cache == "disk"))
    return MountTable(mounted)


@contextlib.contextmanager
def _naming_entry(path: str, entries: int) -> Iterator[None]:
    """Prefix an error with the mount table entry it came from, when there are several."""
    try:
        yield
    except PffsError as exc:
        if entries == 1:
            raise
        exc.args = (f"mount table entry /{path}: {exc}",)
        raise


def open_cache(config: CacheConfig, memory_only: frozenset[str] = frozenset()) -> BlockCache:
    """The block cache (the blocks of sources in `memory_only` never written to disk), or a
    one-line error when its directory cannot be used.

    A full disk is no reason to refuse a mount: the disk tier is then left out (a warning
    says so) and reads go around it, from memory and the store.
    """
    try:
        return BlockCache(config, memory_only=memory_only)
    except (OSError, sqlite3.Error) as exc:
        if _disk_full(exc):
            log.warning("cache directory %s: disk full, caching in memory only", config.disk_dir)
            return BlockCache(dataclasses.replace(config, disk_dir=None), memory_only=memory_only)
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CacheDirError(f"cache directory {config.disk_dir}: {detail}") from None


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return "full" in str(exc).lower()  # sqlite3: "database or disk is full"

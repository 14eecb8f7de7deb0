"""Preload by dataset: when a job starts consuming a directory, its other files are loaded ahead.

A part the facade (pffs.fs.vfs) composes. It is told of every read-only open of a file in a
source. When `trigger_files` distinct files of one directory were opened within `trigger_window`
seconds, in any order, the directory is a dataset: one listing pass, a task of this part, lists
its files through the namespace's listings and sends them into the job's bounded channel, which
the preload engine (pffs.cache.preload) takes them from; a full channel holds the pass, so a
million-entry directory is listed as the engine takes its files. When the opens span two or
more sibling directories of one parent (ImageNet keeps one directory per class), the parent
and its subdirectories, one level down, are one dataset. An order list (`preload_paths`, the
`.pffs/preload`, the preload file) is a dataset in the job's own order.

Mounts that share a tier (a cache group, a shared tier) walk each window of `ORDER_WINDOW` files
of a listing in an order of their own (`Joined.preload_order`, pffs.group.sources), all of it:
walking it in one order, they would want the same blocks at the same moment and wait on one
another. A mount without a tier walks the listing in its order.

The same pass measures the dataset for the cache's room for datasets (pffs.cache.datasetroom):
it counts each batch of files it lists (and looks up what of it the disk tier holds) before it
sends them, so the room has placed its subset as far as the engine has come; one larger than its
room keeps a stable subset in the cache, and only that subset is loaded ahead.

How the dataset's files are read decides whether its other files are loaded whole
(pffs.fs.readshape): a dataset starts held, loading nothing, until one of its files is read
through (an epoch of whole files, a shard stream, a scan: a run from a file's start); it is
held again when a file closes having been read by ranges (a column projection: reads in the
middle of each file, a small share of it), and released when one is read through again. The
last file to show its reading decides, per directory.

Files are fetched with permits of their source's flow as preload (pffs.flow.permits), never a
reader's: a reader's request never waits behind a preload, and readahead is served first. Each
open tells the engine the file is used (a file not loaded yet is left to its reader) and keeps
its dataset alive; a dataset no reader touches for `idle_after` seconds ends.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from pffs.backends.base import ObjectInfo, join
from pffs.cache.blocks import BlockCache
from pffs.cache.datasetroom import WatchedDataset
from pffs.cache.keys import ObjectBlocks
from pffs.cache.preload import Preloader, PreloadItem, job_channel
from pffs.config import PreloadConfig
from pffs.errors import PffsError, TooLarge
from pffs.flow.permits import at_once
from pffs.fs.handles import ReadHandle
from pffs.fs.listings import DirListing
from pffs.fs.namespace import Namespace
from pffs.fs.readshape import ReadShape
from pffs.store.fetching import Store, open_blocks

if TYPE_CHECKING:  # a mount without a group never imports pffs.group
    from pffs.group.sources import Joined, Order

log = logging.getLogger(__name__)

# Directories whose recent opens are remembered at once; beyond it the oldest are forgotten.
MAX_WATCHED = 4096
# Blocks of a dataset counted, and looked up in the disk tier (one SELECT), before they are sent.
MEASURE_BATCH = 512
# Files of a listing a member sharing a tier reorders at once: about a store's listing page, so
# a listing's first files are loaded after a page or two, not at its end.
ORDER_WINDOW = 1024


class DatasetPreload:
    """Detects datasets from opens and feeds their files to the preload engine."""

    def __init__(
        self,
        namespace: Namespace,
        cache: BlockCache,
        config: PreloadConfig,
        tier: Joined | None = None,  # a cache group or shared tier asked before the store
    ) -> None:
        self.namespace = namespace
        self.tier = tier
        self.cache = cache
        self.config = config
        self.block_size = cache.block_size
        # Preloaded bytes in flight share the mount's budget with readahead (pffs.flow.budget).
        self.engine = Preloader(
            cache,
            cache.ahead.preload_max(config.budget),
            concurrency=self._files_at_once,
            idle_after=config.idle_after,
        )
        cache.room.idle_after = config.idle_after
        self._nursery: trio.Nursery | None = None
        # directory -> recent opens (time, name); parent -> recent opens (time, child directory)
        self._opens: dict[str, deque[tuple[float, str]]] = {}
        self._children: dict[str, deque[tuple[float, str]]] = {}
        # Dataset root -> (depth: 0 its files, 1 its subdirectories' too; when a reader was last
        # seen in it). Kept after its job ended while readers go on, so it is not started again
        # at every open; forgotten once no reader came for `idle_after` seconds.
        self._datasets: dict[str, tuple[int, float]] = {}
        # Directory -> whether its files were last seen read through (True) or by ranges.
        self._reading: dict[str, bool] = {}
        # Order lists being loaded: any read in the mount keeps them alive.
        self._orders: list[str] = []
        self._order_numbers = itertools.count(1)

    def _files_at_once(self) -> int:
        """Files the engine loads at once (pffs.flow.permits.at_once)."""
        flows = (mounted.flow for mounted in self.namespace.table.mounted)
        return at_once(flows, "preload", self.config.concurrency)

    def gauges(self) -> dict[str, int]:
        """Preload's counters and gauges, as the metrics read them (any thread: reads only)."""
        return self.engine.gauges()

    def attach(self, nursery: trio.Nursery) -> None:
        if self.config.enabled:
            self.engine.attach(nursery)
            self._nursery = nursery

    # --- detection ---------------------------------------------------------------------------

    def opened(self, handle: ReadHandle) -> None:
        """A file of a source was opened read-only."""
        if not self.config.enabled:
            return
        self.engine.used(handle.blocks.ident)
        directory = handle.inode.path.rpartition("/")[0]
        handle.shape = ReadShape(
            handle.blocks.size, self.block_size, partial(self._read_as, directory, True)
        )
        self._orders = [name for name in self._orders if self.engine.has_job(name)]
        for name in self._orders:
            self.engine.touch(name)
        directory, _, name = handle.inode.path.rpartition("/")
        parent = directory.rpartition("/")[0]
        now = trio.current_time()
        for root in (directory, parent):
            known = self._datasets.get(root)
            if known is None:
                continue
            depth, seen = known
            if now - seen > self.config.idle_after and not self.engine.has_job(_job(root)):
                del self._datasets[root]  # the readers went away and came back: detect anew
                continue
            self._datasets[root] = (depth, now)
            self.engine.touch(_job(root))
            self.cache.room.touch(f"/{root}")
            if root == directory or depth == 1:
                return
        if _recent(self._opens, directory, now, name, self.config) >= self.config.trigger_files:
            self.start(directory, depth=0)
            return
        if directory and _recent(self._children, parent, now, directory, self.config) >= 2:
            # Opens span sibling directories: enough files in all of them make a dataset.
            files = sum(
                len(self._opens.get(child, ())) for child in {c for _, c in self._children[parent]}
            )
            if files >= self.config.trigger_files:
                self.start(parent, depth=1)

    def closed(self, handle: ReadHandle) -> None:
        """A file opened read-only was closed: whether it was read by ranges."""
        shape = handle.shape
        if shape is not None and shape.by_ranges:
            self._read_as(handle.inode.path.rpartition("/")[0], False)

    def _read_as(self, directory: str, through: bool) -> None:
        """A file of `directory` was read through (or by ranges): the dataset it is part of
        loads its files whole (or holds)."""
        parent = directory.rpartition("/")[0]
        for key in (directory, parent):
            if self._reading.get(key) is not through:
                if key not in self._reading and len(self._reading) >= MAX_WATCHED:
                    del self._reading[next(iter(self._reading))]
                self._reading[key] = through
                if key in self._datasets:
                    self.engine.hold(_job(key), not through)

    def start(self, root: str, depth: int) -> None:
        """Preload the files of directory `root` (and of its subdirectories if depth is 1)."""
        known = self._datasets.get(root)
        if known is not None and known[0] >= depth:
            return
        log.debug("dataset preload of /%s (depth %d)", root, depth)
        if root not in self._datasets and len(self._datasets) >= MAX_WATCHED:
            del self._datasets[next(iter(self._datasets))]
        self._datasets[root] = (depth, trio.current_time())
        if self._nursery is None:
            return
        routed = self.namespace.table.route(root)
        watched = None
        if routed is not None and self.cache.disk_holds(routed[0].backend.source_id):
            backend = routed[0].backend
            prefix = f"{routed[1]}/" if routed[1] else ""
            source, principal = backend.source_id, backend.principal
            watched = self.cache.room.watch(f"/{root}", source, principal, prefix)
        send, receive = job_channel()
        self.engine.add(_job(root), receive, held=not self._reading.get(root, False))
        self._nursery.start_soon(self._feed, send, root, depth, watched)

    async def _feed(
        self,
        send: trio.MemorySendChannel[PreloadItem],
        root: str,
        depth: int,
        watched: WatchedDataset | None,
    ) -> None:
        """The dataset's one listing pass: its files sent to the engine, each batch counted
        for the room first (when the room watches it)."""
        batch: list[PreloadItem] = []
        blocks = 0
        async with send:
            try:
                files = self._files_below(root, depth)
                if self.tier is not None and self.tier.preload_order is not None:
                    files = _reordered(files, self.tier.preload_order)
                async for item in files:
                    batch.append(item)
                    blocks += len(item.keys)
                    if watched is None or blocks >= MEASURE_BATCH:
                        await self._send(send, batch, watched, complete=False)
                        batch, blocks = [], 0
                await self._send(send, batch, watched, complete=True)
            except trio.BrokenResourceError:
                pass  # the engine ended the job: its readers went away
            except Exception as exc:  # a listing that failed: the room goes by what was listed
                log.debug("listing dataset /%s stopped: %s", root, exc)
                if watched is not None:
                    self.cache.room.listed(watched, complete=True)

    async def _send(
        self,
        send: trio.MemorySendChannel[PreloadItem],
        batch: list[PreloadItem],
        watched: WatchedDataset | None,
        complete: bool,
    ) -> None:
        """Count `batch` for the room (the whole dataset when `complete`), then send it."""
        if watched is not None:
            for item in batch:
                watched.count(item.keys[0].path, item.size)
            self.cache.room.listed(watched, complete)
            keys = [key for item in batch for key in item.keys]
            sizes = [size for item in batch for size in item.sizes]
            watched.cached += await self.cache.cached_bytes(keys, sizes)
        for item in batch:
            await send.send(item)

    # --- order lists -------------------------------------------------------------------------

    async def preload_paths(self, paths: Sequence[str], max_listed: int) -> list[str]:
        """Preload tree paths in this order, ahead of the readers; one line per bad entry.
        Raises TooLarge (and preloads nothing) when the directories the paths name hold more
        than `max_listed` entries in all: each is listed, and listing is the list's cost."""
        errors: list[str] = []
        infos: list[tuple[str, ObjectInfo]] = []
        listings: dict[str, DirListing] = {}  # one listing per directory, not a HEAD per path
        listed = 0
        for raw in paths:
            path = raw.strip().strip("/")
            if not path:
                continue
            directory, _, name = path.rpartition("/")
            if directory not in listings:
                listings[directory] = await self._listed(directory, max_listed - listed)
                listed += len(listings[directory].names)
                if listed > max_listed:
                    raise TooLarge(f"the list's directories hold over {max_listed} entries")
            info = listings[directory].get(name)
            if info is None:
                errors.append(f"{raw.strip()}: no such file")
            elif info.is_dir or self.namespace.table.route(path) is None:
                errors.append(f"{raw.strip()}: not a file of a source")
            else:
                infos.append((path, info))
        if infos and self._nursery is not None:
            name = f"order list {next(self._order_numbers)}"
            self._orders.append(name)
            send, receive = job_channel()
            self.engine.add(name, receive)
            self._nursery.start_soon(self._feed_order, send, infos)
        return errors

    async def _feed_order(
        self, send: trio.MemorySendChannel[PreloadItem], infos: list[tuple[str, ObjectInfo]]
    ) -> None:
        async with send:
            for path, info in infos:
                item = self._item(path, info)
                if item is None:
                    continue
                try:
                    await send.send(item)
                except trio.BrokenResourceError:
                    return  # the engine ended the job

    # --- a dataset's files -------------------------------------------------------------------

    async def _files_below(self, root: str, depth: int) -> AsyncIterator[PreloadItem]:
        subdirectories: list[str] = []
        async for path, info in self._entries(root):
            if info.is_dir:
                if depth > 0:
                    subdirectories.append(path)
                continue
            item = self._item(path, info)
            if item is not None:
                yield item
        for directory in subdirectories:
            async for path, info in self._entries(directory):
                item = None if info.is_dir else self._item(path, info)
                if item is not None:
                    yield item

    async def _listed(self, directory: str, most: int) -> DirListing:
        """The complete listing of `directory` (empty when it cannot be listed), or as much of
        it as passes `most` entries."""
        listing = self.namespace.listing_of(directory)
        try:
            while len(listing.names) <= most and await self.namespace.listings.pull(
                directory, listing
            ):
                pass
        except PffsError as exc:
            log.debug("listing /%s for an order list failed: %s", directory, exc)
        return listing

    async def _entries(self, directory: str) -> AsyncIterator[tuple[str, ObjectInfo]]:
        """A directory's entries through the listings, pulled chunk by chunk as needed."""
        listing = self.namespace.listing_of(directory)
        position = 0
        while True:
            while position < len(listing.names):
                name, info = listing.names[position], listing.info_at(position)
                position += 1
                yield join(directory, name), info
            finished = listing.complete or not await self.namespace.listings.pull(
                directory, listing
            )
            if finished and position >= len(listing.names):
                return

    def _item(self, path: str, info: ObjectInfo) -> PreloadItem | None:
        routed = self.namespace.table.route(path)
        if routed is None or info.size == 0:
            return None
        mounted, inside = routed
        return file_item(Store.of(mounted, "preload", self.tier), inside, info, self.block_size)


def file_item(store: Store, path: str, info: ObjectInfo, block_size: int) -> PreloadItem:
    """One file of a source as the preload engine loads it (dataset preload and warmup): the
    blocks a reader of the version `info` uses, from the store (or a tier before it) in runs
    with permits of the source's flow (the store's priority)."""
    backend = store.backend
    blocks = ObjectBlocks(
        backend.source_id, backend.principal, path, info.version, info.size, block_size
    )
    return PreloadItem(blocks.ident, blocks.keys(), blocks.lengths(), open_blocks(store, blocks))


async def _reordered(items: AsyncIterator[PreloadItem], order: Order) -> AsyncIterator[PreloadItem]:
    """All of `items`, each window of ORDER_WINDOW of them in `order`."""
    window: list[PreloadItem] = []
    async for item in items:
        window.append(item)
        if len(window) == ORDER_WINDOW:
            for index in order(len(window)):
                yield window[index]
            window = []
    for index in order(len(window)):
        yield window[index]


def _job(root: str) -> str:
    return f"dataset:/{root}"


def _recent(
    table: dict[str, deque[tuple[float, str]]],
    key: str,
    now: float,
    value: str,
    config: PreloadConfig,
) -> int:
    """Note `value` under `key` at `now`; how many distinct values it saw within the window."""
    if key not in table and len(table) >= MAX_WATCHED:
        del table[next(iter(table))]
    seen = table.setdefault(key, deque())
    while seen and now - seen[0][0] > config.trigger_window:
        seen.popleft()
    if all(v != value for _, v in seen):
        seen.append((now, value))
    return len(seen)

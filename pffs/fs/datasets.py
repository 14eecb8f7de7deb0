"""Preload by dataset: when a job starts consuming a directory, its other files are loaded ahead.

A part the facade (pffs.fs.vfs) composes. It is told of every read-only open of a file in a
source. When `trigger_files` distinct files of one directory were opened within `trigger_window`
seconds, in any order, the directory is a dataset: its files are listed through the namespace's
listings (streamed, so a million-entry directory is read as the engine asks for more) and handed
to the preload engine (pffs.cache.preload). When the opens span two or more sibling directories
of one parent (ImageNet keeps one directory per class), the parent and its subdirectories, one
level down, are one dataset. An order list (`preload_paths`, the `.pffs/preload` control file)
is a dataset in the job's own order.

Each dataset is also measured (its size from its listing, and what of it the disk tier holds)
for the cache's room for datasets (pffs.cache.datasetroom): one larger than its room keeps a
stable subset in the cache, and only that subset is loaded ahead.

Files are fetched under this part's own thread limiter, never the source's: a reader's request
never waits behind a preload. Each open tells the engine the file is used (a file not loaded
yet is left to its reader) and keeps its dataset alive; a dataset no reader touches for
`idle_after` seconds ends.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import trio

from pffs.backends.base import ObjectInfo, join
from pffs.cache.blocks import BlockCache
from pffs.cache.datasetroom import WatchedDataset
from pffs.cache.keys import BlockKey, ObjectBlocks
from pffs.cache.preload import Preloader, PreloadItem
from pffs.config import DatasetConfig
from pffs.errors import PffsError, TooLarge
from pffs.fs.fetching import Store, open_blocks
from pffs.fs.handles import ReadHandle
from pffs.fs.listings import DirListing
from pffs.fs.namespace import Namespace
from pffs.pace import Pace

if TYPE_CHECKING:  # a mount without a group never imports pffs.group
    from pffs.group.sources import Joined

log = logging.getLogger(__name__)

# Directories whose recent opens are remembered at once; beyond it the oldest are forgotten.
MAX_WATCHED = 4096
# Blocks of a dataset looked up in the disk tier at once while it is measured (one SELECT).
MEASURE_BATCH = 512


class DatasetPreload:
    """Detects datasets from opens and feeds their files to the preload engine."""

    def __init__(
        self,
        namespace: Namespace,
        cache: BlockCache,
        config: DatasetConfig,
        tier: Joined | None = None,  # a cache group or shared tier asked before the store
    ) -> None:
        self.namespace = namespace
        self.tier = tier
        self.cache = cache
        self.config = config
        self.block_size = cache.block_size
        # Preloaded bytes in flight share the cache's reserve with readahead: half at most.
        self.engine = Preloader(
            cache,
            min(config.budget, cache.ahead_budget // 2),
            concurrency=config.concurrency,
            max_concurrency=config.max_concurrency,
            idle_after=config.idle_after,
        )
        self.pace = Pace(config.max_concurrency)  # halved when the store pushes back
        cache.room.idle_after = config.idle_after
        self._nursery: trio.Nursery | None = None
        # directory -> recent opens (time, name); parent -> recent opens (time, child directory)
        self._opens: dict[str, deque[tuple[float, str]]] = {}
        self._children: dict[str, deque[tuple[float, str]]] = {}
        # Dataset root -> (depth: 0 its files, 1 its subdirectories' too; when a reader was last
        # seen in it). Kept after its job ended while readers go on, so it is not started again
        # at every open; forgotten once no reader came for `idle_after` seconds.
        self._datasets: dict[str, tuple[int, float]] = {}
        # Order lists being loaded: any read in the mount keeps them alive.
        self._orders: list[str] = []
        self._order_numbers = itertools.count(1)

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

    def start(self, root: str, depth: int) -> None:
        """Preload the files of directory `root` (and of its subdirectories if depth is 1)."""
        known = self._datasets.get(root)
        if known is not None and known[0] >= depth:
            return
        log.debug("dataset preload of /%s (depth %d)", root, depth)
        if root not in self._datasets and len(self._datasets) >= MAX_WATCHED:
            del self._datasets[next(iter(self._datasets))]
        self._datasets[root] = (depth, trio.current_time())
        routed = self.namespace.table.route(root)
        source = routed[0].backend.source_id if routed is not None else ""
        if self._nursery is None or routed is None or not self.cache.disk_holds(source):
            self.engine.add(_job(root), self._files_below(root, depth))
            return
        prefix = f"{routed[1]}/" if routed[1] else ""
        principal = routed[0].backend.principal
        watched = self.cache.room.watch(f"/{root}", source, principal, prefix)
        self._nursery.start_soon(self._measure, watched, root, depth)
        self.engine.add(_job(root), self._behind_measure(watched, root, depth))

    async def _behind_measure(
        self, watched: WatchedDataset, root: str, depth: int
    ) -> AsyncIterator[PreloadItem]:
        """The dataset's files, each once `_measure` has counted it: the room then knows
        whether the dataset fits as far as the engine has come (it waits only at the start,
        or while the measure looks up what the disk tier holds)."""
        position = 0
        async for item in self._files_below(root, depth):
            position += 1
            while watched.files_placed < position and not watched.listed:
                await trio.sleep(0.01)
            yield item

    async def _measure(self, watched: WatchedDataset, root: str, depth: int) -> None:
        """Tell the cache's room the dataset's size as its listing is read, and how many of
        its bytes the disk tier holds."""
        room = self.cache.room
        keys: list[BlockKey] = []
        sizes: list[int] = []
        try:
            async for item in self._files_below(root, depth):
                watched.count(item.keys[0].path, item.size)
                keys += item.keys
                sizes += item.sizes
                if len(keys) >= MEASURE_BATCH:
                    room.listed(watched, complete=False)
                    watched.cached += await self.cache.cached_bytes(keys, sizes)
                    keys, sizes = [], []
            watched.cached += await self.cache.cached_bytes(keys, sizes)
        except Exception as exc:  # a listing that failed: the room goes by what was listed
            log.debug("measuring dataset /%s stopped: %s", root, exc)
        room.listed(watched, complete=True)

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
        if infos and self.config.enabled:

            async def ordered() -> AsyncIterator[PreloadItem]:
                for path, info in infos:
                    item = self._item(path, info)
                    if item is not None:
                        yield item

            name = f"order list {next(self._order_numbers)}"
            self._orders.append(name)
            self.engine.add(name, ordered())
        return errors

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
        store = Store(mounted.backend, mounted.limiter, self.pace, mounted.health, self.tier)
        return file_item(store, inside, info, self.block_size)


def file_item(store: Store, path: str, info: ObjectInfo, block_size: int) -> PreloadItem:
    """One file of a source as the preload engine loads it (dataset preload and warmup): the
    blocks a reader of the version `info` uses, from the store (or a tier before it) in runs
    under the store's pace."""
    backend = store.backend
    blocks = ObjectBlocks(
        backend.source_id, backend.principal, path, info.version, info.size, block_size
    )
    return PreloadItem(blocks.ident, blocks.keys(), blocks.lengths(), open_blocks(store, blocks))


def _job(root: str) -> str:
    return f"dataset:/{root}"


def _recent(
    table: dict[str, deque[tuple[float, str]]],
    key: str,
    now: float,
    value: str,
    config: DatasetConfig,
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

"""The namespace: lookups, attributes, directories, their listings, and the negative cache.

It answers from what it knows while that is fresh (an inode's attributes for the attribute TTL,
a complete directory listing for the directory TTL, "no such name" for the negative TTL) and
asks the store otherwise. Blocking backend calls run in worker threads (pffs.workers).

Offline: when the store cannot be reached (a Transient error after the retry policy gave up, or
at once while its source is marked down: every request goes through the source's breaker),
what the mount already knows is served stale rather than failed: attributes of known entries
and expired directory listings, each then trusted for one more TTL before the store is asked
again. Only what was never seen fails, with EIO.

Directory listings (`Listings`) are streamed from the store in chunks and kept by path for a
TTL. A complete and unexpired listing answers lookups (including "no such name", unless it is
one served as last seen) and attributes without asking the store. Listings are kept by path,
not inode, so one outlives the kernel forgetting the directory's inode (as it does under
memory pressure or drop_caches). An expired listing is kept until swept, to answer while the
store is offline: a listing's requests go through its source's breaker, so while the source is
down an expired listing is answered as last seen at once. A listing's entries as they stream
in are a `DirListing` (pffs.fs.listings).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping

import trio

from pffs.backends.base import ObjectInfo, TreeLister, join, tree_lister
from pffs.config import MetaConfig
from pffs.errors import NotADirectory, NotFound, SourceDown, Transient
from pffs.fs.changes import ChangeMarks
from pffs.fs.handles import DirHandle, Handles
from pffs.fs.inodes import ROOT_INODE, Inode, InodeTable, TableInode
from pffs.fs.listings import DirListing
from pffs.fs.staging import Staged
from pffs.retry import RetryTerms
from pffs.routing.table import Mounted, MountTable
from pffs.workers import run_blocking

log = logging.getLogger(__name__)

# Entries pulled from a backend listing per worker-thread hop: large enough that thread
# switches cost nothing next to the listing, small enough that `ls` starts printing at once.
LIST_CHUNK = 1000
# Directory listings kept at once before expired ones are swept out.
MAX_LISTINGS = 1024
# A directory listed in the background for lookups is given up past this many entries: its
# listing would cost more requests and memory than the lookups it could answer.
BACKGROUND_LISTING_MAX = 50_000
# Entries a store returns per listing request (S3's page), to weigh a listing against HEADs.
LISTING_PAGE = 1000
# The pages of a directory too big to list in the background: it never is again.
_NEVER = 1 << 62
# Keys asked for at most when what lies under a directory is listed at every depth (see
# Namespace._list_tree): a model's or a dataset's few files and folders fit; a page of a big
# tree is given up, at the cost of a small request.
TREE_PAGE = 100


class Listings:
    """Complete listings by directory path, and the streaming of a listing from the store."""

    def __init__(
        self,
        table: MountTable,
        ttl: float,
        mount_time: float,
        now: Callable[[], float],
        changes: ChangeMarks,
    ) -> None:
        self.table = table
        self.ttl = ttl
        self.mount_time = mount_time
        self._now = now
        self._by_path: dict[str, DirListing] = {}
        self._changes = changes  # a listing asked before a change of its directory is not kept
        # Synthesised directories have no source: their listing asks no store (pffs.flow: not a
        # store's cap).
        self._local_limiter = trio.CapacityLimiter(4)

    def fresh(self, path: str) -> DirListing | None:
        """The complete, unexpired listing of `path`, if there is one."""
        listing = self._by_path.get(path)
        if listing is None or listing.expires <= self._now():
            return None  # an expired one is kept (until swept) to answer while offline
        return listing

    def last_seen(self, path: str) -> DirListing | None:
        """The listing of `path` as last seen, expired or not."""
        return self._by_path.get(path)

    def drop(self, path: str) -> None:
        """Forget the listing of `path`."""
        self._by_path.pop(path, None)

    def keep(self, path: str, listing: DirListing) -> bool:
        """Keep a complete listing of `path` from the store, unless `path` changed through the
        mount since it was asked (`DirListing.asked`, pffs.fs.changes); whether it was kept."""
        assert listing.asked is not None
        if self._changes.listing_changed(path, listing.asked):
            return False
        now = self._now()
        if len(self._by_path) >= MAX_LISTINGS:  # drop the expired before growing further
            for old in [p for p, entry in self._by_path.items() if entry.expires <= now]:
                del self._by_path[old]
        if len(self._by_path) >= MAX_LISTINGS:  # long TTLs: drop the oldest, memory is bounded
            del self._by_path[next(iter(self._by_path))]
        self._by_path.pop(path, None)  # re-inserted: the oldest stays first
        listing.expires = now + self.ttl
        self._by_path[path] = listing
        return True

    async def pull(self, path: str, listing: DirListing) -> bool:
        """Fetch the next chunk of a streaming listing; False when it is finished."""
        async with listing.lock:
            if listing.complete:
                return False
            routed = self.table.route(path)
            if listing.source is None:
                # Its pages' retries stop when the source goes down (its breaker, the gate).
                terms = None if routed is None else routed[0].health.terms()
                listing.source = self._tree_listing(path, terms)
                if listing.asked is None:  # a listing started over keeps its first entries
                    listing.asked = self._changes.mark()
            try:
                if routed is None:  # a synthesised directory: no store to ask
                    chunk = await run_blocking(
                        self._local_limiter, _take, listing.source, LIST_CHUNK
                    )
                else:  # through the source's breaker: while it is down, at once
                    mounted = routed[0]
                    chunk = await mounted.health.call(
                        mounted.flow.permit("reader"), _take, listing.source, LIST_CHUNK
                    )
            except Transient as exc:
                listing.source = None
                if self._use_stale(path, listing, exc):
                    return True
                raise
            except BaseException:
                # The store failed mid-listing: start over next time. Entries already seen are
                # kept and de-duplicated by name, so a retried readdir continues seamlessly.
                listing.source = None
                raise
            for info in chunk:
                listing.add(info)
            listing.first_chunk.set()
            if len(chunk) < LIST_CHUNK:
                listing.complete = True
                listing.source = None
                self.keep(path, listing)
            return bool(chunk) or not listing.complete

    def _tree_listing(self, path: str, terms: RetryTerms | None) -> Iterator[ObjectInfo]:
        """Directory `path` as the tree shows it: mount points first, then the entries of the
        source the table routes it to (its pages' retries under `terms`).

        Blocking (it iterates the backend's listing): run it in a worker thread.
        """
        junctions = self.table.mount_points_below(path)
        for name in junctions:
            yield ObjectInfo(name=name, size=0, mtime=self.mount_time, etag=None, is_dir=True)
        routed = self.table.route(path)
        if routed is None:
            return
        mounted, inside = routed
        try:
            for info in mounted.backend.list(inside, terms):
                if info.name not in junctions:
                    yield info
        except (NotFound, NotADirectory):
            if not junctions:  # else the directory exists only as the way to a mount point
                raise

    def _use_stale(self, path: str, listing: DirListing, exc: Transient) -> bool:
        """Fill an empty listing from an expired one while the store is unreachable."""
        stale = self._by_path.get(path)
        if listing.names or stale is None or stale is listing or not stale.complete:
            return False
        listing.take_entries(stale)
        listing.complete = listing.last_seen = stale.last_seen = True
        stale.expires = self._now() + self.ttl  # ask the store again after a TTL
        # While the source is down the breaker has said so already.
        level = logging.DEBUG if isinstance(exc, SourceDown) else logging.INFO
        log.log(level, "store unreachable, listing /%s as last seen: %s", path, exc)
        return True


def _take(source: Iterator[ObjectInfo], count: int) -> list[ObjectInfo]:
    return list(itertools.islice(source, count))


class Namespace:
    """Names, inodes and directories of the tree. `staged` (the write side's, read here) holds
    the files being written: they are not in the store, or its listings, yet."""

    def __init__(
        self, table: MountTable, meta: MetaConfig, handles: Handles, staged: Mapping[int, Staged]
    ) -> None:
        self.table = table
        self.meta = meta
        self.handles = handles
        self.staged = staged
        self.mount_time = time.time()
        root_info = ObjectInfo(name="", size=0, mtime=self.mount_time, etag=None, is_dir=True)
        self.inodes = InodeTable(root_info)
        self.root = self.inodes.get(ROOT_INODE)
        self.changes = ChangeMarks()
        self.listings = Listings(table, meta.dir_ttl, self.mount_time, self.now, self.changes)
        self.negative: dict[str, float] = {}
        self._nursery: trio.Nursery | None = None
        self._background: dict[str, DirListing] = {}
        # Per directory listed in the background: the requests its listing took, and the
        # lookups that asked the store since it expired (see _listing_for).
        self._listing_pages: dict[str, int] = {}
        self._asked_since: dict[str, int] = {}
        self._trees: set[str] = set()  # directories listed at every depth just now

    def attach(self, nursery: trio.Nursery) -> None:
        """A nursery for background listings; the tree under the root is listed in it at once.

        Where the store lists a tree and all of it fits a page (a model's few files, a small
        dataset), every directory's listing is kept before the first lookup: no open waits for
        a listing. A bigger tree costs that one request, and lookups list as they would.
        """
        self._nursery = nursery
        self._list_tree("")

    now = staticmethod(time.monotonic)  # the clock of every TTL (no Python frame per call)

    def route(self, path: str) -> tuple[Mounted, str]:
        routed = self.table.route(path)
        if routed is None:
            raise NotFound(f"/{path} is in no source of the mount table")
        return routed

    def inode(self, ino: int) -> TableInode:
        return self.root if ino == ROOT_INODE else self.inodes.get(ino)

    async def stat(self, path: str) -> ObjectInfo:
        """What the tree holds at `path`: the source's entry, or a directory leading to one."""
        routed = self.table.route(path)
        leads_to_mount = self.table.leads_to_mount(path)
        if routed is not None:
            mounted, inside = routed
            try:
                # Through the source's breaker: while it is down, at once (pffs.routing.health).
                info = await mounted.health.call(
                    mounted.flow.permit("reader"),
                    mounted.backend.stat,
                    inside,
                    mounted.health.terms(),
                )
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

    def remember(self, path: str, info: ObjectInfo) -> TableInode:
        """The inode for `path`, created or refreshed with what the store just said."""
        if info.is_dir and info.mtime == 0.0:
            info = ObjectInfo(info.name, 0, self.mount_time, None, True)
        inode = self.inodes.remember(path, info, self.now() + self.meta.attr_ttl)
        self.negative.pop(path, None)
        return inode

    def remember_listed(
        self, path: str, listing: DirListing, position: int, parent: int
    ) -> TableInode:
        """As remember, with the entry at `position` of the listing of directory `parent` (a
        number): the table takes it without an ObjectInfo made (the common case)."""
        infos = listing.infos
        if infos.mtime(position) == 0.0 and infos.is_dir(position):
            return self.remember(path, listing.info_at(position))
        expires = self.now() + self.meta.attr_ttl
        inode = self.inodes.remember_listed(path, listing, position, expires, parent)
        self.negative.pop(path, None)
        return inode

    # --- lookups and attributes --------------------------------------------------------------

    async def lookup(self, parent_ino: int, name: str) -> TableInode:
        """Resolve `name` in a directory and count one kernel reference to the result."""
        inode = await self.resolve(parent_ino, name)
        self.inodes.lookups[inode.slot()] += 1
        return inode

    async def resolve(self, parent_ino: int, name: str) -> TableInode:
        """Resolve `name` in a directory, without counting a kernel reference."""
        # The table's columns are read directly here: this is every lookup's path.
        table = self.inodes
        parent_slot = table.slot(parent_ino)
        parent_path = table.path_of(parent_slot)
        if not table.infos.is_dir(parent_slot):
            raise NotADirectory(f"{parent_path} is not a directory")
        if name == ".":
            return table.get(parent_ino)
        if name == "..":
            grandparent = parent_path.rpartition("/")[0]
            above = self.inodes.known(grandparent)  # the kernel holds a directory's parent
            return above or self.remember(grandparent, await self.stat(grandparent))
        path = join(parent_path, name)
        if self.staged:  # files being written are not in the store (or its listing) yet
            known = self.inodes.ino_of(path)
            if known is not None and known in self.staged:
                return self.inodes.get(known)

        listing = self.listings.fresh(parent_path)
        if listing is not None:
            position = listing.position(name)
            if position is not None:
                return self.remember_listed(path, listing, position, parent_ino)
            if not listing.last_seen:  # else its absence is a guess: the store is asked below
                raise NotFound(f"{path} does not exist")

        expiry = self.negative.get(path)
        if expiry is not None:
            if expiry > self.now():
                raise NotFound(f"{path} does not exist")
            del self.negative[path]

        inode = self.inodes.known(path)
        if inode is not None and inode.expires > self.now():
            return inode
        if self._listed_lately(path):
            return self.remember(path, ObjectInfo(name, 0, self.mount_time, None, is_dir=True))
        first = parent_path not in self._background and parent_path not in self._listing_pages
        running = self._listing_for(parent_path)
        if running is not None and first:
            # The kernel resolves a path a name at a time, each lookup waiting for its
            # parent's listing: with `name` listed as a directory beside its parent's first
            # listing, the lookup in it that follows finds its listing come with the parent's
            # (a round trip less per two levels of a cold path: `a/b/c/file` in two, not four;
            # a LIST of nothing, once per directory, where the name is a file). Where the store
            # lists a tree, what lies deeper is listed too: the whole path in one round trip.
            self._listing_for(path)
            self._list_tree(path)
        if running is not None and not running.first_chunk.is_set():
            # Its first page costs one round trip, as our own HEAD would: wait for it and ask
            # the store once, not twice (the lookups of a job starting on a directory of up to a
            # page then ask nothing but the listing).
            await running.first_chunk.wait()
        seen = running.position(name) if running is not None else None
        if (  # already streamed in
            running is not None
            and seen is not None
            and not self._asked_before_a_change(parent_path, running)
        ):
            return self.remember_listed(path, running, seen, parent_ino)
        return await self._ask_store(path)

    async def _ask_store(self, path: str) -> TableInode:
        """The inode of `path` as the store has it (a HEAD), kept for the attribute TTL, or "no
        such name" kept for the negative TTL; while the store is unreachable, what is known.

        An answer landing after `path` changed through the mount may be from before the change,
        and is not kept (pffs.fs.changes): what the change left answers (the writer's inode,
        fresh after its upload), else the store's answer for this call alone.
        """
        asked = self.changes.mark()
        info: ObjectInfo | None = None
        try:
            info = await self.stat(path)
        except NotFound:
            if not self.changes.entry_changed(path, asked):
                self.negative[path] = self.now() + self.meta.negative_ttl
                raise
        except Transient as exc:
            stale = self._known_while_offline(path, exc)
            if stale is None:
                raise
            return stale
        if info is not None and not self.changes.entry_changed(path, asked):
            return self.remember(path, info)
        return self._after_a_change(path, info)

    def _after_a_change(self, path: str, info: ObjectInfo | None) -> TableInode:
        """What answers for `path` when the store's answer (`info`, None for "no such name")
        was asked before `path` changed through the mount: what the change left (the writer's
        inode, fresh after its upload), else that answer for this call alone, not kept."""
        known = self.inodes.known(path)
        if known is not None and known.expires > self.now():
            return known
        if info is None:
            raise NotFound(f"{path} does not exist")
        inode = self.remember(path, info)
        inode.expires = 0.0  # asked of the store again at its next use
        return inode

    def _listed_lately(self, path: str) -> bool:
        """Whether `path` was a directory within the TTL by its own listing, taken then.

        A lookup after the kernel forgot a directory (`ls -l dir` then `stat dir/*` a while
        later, or a job reopening files of a class directory) would otherwise ask the store
        about it (a HEAD and a LIST) when its parent's listing has expired or was never taken.
        But a directory is listed only once resolved as one, and its listing, fresh and holding
        entries, says the prefix has objects under it: it is a directory as surely as an inode
        whose attributes have not expired.
        """
        listing = self.listings.fresh(path)
        return listing is not None and bool(listing.names)

    def _known_while_offline(self, path: str, exc: Transient) -> TableInode | None:
        """What is known of `path` when the store cannot be asked: the inode, else the entry of
        an expired listing, trusted for one more TTL (None when nothing is known)."""
        inode = self.inodes.known(path)
        if inode is None:
            parent_path, _, name = path.rpartition("/")
            stale_listing = self.listings.last_seen(parent_path)
            info = stale_listing.get(name) if stale_listing is not None else None
            if info is None:
                return None
            inode = self.remember(path, info)
        inode.expires = self.now() + self.meta.attr_ttl
        # Once per entry and TTL; while the source is down the breaker has said so already.
        level = logging.DEBUG if isinstance(exc, SourceDown) else logging.INFO
        log.log(level, "store unreachable, serving what is known of /%s: %s", path, exc)
        return inode

    def listing_of(self, path: str) -> DirListing:
        """The listing of `path` to read from or stream on: the fresh complete one, else the
        one streaming in the background (the store is listed once for both) unless asked before
        a change in the directory, else a new one. Readers of one listing share its stream
        (Listings.pull takes its lock)."""
        running = self._background.get(path)
        if running is not None and self._asked_before_a_change(path, running):
            running = None
        return self.listings.fresh(path) or running or DirListing()

    def _asked_before_a_change(self, path: str, listing: DirListing) -> bool:
        """Whether `listing` of directory `path` was asked of the store before a change in it
        through the mount (pffs.fs.changes): it may answer as the store was before."""
        return listing.asked is not None and self.changes.listing_changed(path, listing.asked)

    def _listing_for(self, path: str) -> DirListing | None:
        """The parent's listing under way in the background, started here when it pays.

        A job opening many files of one directory by name (a data loader with an index file)
        would otherwise pay a HEAD per file, where one paginated listing answers them all, as
        it does after `ls`. So the first lookup that asks the store about a directory lists it.
        Once that listing has expired, it is taken again when the lookups asking the store
        since have cost as many requests as the listing does: a lone `stat` now and then in a
        big directory stays one HEAD.
        """
        running = self._background.get(path)
        if running is not None or self._nursery is None:
            return running
        pages = self._listing_pages.get(path)
        if pages is not None:
            asked = self._asked_since.get(path, 0) + 1
            if asked < pages:
                self._asked_since[path] = asked
                return None
            self._asked_since.pop(path, None)
        running = DirListing()
        self._background[path] = running
        self._nursery.start_soon(self._list_in_background, path, running)
        return running

    async def wait_for_listings(self) -> None:
        """Wait until no listing a lookup started in the background runs (probes, tests)."""
        while self._background or self._trees:
            await trio.sleep(0.01)

    def _list_tree(self, path: str) -> None:
        """List what lies under directory `path` at every depth, one page in the background,
        where its store can (`tree_pages`) and no mount point lies below it (`path` itself too,
        unless a listing of it is under way or fresh).

        A cold path's lookups each wait for their directory's listing, two levels a round trip
        at best (see resolve); a dataset's or a model's whole tree often fits one page of keys,
        and with its directories' listings kept, the lookups below `path` ask nothing more.
        """
        routed = self.table.route(path)
        if routed is None or self._nursery is None or path in self._trees:
            return
        mounted, inside = routed
        lister = tree_lister(mounted.backend)
        if lister is None or self.table.mount_points_below(path):
            return
        self._trees.add(path)
        self._nursery.start_soon(self._keep_tree, path, mounted, lister, inside)

    async def _keep_tree(
        self, path: str, mounted: Mounted, lister: TreeLister, inside: str
    ) -> None:
        asked = self.changes.mark()
        try:
            page = await mounted.health.call(
                mounted.flow.permit("reader"),
                lister.list_tree,
                inside,
                TREE_PAGE,
                mounted.health.terms(),
            )
        except Exception as exc:  # only an optimisation: the lookups list as they would
            log.debug("listing the tree under /%s failed: %s", path, exc)
            return
        finally:
            self._trees.discard(path)
        if not page.complete:
            return
        for relative, entries in page.directories.items():
            directory = join(path, relative) if relative else path
            if directory in self._background or self.listings.fresh(directory):
                continue  # a listing under way (a lookup's of `path` itself) or fresh is kept
            listing = DirListing(complete=True, asked=asked)
            for info in entries:
                listing.add(info)
            listing.first_chunk.set()
            if self.listings.keep(directory, listing):
                self._listing_pages[directory] = 1

    async def _list_in_background(self, path: str, running: DirListing) -> None:
        if len(self._listing_pages) > MAX_LISTINGS:
            self._listing_pages.clear()
            self._asked_since.clear()
        try:
            while await self.listings.pull(path, running):
                if len(running.names) > BACKGROUND_LISTING_MAX:
                    log.debug("background listing of /%s given up: too many entries", path)
                    self._listing_pages[path] = _NEVER
                    return
            self._listing_pages[path] = max(1, -(-len(running.names) // LISTING_PAGE))
        except Exception as exc:  # only an optimisation: lookups go on asking the store
            log.debug("background listing of /%s failed: %s", path, exc)
        finally:
            running.first_chunk.set()  # no lookup waits on a listing that failed
            del self._background[path]

    async def getattr(self, ino: int, *, ask_store: bool = False) -> Inode:
        """The inode with attributes no older than the attribute TTL.

        Expired attributes are taken from the parent's fresh listing when there is one (`ls -l`
        of a big directory then costs one listing), or from the store when `ask_store` is set,
        as open does so that a file overwritten at the source is seen after the TTL.
        """
        inode = self.inode(ino)
        if inode.expires > self.now() or ino == ROOT_INODE or ino in self.staged:
            return inode
        parent_path, _, name = inode.path.rpartition("/")
        listing = None if ask_store else self.listings.fresh(parent_path)
        info = listing.get(name) if listing is not None else None
        if info is None:
            return await self._ask_store(inode.path)
        return self.remember(inode.path, info)

    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped `count` references; an unreferenced inode is freed."""
        if ino == ROOT_INODE or not self.inodes.live(ino):
            return
        inode = self.inodes.get(ino)
        inode.lookups = max(0, inode.lookups - count)
        if inode.lookups == 0 and ino not in self.staged:
            # The kernel holds no open file of it (it forgets only inodes it has evicted); a
            # later lookup of the same path gets the same number, derived from the path.
            self.inodes.drop(inode)

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        inode = await self.getattr(ino)
        if not inode.is_dir:
            raise NotADirectory(f"{inode.path} is not a directory")
        listing = self.listing_of(inode.path)
        return self.handles.add(DirHandle(inode, listing))

    async def readdir(self, fh: int, start: int, emit: Callable[[str, Inode, int], bool]) -> None:
        """Send entries from position `start` to `emit(name, inode, next_position)`.

        `emit` returns False when the kernel's buffer is full; the entry was not taken and no
        reference is counted. Entries stream from the store as they are needed.
        """
        handle = self.handles.directory(fh)
        listing, directory = handle.listing, handle.inode.ino
        path = handle.inode.path
        position = start
        while True:
            if position >= len(listing.names):
                if listing.complete:
                    return
                # Another reader of a shared listing may pull the entries in meanwhile.
                await self.listings.pull(path, listing)
                path = handle.inode.path  # renamed meanwhile?
                continue
            name = listing.names[position]
            inode = self._listed_entry(join(path, name), listing, position, directory)
            if not emit(name, inode, position + 1):
                return
            self.inodes.lookups[inode.slot()] += 1
            position += 1

    def _listed_entry(
        self, path: str, listing: DirListing, position: int, parent: int
    ) -> TableInode:
        """The inode of a directory handle's entry: as remember_listed, unless the entry
        changed through the mount since the listing was asked (an `ls -l` under way across an
        upload, pffs.fs.changes)."""
        if listing.asked is None or not self.changes.entry_changed(path, listing.asked):
            return self.remember_listed(path, listing, position, parent)
        return self._after_a_change(path, listing.info_at(position))

    # --- changes made through the mount -------------------------------------------------------

    def changed(self, path: str) -> None:
        """Forget what was cached about `path`'s directory after `path` changed; what the store
        answers for either, asked before, is not kept (pffs.fs.changes)."""
        self.changes.note(path)
        self.listings.drop(path.rpartition("/")[0])
        self.negative.pop(path, None)

    def outdated(self, path: str) -> None:
        """The store holds another version of `path` than the one known (a read met `Changed`):
        what its directory's listing and its inode said is not trusted again."""
        self.changes.note(path)
        self.listings.drop(path.rpartition("/")[0])
        inode = self.inodes.known(path)
        if inode is not None:
            inode.expires = 0.0

    def gone(self, path: str) -> None:
        """`path` no longer exists: a later lookup starts afresh (with a new inode number)."""
        self.changed(path)
        self.listings.drop(path)
        inode = self.inodes.forget_path(path)
        if inode is not None:
            inode.expires = 0.0
        self.negative[path] = self.now() + self.meta.negative_ttl

    def moved(self, old_path: str, new_path: str, new_inside: str) -> None:
        """Carry inode numbers, staged files and caches from `old_path` over to `new_path`."""
        self.gone(new_path)
        self.negative.pop(new_path, None)
        self.changed(old_path)
        for path, ino in self.inodes.move(old_path, new_path):
            staged = self.staged.get(ino)
            if staged is not None:
                staged.path_in_source = new_inside + path[len(old_path) :]
            self.listings.drop(path)
        for handle in self.handles.readers():  # open readers follow the file to its new name
            if handle.inode.path.startswith(new_path):
                inside = new_inside + handle.inode.path[len(new_path) :]
                handle.blocks = dataclasses.replace(handle.blocks, path=inside)
        self.negative[old_path] = self.now() + self.meta.negative_ttl

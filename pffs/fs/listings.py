"""Directory listings: streamed from the store in chunks, kept by path for a TTL.

A complete and unexpired listing answers lookups (including "no such name", unless it is one
served as last seen) and attributes without asking the store. Listings are kept by path, not
inode, so one outlives the kernel forgetting the directory's inode (as it does under memory
pressure or drop_caches). An expired listing is kept until swept, to answer while the store is
offline: a listing's requests go through its source's breaker, so while the source is down an
expired listing is answered as last seen at once.
"""

from __future__ import annotations

import itertools
import logging
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

from pffs.backends.base import ObjectInfo
from pffs.errors import SourceDown, Transient
from pffs.fs.names import NameIndex, PackedNames, encode
from pffs.fs.packed import PackedInfos
from pffs.routing.table import MountTable
from pffs.workers import run_blocking

log = logging.getLogger(__name__)

# Entries pulled from a backend listing per worker-thread hop: large enough that thread
# switches cost nothing next to the listing, small enough that `ls` starts printing at once.
LIST_CHUNK = 1000
# Directory listings kept at once before expired ones are swept out.
MAX_LISTINGS = 1024


@dataclass(eq=False)
class DirListing:
    """A directory's entries as they stream in from the store, in the store's order: their
    names (pffs.fs.names), and what the store said of each (pffs.fs.packed), by position."""

    names: PackedNames = field(default_factory=PackedNames)
    complete: bool = False
    # Served as last seen because the store could not be asked: what it holds is known, what
    # it lacks is not (a name may have come since), so it never answers "no such name".
    last_seen: bool = False
    expires: float = 0.0
    source: Iterator[ObjectInfo] | None = None
    lock: trio.Lock = field(default_factory=trio.Lock)
    # Set once the first chunk has arrived, or the listing has failed or finished.
    first_chunk: trio.Event = field(default_factory=trio.Event)
    infos: PackedInfos = field(default_factory=PackedInfos)
    # The inode number of each entry last seen by the inode table, 0 for none (a hint it
    # checks): a lookup answered by the listing then needs no digest of the path.
    inos: array[int] = field(default_factory=lambda: array("q"))
    # Positions by name (pffs.fs.names), in whatever order the store listed.
    lookup: NameIndex = field(init=False)

    def __post_init__(self) -> None:
        self.lookup = NameIndex(self.names)

    def add(self, info: ObjectInfo) -> None:
        encoded = encode(info.name)
        position = self.lookup.get(encoded)
        if position is None:
            self.names.append(encoded)
            self.lookup.add(len(self.names) - 1, encoded)
            self.infos.append(info)
            self.inos.append(0)
        elif info.is_dir and not self.infos.is_dir(position):
            # A key that is both an object and a prefix: the directory wins.
            self.infos.set(position, info)

    def position(self, name: str) -> int | None:
        """Where `name` is in the listing, if it is."""
        return self.lookup.get(encode(name))

    def get(self, name: str) -> ObjectInfo | None:
        """What the store said of `name`, if it is in the listing."""
        position = self.position(name)
        return None if position is None else self.infos.get(position, self.names[position])

    def info_at(self, position: int) -> ObjectInfo:
        return self.infos.get(position, self.names[position])

    def take_entries(self, other: DirListing) -> None:
        """The entries of `other`, a complete listing (shared with it: neither changes)."""
        self.names, self.infos, self.lookup = other.names, other.infos, other.lookup
        self.inos = other.inos


class Listings:
    """Complete listings by directory path, and the streaming of a listing from the store."""

    def __init__(
        self, table: MountTable, ttl: float, mount_time: float, now: Callable[[], float]
    ) -> None:
        self.table = table
        self.ttl = ttl
        self.mount_time = mount_time
        self._now = now
        self._by_path: dict[str, DirListing] = {}
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
        self._by_path.pop(path, None)

    def keep(self, path: str, listing: DirListing) -> None:
        now = self._now()
        if len(self._by_path) >= MAX_LISTINGS:  # drop the expired before growing further
            for old in [p for p, entry in self._by_path.items() if entry.expires <= now]:
                del self._by_path[old]
        if len(self._by_path) >= MAX_LISTINGS:  # long TTLs: drop the oldest, memory is bounded
            del self._by_path[next(iter(self._by_path))]
        self._by_path.pop(path, None)  # re-inserted: the oldest stays first
        listing.expires = now + self.ttl
        self._by_path[path] = listing

    async def pull(self, path: str, listing: DirListing) -> bool:
        """Fetch the next chunk of a streaming listing; False when it is finished."""
        async with listing.lock:
            if listing.complete:
                return False
            routed = self.table.route(path)
            if listing.source is None:
                # Its pages' retries stop when the source goes down (its breaker, the gate).
                terms = None if routed is None else routed[0].health.terms()
                listing.source = self.table.listing(path, self.mount_time, terms)
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

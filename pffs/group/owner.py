"""The blocks this member serves its group's peers (the peer server's block handler).

A block a peer asks for comes through this mount's own cache, its version pinned: served from
memory or disk, else fetched once for every asker (the cache's single flight), from the
previous owner during a handover (pffs.group.peers), else the store. A block on its way from
the store, whoever started its fetch, is streamed to every peer request that joins it, from
its first piece (the block's flight: pffs.cache.singleflight says how); the whole
block lands in the cache as usual. Every second request for a hot block this member
owns is sent to the block's second copy (pffs.group.hot). It serves only sources this mount
mounts, as the principal the block key names and only when the request proves that principal
(pffs.group.principals: an HMAC keyed by the principal's key, 403 otherwise), so the group is
never a way around a bucket's access rules. It never believes the asker's view of the object:
the path was checked inside the source (pffs.group.protocol), the version is pinned at the
store, a block held in memory must have the length asked for, and a fetch for a peer of a
block its size makes a short last one asks the store for a byte more, so the store's own end
of that version says whether the size is the object's before the block lands in the cache: a
smaller size claimed cannot leave a shortened block under the shared key.

The assembly point (pffs.mounting, through grouping) hands it what it loads with: the mount
table, the block cache (whose flights are the blocks on their way) and the principal keys. A
load it starts runs among the cache's background tasks, in the mount's nursery: it ends with the
mount, and its errors go to the pieces its askers stream. A peer's ask goes down from here,
never back up: the cache (pffs.cache.blocks), the store (pffs.store.fetching), the backend.
"""

from __future__ import annotations

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import Blocks, ObjectBlocks
from pffs.cache.pieces import Pieces
from pffs.errors import PffsError
from pffs.group import stats
from pffs.group.peers import Group
from pffs.group.principals import PrincipalKeys
from pffs.group.protocol import BlockRequest
from pffs.group.server import AskSecond, NotServed, Refused
from pffs.group.signing import Signed
from pffs.routing.table import MountTable
from pffs.store.fetching import Store, StoreBlocks


class NotTheOwnersObject(PffsError):
    """A peer's request named a size that is not the object's at the store."""


class PeerBlocks:
    def __init__(
        self,
        group: Group,
        table: MountTable,
        cache: BlockCache,
        keys: PrincipalKeys,
    ) -> None:
        self.group = group
        self.table = table
        self.cache = cache  # its flights: the blocks on their way to this mount
        self.keys = keys

    async def serve(self, request: BlockRequest, signed: Signed) -> bytes | Pieces | None:
        blocks, index = request.blocks, request.index
        store = self._store_of(blocks)
        proof_key = self.keys.key(blocks.principal, store.backend.principal_key)
        if proof_key is None:
            raise Refused("principal unprovable")  # no key of its own, no principal secret
        if not signed.proves(proof_key):
            raise Refused("principal not proven")
        key = blocks.key(index)
        if request.cached_only:  # a handover: only what this member holds now
            return await self.cache.held(key)
        if not request.forwarded and self.group.to_second(blocks, index):
            raise AskSecond(key)
        length = blocks.length(index)
        flight = self.cache.flights.get(key)
        if flight is not None:  # on its way here: whoever fetches it, the pieces so far
            return flight.stream(length)
        if key in self.cache.memory:
            return await self.cache.read(key, self._source(store, request), length)
        # Its flight registered now, so the store GET it leads to fills its pieces; loaded
        # among the cache's background tasks, in the mount's nursery: the load ends (and fills
        # the cache) whoever stops listening, and is cancelled when the mount stops.
        flight = self.cache.load_for_peer(key, self._source(store, request), length)
        if flight is None:
            # No background tasks (the mount is not serving): answered 503, as a store failure.
            raise PffsError("no background tasks to load the block in")
        return flight.stream(length)

    def _store_of(self, blocks: ObjectBlocks) -> Store:
        if blocks.block_size != self.cache.block_size:
            # A fixed reason: it labels a metric, and the asker chose the size.
            raise NotServed(f"another block size (this member's is {self.cache.block_size})")
        for mounted in self.table.mounted:
            backend = mounted.backend
            if backend.source_id == blocks.source and backend.principal == blocks.principal:
                # The store itself (it never asks the group), filling the flights it serves.
                return Store.of(mounted, arriving=self.cache.flights)
        raise NotServed("a source this member does not mount as that principal")

    def _source(self, store: Store, request: BlockRequest) -> _OwnerSide:
        return _OwnerSide(self.group, request, StoreBlocks(store, request.blocks))


class _OwnerSide:
    """The block source of a block a peer asked for (pffs.cache.keys.BlockSource): the owner's
    copy when this member is its second copy, the previous owner's during a handover, else
    the store's (Group.fetch_for_peer). A block the asker's size makes the object's last is
    asked of the store with one byte more: the store's own end says whether that size is the
    object's, in the same GET (a stat of its own cost the group scenario a fifth of its time)."""

    def __init__(self, group: Group, request: BlockRequest, store: StoreBlocks) -> None:
        self.group = group
        self.request = request
        self.store = store

    async def part(self, offset: int, length: int) -> bytes:
        request = self.request
        blocks = request.blocks
        data = await self.group.fetch_for_peer(blocks, request.index, request.forwarded)
        if data is not None:
            return data
        if offset + length == blocks.size and length < blocks.block_size:
            return await self._last_block(offset, length)
        return await self.store.part(offset, length)

    async def _last_block(self, offset: int, length: int) -> bytes:
        """The object's last `length` bytes from `offset`, as the asker's size says; refused
        (nothing lands in the cache) when the store has a byte past them, or fewer."""
        store, blocks = self.store.store, self.request.blocks
        data = await store.request(
            store.backend.read_range, blocks.path, offset, length + 1, blocks.version, ahead=False
        )
        if len(data) != length:
            stats.REFUSALS.labels(reason="size not the owner's").inc()
            raise NotTheOwnersObject(
                f"{blocks.path}: {blocks.size} bytes asked, the store's object ends elsewhere"
            )
        return data

    def run(self, first: int, count: int) -> Blocks:
        return self.store.run(first, count)

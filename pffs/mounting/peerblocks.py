"""The blocks this member serves its group's peers (the peer server's block handler).

A block a peer asks for comes through this mount's own cache, its version pinned: served from
memory or disk, else fetched once for every asker (the cache's single flight), from the
previous owner during a handover (pffs.group.peers), else the store. A block on its way from
the store, whoever started its fetch, is streamed to every peer request that joins it, from
its first piece (this mount's board of arriving blocks: pffs.cache.pieces says how); the whole
block lands in the cache as usual. Every second request for a hot block this member
owns is sent to the block's second copy (pffs.group.hot). It serves only sources this mount
mounts, as the principal the block key names, so the group is never a way around a bucket's
access rules.
"""

from __future__ import annotations

import trio

from pffs import retry
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import Blocks, ObjectBlocks
from pffs.cache.pieces import Arriving, Pieces
from pffs.fs.fetching import Store, StoreBlocks
from pffs.group.peers import Group
from pffs.group.protocol import BlockRequest
from pffs.group.server import AskSecond, NotServed
from pffs.routing.table import MountTable


class PeerBlocks:
    def __init__(
        self, group: Group, table: MountTable, cache: BlockCache, arriving: Arriving
    ) -> None:
        self.group = group
        self.table = table
        self.cache = cache
        self.arriving = arriving  # the blocks on their way to this mount, piece by piece

    async def serve(self, request: BlockRequest) -> bytes | Pieces | None:
        blocks, index = request.blocks, request.index
        store = self._store_of(blocks)
        key = blocks.key(index)
        if request.cached_only:  # a handover: only what this member holds now
            return await self.cache.held(key)
        if not request.forwarded and self.group.to_second(blocks, index):
            raise AskSecond(key)
        pieces = self.arriving.get(key)
        if pieces is not None:  # on its way here: whoever fetches it, the pieces so far
            return pieces
        if key in self.cache.memory:
            return await self.cache.read(key, self._source(store, request), blocks.length(index))
        # Announced before the fetch starts, so a store GET it leads to (or the one a reader
        # here is about to start) fills these pieces as its bytes arrive.
        pieces = self.arriving.announce(key, blocks.length(index))
        trio.lowlevel.spawn_system_task(self._load, store, request, pieces)
        return pieces

    def _store_of(self, blocks: ObjectBlocks) -> Store:
        if blocks.block_size != self.cache.block_size:
            raise NotServed(
                f"block size {blocks.block_size} (this member's is {self.cache.block_size})"
            )
        for mounted in self.table.mounted:
            backend = mounted.backend
            if backend.source_id == blocks.source and backend.principal == blocks.principal:
                # The store itself (it never asks the group), announcing what it sends.
                return Store.of(mounted, arriving=self.arriving)
        raise NotServed("a source this member does not mount as that principal")

    def _source(self, store: Store, request: BlockRequest) -> _OwnerSide:
        return _OwnerSide(self.group, request, StoreBlocks(store, request.blocks))

    async def _load(
        self,
        store: Store,
        request: BlockRequest,
        pieces: Pieces,
    ) -> None:
        """Load the block through the cache (a system task: the fetch ends, and fills the
        cache, whoever stops listening); its pieces come as the store sends them, or whole at
        the end when it came from disk, a flight under way or another member."""
        blocks, index = request.blocks, request.index
        key = blocks.key(index)
        try:
            with retry.asking():  # the store's retries stop within the usual bound
                data = await self.cache.read(
                    key, self._source(store, request), blocks.length(index)
                )
        except Exception as exc:
            pieces.fail(exc)
        else:
            pieces.finish(data)
        finally:
            self.arriving.withdraw(key, pieces)


class _OwnerSide:
    """The block source of a block a peer asked for (pffs.cache.keys.BlockSource): the owner's
    copy when this member is its second copy, the previous owner's during a handover, else
    the store's (Group.fetch_for_peer)."""

    def __init__(self, group: Group, request: BlockRequest, store: StoreBlocks) -> None:
        self.group = group
        self.request = request
        self.store = store

    async def part(self, offset: int, length: int) -> bytes:
        request = self.request
        data = await self.group.fetch_for_peer(request.blocks, request.index, request.forwarded)
        return data if data is not None else await self.store.part(offset, length)

    def run(self, first: int, count: int) -> Blocks:
        return self.store.run(first, count)

"""The blocks this member serves its group's peers (the peer server's block handler).

A block a peer asks for comes through this mount's own cache, its version pinned: served from
memory or disk, else fetched once for every asker (the cache's single flight), from the
previous owner during a handover (pffs.group.peers), else the store. A fetch from the store
streams: the block's pieces are sent to every peer request that joined it as the store sends
them (pffs.group.pieces), so an asker gets the first bytes as soon as this member does, and the
whole block lands in the cache as usual. Every second request for a hot block this member
owns is sent to the block's second copy (pffs.group.hot). It serves only sources this mount
mounts, as the principal the block key names, so the group is never a way around a bucket's
access rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from pffs import retry
from pffs.backends.base import block_runs
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey, Blocks, ObjectBlocks
from pffs.errors import Corrupted
from pffs.fs.fetching import Store, StoreBlocks
from pffs.group.peers import Group
from pffs.group.pieces import Pieces
from pffs.group.protocol import BlockRequest
from pffs.group.server import AskSecond, NotServed
from pffs.routing.table import MountTable

PIECE = 256 * 1024  # the bytes of a block streamed at a time


class PeerBlocks:
    def __init__(self, group: Group, table: MountTable, cache: BlockCache) -> None:
        self.group = group
        self.table = table
        self.cache = cache
        self._streams: dict[BlockKey, Pieces] = {}  # blocks on their way from the store

    async def serve(self, request: BlockRequest) -> bytes | Pieces | None:
        blocks, index = request.blocks, request.index
        store = self._store_of(blocks)
        key = blocks.key(index)
        if request.cached_only:  # a handover: only what this member holds now
            return await self.cache.held(key)
        if not request.forwarded and self.group.to_second(blocks, index):
            raise AskSecond(key)
        pieces = self._streams.get(key)
        if pieces is not None:
            return pieces
        if self.cache.is_cached_or_coming(key):  # in memory, or a reader here is loading it
            whole = StoreBlocks(store, blocks)

            async def from_store() -> bytes:
                return await whole.part(blocks.start(index), blocks.length(index))

            source = _OwnerSide(self.group, request, whole, from_store)
            with retry.asking():  # the store's retries for this block stop within the usual bound
                return await self.cache.read(key, source, blocks.length(index))
        pieces = self._streams[key] = Pieces(blocks.length(index))
        trio.lowlevel.spawn_system_task(self._stream, store, request, pieces)
        return pieces

    def _store_of(self, blocks: ObjectBlocks) -> Store:
        if blocks.block_size != self.cache.block_size:
            raise NotServed(
                f"block size {blocks.block_size} (this member's is {self.cache.block_size})"
            )
        for mounted in self.table.mounted:
            backend = mounted.backend
            if backend.source_id == blocks.source and backend.principal == blocks.principal:
                return Store.of(mounted)  # the store itself: never asks the group
        raise NotServed("a source this member does not mount as that principal")

    async def _stream(self, store: Store, request: BlockRequest, pieces: Pieces) -> None:
        """Load the block into the cache, its pieces to `pieces` as they arrive (a system task:
        the fetch ends, and fills the cache, whoever stops listening)."""
        blocks, index = request.blocks, request.index
        key = blocks.key(index)

        async def from_store() -> bytes:
            return await _streamed(store, blocks, index, pieces)

        source = _OwnerSide(self.group, request, StoreBlocks(store, blocks), from_store)
        try:
            with retry.asking():
                data = await self.cache.read(key, source, blocks.length(index))
        except Exception as exc:
            pieces.fail(exc)
        else:
            pieces.finish(data)
        finally:
            pieces.fail(Corrupted("the block's fetch stopped"))  # nothing when it ended
            del self._streams[key]


class _OwnerSide:
    """The block source of a block a peer asked for (pffs.cache.keys.BlockSource): the owner's
    copy when this member is its second copy, the previous owner's during a handover, else
    `from_store` (Group.fetch_for_peer)."""

    def __init__(
        self,
        group: Group,
        request: BlockRequest,
        store: StoreBlocks,
        from_store: Callable[[], Awaitable[bytes]],
    ) -> None:
        self.group = group
        self.request = request
        self.store = store
        self.from_store = from_store

    async def part(self, offset: int, length: int) -> bytes:
        request = self.request
        return await self.group.fetch_for_peer(
            request.blocks, request.index, self.from_store, request.forwarded
        )

    def run(self, first: int, count: int) -> Blocks:
        return self.store.run(first, count)


async def _streamed(store: Store, blocks: ObjectBlocks, index: int, pieces: Pieces) -> bytes:
    """The block from the store in one GET, each piece added to `pieces` as it arrives (where
    the store streams runs; else whole)."""
    length = blocks.length(index)
    streaming = block_runs(store.backend)
    if streaming is None:
        return await StoreBlocks(store, blocks).part(blocks.start(index), length)
    received: list[bytes] = []

    def arrived(piece: bytes) -> None:
        received.append(piece)
        pieces.add(piece)

    token = trio.lowlevel.current_trio_token()

    def deliver(_: int, piece: bytes) -> None:  # in the worker thread
        trio.from_thread.run_sync(arrived, piece, trio_token=token)

    lengths = [min(PIECE, length - at) for at in range(0, length, PIECE)]
    await store.request(
        streaming.read_blocks,
        blocks.path,
        blocks.start(index),
        lengths,
        blocks.version,
        deliver,
        ahead=False,
    )
    data = b"".join(received)
    if len(data) != length:
        raise Corrupted(f"{blocks.path}: block {index} came back with {len(data)} bytes")
    return data

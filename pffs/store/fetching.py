"""Loading an object's bytes from its store: the one road of a block for readers, readahead,
preload and warmup.

A `Store` is one source's parts a request goes through: its backend (the client), the source's
flow (pffs.flow.permits: a reader's permits, and loading ahead's, halved when the store throttles,
shared by readahead, preload and warmup by priority) with the priority its loads ahead take, and
its breaker (pffs.routing.health: while the source is down a request fails at
once, and its outcome tells the breaker). `Store.of(mounted, use, tier)` takes them from the
mount table's entry. `StoreBlocks` is the store as the `BlockSource` (pffs.cache.keys) of one
open object version: `part` for a reader waiting on bytes, `run` for blocks loaded ahead,
yielded to the cache as they land. A streamed read of the store has one entry, `stream`: one
GET whose pieces are yielded as they arrive, with its request's permit, breaker, retries and
version pin in one place; a run's blocks are its pieces put together (in a cache group each is
added piece by piece to its flight, pffs.cache.singleflight, which says why), and a
region's bytes (pffs.fs.regions) are its pieces as they come. `open_blocks` puts the store's
joined tier (pffs.group: a cache group, a shared tier, handed to the store when it is built)
before it. What the cache tries before it asks a store (memory, a flight, the disk tier) is
pffs.cache.blocks'; a whole read, hop by hop, is in docs/ARCHITECTURE.md.

A short answer is `Corrupted`, never a short block in the cache; the version pins every request
to the object version the caller opened, so a changed object raises `Changed`. A reader's
request carries when the reader asked (pffs.retry.asking), so its retries stop within the one
bound docs/RELIABILITY.md states.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import trio

from pffs.backends.base import Backend, block_runs
from pffs.cache.keys import Blocks, BlockSource, ObjectBlocks
from pffs.cache.pieces import Pieces
from pffs.cache.singleflight import SingleFlight
from pffs.errors import Corrupted, SourceDown, Transient
from pffs.flow.permits import Ahead, SourceFlow
from pffs.retry import RetryTerms
from pffs.routing.health import SourceHealth
from pffs.routing.table import Mounted

T = TypeVar("T")

PIECE = 256 * 1024  # the bytes of a block announced at a time, for peers joining its fetch


class Joined(Protocol):
    """A tier joined, asked before the store (pffs.group.sources.Joined: a cache group, a
    shared tier; the group sits above the store, which only names what it asks of it)."""

    @property
    def arriving(self) -> SingleFlight | None:
        """The flights whose blocks the store streams piece by piece (a cache group's mount's,
        whose peers join them); None: blocks arrive whole."""

    def before(self, store: BlockSource, blocks: ObjectBlocks, priority: Ahead) -> BlockSource:
        """The blocks of one object version, the tier asked before `store`; its loads ahead
        asked of the tier as `priority`, its parts as a reader's."""


@dataclass(frozen=True, eq=False)
class Store:
    """One source as a fetch reaches it."""

    backend: Backend
    flow: SourceFlow  # its request permits: a reader never queues behind a load ahead
    breaker: SourceHealth
    priority: Ahead = "readahead"  # what this store's loads ahead are, for the flow's rule
    tier: Joined | None = None  # a cache group or shared tier asked before the store
    # The flights of the blocks this store sends, filled piece by piece as they arrive (a
    # cache group's mount's: a peer's request for one joins its fetch); None: blocks arrive
    # whole.
    arriving: SingleFlight | None = None

    @classmethod
    def of(
        cls,
        mounted: Mounted,
        priority: Ahead = "readahead",
        tier: Joined | None = None,
        arriving: SingleFlight | None = None,
    ) -> Store:
        """The source's parts; `arriving` defaults to the flights of the tier joined."""
        if arriving is None and tier is not None:
            arriving = tier.arriving
        return cls(mounted.backend, mounted.flow, mounted.health, priority, tier, arriving)

    async def request(self, fn: Callable[..., T], *args: object, ahead: bool) -> T:
        """`fn(*args, terms)` in a worker thread, holding a permit of the source's flow: a
        reader's, or a load ahead's of this store's priority; the flow hears of the store's
        throttling through the request's `terms` (pffs.retry.RetryTerms, handed down as its
        last argument)."""
        flow = self.flow
        if not ahead:
            return await self.breaker.call(flow.permit("reader"), fn, *args, self.breaker.terms())
        try:
            # A load ahead's failure does not mark the source down: its readers ask themselves.
            result = await self.breaker.call(
                flow.permit(self.priority),
                fn,
                *args,
                self.breaker.terms(flow.throttled),
                counts=False,
            )
        except SourceDown:
            raise  # refused by the breaker: the store never saw it
        except Transient:
            flow.throttled()  # throttled beyond its retries
            raise
        flow.went_well()
        return result


class StoreBlocks:
    """The blocks of one open object version, from its store."""

    def __init__(self, store: Store, blocks: ObjectBlocks) -> None:
        self.store = store
        self.blocks = blocks

    async def part(self, offset: int, length: int) -> bytes:
        """A reader's bytes. Where the store fills flights piece by piece (a cache group's
        peers join the fetch): a whole block is streamed in pieces, and a few bytes of a block
        on its way (a cold small read, which started the block's load: pffs.cache.blocks)
        are taken from its flight's pieces once they came, not asked for apart (one request
        for the block, not two); else a ranged GET."""
        blocks, flights = self.blocks, self.store.arriving
        index = offset // blocks.block_size
        start = offset - blocks.start(index)
        whole = start == 0 and length == blocks.length(index)
        if flights is not None and block_runs(self.store.backend):
            if whole:
                async with self._runs(index, 1, False) as landed:
                    # Taken to the run's end: the request has returned (the breaker heard of it).
                    return b"".join([data async for _, data in landed])
            if length > 0 and start + length <= blocks.length(index):
                key, size = blocks.key(index), blocks.length(index)
                data = await flights.part_of(key, size, start, length)
                if data is not None:
                    return data
        return await self._range(offset, length, ahead=False)

    def run(self, first: int, count: int) -> Blocks:
        """One request for the run where the store streams runs, else one per block."""
        if count == 1 and self.store.arriving is None:
            return _OneBlock(self, first)  # a small file's one block: no task, no channel
        return self._runs(first, count, True)

    @trio.as_safe_channel
    async def _runs(
        self, first: int, count: int, ahead: bool
    ) -> AsyncGenerator[tuple[int, bytes], None]:
        """Blocks first..first+count-1, each yielded once its last byte is in: from `stream`
        (one GET) where the store streams runs, else a ranged GET per block. With flights to
        fill (`Store.arriving`), each block under one (the cache's load of it) is streamed in
        pieces of `PIECE` bytes, each added to the flight's `Pieces` (pffs.cache.pieces) as it
        arrives, so a peer's request joining the fetch streams the bytes as they come."""
        blocks, board = self.blocks, self.store.arriving
        indices = range(first, first + count)
        if block_runs(self.store.backend) is None:
            for index in indices:
                yield index, await self._range(blocks.start(index), blocks.length(index), ahead)
            return
        plan: list[int] = []  # the block of each piece, in order
        lengths: list[int] = []
        for index in indices:
            sizes = [blocks.length(index)] if board is None else piece_lengths(blocks.length(index))
            plan += [index] * len(sizes)
            lengths += sizes
        # The flights' pieces: each ends with its flight (landed, or given up), whatever
        # becomes of this request.
        on_board: dict[int, Pieces] = {}
        if board is not None:
            for index in indices:
                flight = board.get(blocks.key(index))
                if flight is not None:
                    on_board[index] = flight.stream(blocks.length(index))
        received: list[bytes] = []
        number = -1
        async with self.stream(blocks.start(first), lengths, ahead) as arriving:
            async for piece in arriving:
                number += 1
                index = plan[number]
                received.append(piece)
                if index in on_board:
                    on_board[index].add(piece)
                if number + 1 == len(plan) or plan[number + 1] != index:
                    data = received[0] if len(received) == 1 else b"".join(received)
                    received.clear()
                    if index in on_board:
                        on_board[index].finish(data)
                    yield index, data

    @trio.as_safe_channel
    async def stream(
        self, offset: int, lengths: Sequence[int], ahead: bool
    ) -> AsyncGenerator[bytes, None]:
        """The one streamed read of the store: bytes from `offset` in one GET (a store that
        streams runs), in pieces of `lengths`, each yielded in order as it arrives; a failure
        is raised after the pieces that did arrive. The blocks of a run are pieces put
        together (`run`, `part`); a region's bytes, fetched just ahead of its reader
        (pffs.fs.regions), are handed out as they come. `ahead`: a load ahead, with a permit
        of its priority, its failure not marking the source down (its readers ask themselves);
        else a reader's request. The request's retries ask only for the pieces not yet handed over
        (the backend's `read_blocks`), pinned to the version opened."""
        streaming = block_runs(self.store.backend)
        assert streaming is not None  # callers check (streams_ranges)
        # Room for every piece, so the store's worker never waits on the caller.
        send, receive = trio.open_memory_channel[bytes](len(lengths))
        token = trio.lowlevel.current_trio_token()
        failure: Exception | None = None
        ended = False

        def arrived(piece: bytes) -> None:  # in this trio thread, in order
            if not ended:  # else a worker abandoned at a cancellation: nobody waits any more
                send.send_nowait(piece)

        def read(terms: RetryTerms) -> None:  # in the worker thread: each piece into trio's
            path, version = self.blocks.path, self.blocks.version
            for piece in streaming.read_blocks(path, offset, lengths, version, terms):
                token.run_sync_soon(arrived, piece)

        async def request() -> None:
            nonlocal failure, ended
            try:
                # The worker's last piece is queued before it returns: all have run in order
                # when the request returns.
                await self.store.request(read, ahead=ahead)
            except Exception as exc:  # raised here, after the pieces that did arrive
                failure = exc
            finally:
                ended = True
                send.close()

        # Closed once the request has ended: no piece is put in a closed channel.
        with receive:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request)
                async for piece in receive:
                    yield piece
        if failure is not None:
            raise failure

    @property
    def streams_ranges(self) -> bool:
        """Whether `stream` may be used: the store streams runs."""
        return block_runs(self.store.backend) is not None

    async def _range(self, offset: int, length: int, ahead: bool) -> bytes:
        blocks, backend = self.blocks, self.store.backend
        data = await self.store.request(
            backend.read_range, blocks.path, offset, length, blocks.version, ahead=ahead
        )
        if len(data) != length:
            raise Corrupted(f"{blocks.path}: bytes {offset}+{length} came back with {len(data)}")
        return data


class _OneBlock(trio.abc.ReceiveChannel[tuple[int, bytes]]):
    """The run of one block as a channel that fetches it when first asked: what
    `as_safe_channel` gives, without the task, nursery and memory channel it spends per run
    (every file of a cold epoch of small files is one such run: docs/notes/rgw-first-epoch.md)."""

    def __init__(self, source: StoreBlocks, index: int) -> None:
        self._source = source
        self._index: int | None = index

    async def receive(self) -> tuple[int, bytes]:
        index = self._index
        if index is None:
            raise trio.EndOfChannel
        self._index = None
        blocks = self._source.blocks
        data = await self._source._range(blocks.start(index), blocks.length(index), True)
        return index, data

    async def aclose(self) -> None:
        self._index = None
        await trio.lowlevel.checkpoint()


def piece_lengths(length: int) -> list[int]:
    """`length` bytes as pieces of `PIECE` bytes (the last one shorter)."""
    return [min(PIECE, length - at) for at in range(0, length, PIECE)]


def open_blocks(store: Store, blocks: ObjectBlocks) -> BlockSource:
    """Where the cache gets the blocks of one open object version: the store, with its joined
    tier (pffs.group), if any, asked first."""
    source = StoreBlocks(store, blocks)
    return source if store.tier is None else store.tier.before(source, blocks, store.priority)

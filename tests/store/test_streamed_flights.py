"""pffs.store.fetching filling the flights of the blocks it sends (pffs.cache.singleflight, the
one registry of blocks on their way), over the S3 backend on a real moto server: a whole block
under a flight comes in pieces of `PIECE` bytes, added to the pieces a peer's request streams
from before the fetch started; every block of a run lands exact; a partial read and a block with
no flight touch no flight; the pieces end with their flight, given up or landed."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from pffs import metrics
from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.cache.pieces import Pieces
from pffs.cache.singleflight import SingleFlight
from pffs.config import SourceConfig
from pffs.errors import Corrupted
from pffs.routing.table import Mounted
from pffs.store.fetching import PIECE, Store, StoreBlocks

BLOCK = 2 * PIECE


async def collected(pieces: Pieces) -> list[bytes]:
    return [piece async for piece in pieces.stream()]


def test_fetches_fill_their_flights_piece_by_piece(s3, bucket, moto) -> None:
    data = random.Random(3).randbytes(3 * BLOCK - 1000)
    s3.put_object(Bucket=bucket, Key="d.bin", Body=data)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    version = backend.stat("d.bin").version
    blocks = ObjectBlocks(backend.source_id, backend.principal, "d.bin", version, len(data), BLOCK)
    flights = SingleFlight()
    source = StoreBlocks(Store.of(Mounted("", backend), arriving=flights), blocks)

    def block(index: int) -> bytes:
        return data[index * BLOCK : (index + 1) * BLOCK]

    async def main() -> None:
        key = blocks.key(1)
        flight = flights.start(key)  # as the cache does before it asks the store
        streamed = flight.stream(blocks.length(1))  # as a peer's request does
        assert await source.part(BLOCK, BLOCK) == block(1)
        assert await collected(streamed) == [data[BLOCK : BLOCK + PIECE], block(1)[PIECE:]]
        flights.land(key, flight, block(1), "store")
        assert await source.part(BLOCK + 10, 100) == data[BLOCK + 10 : BLOCK + 110]
        assert flights.get(key) is None  # a partial read starts no flight
        # A run: the blocks under a flight fill it; block 1 has none and is only yielded.
        streams = {i: flights.start(blocks.key(i)).stream(blocks.length(i)) for i in (0, 2)}
        async with source.run(0, 3) as landing:
            landed = {index: got async for index, got in landing}
        assert landed == {i: block(i) for i in range(3)}
        for index, pieces in streams.items():
            assert b"".join(await collected(pieces)) == block(index)
        # The pieces end with their flight: given up, whoever streams them gets an error.
        given_up = flights.start(key)
        pieces = given_up.stream(blocks.length(1))
        flights.abandon(key, given_up, None)
        with pytest.raises(Corrupted):
            await collected(pieces)
        # A flight streamed only after it landed gives the whole block at once.
        late = flights.start(key)
        flights.land(key, late, block(1), "store")
        assert await collected(late.stream(blocks.length(1))) == [block(1)]

    trio.run(main)


def test_a_part_of_a_block_on_its_way_comes_from_its_flight(s3, bucket, moto) -> None:
    """A cold small read's bytes of a block whose load streams (a cache group's mount) come
    from the load's pieces as soon as they cover them: the run's one GET serves both. A part
    of a block whose flight is given up is asked of the store on its own."""
    data = random.Random(4).randbytes(2 * BLOCK)
    s3.put_object(Bucket=bucket, Key="p.bin", Body=data)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    version = backend.stat("p.bin").version
    blocks = ObjectBlocks(backend.source_id, backend.principal, "p.bin", version, len(data), BLOCK)
    flights = SingleFlight()
    source = StoreBlocks(Store.of(Mounted("", backend), arriving=flights), blocks)
    got: dict[str, bytes] = {}

    def gets() -> float:
        family = metrics.snapshot()["metrics"]["pffs_backend_requests_total"]
        wanted = {"source": backend.source_id, "request": "GET"}
        return float(sum(s["value"] for s in family["samples"] if s["labels"] == wanted))

    async def main() -> None:
        key = blocks.key(1)
        before = gets()
        flight = flights.start(key)  # as the cold start does before it asks for the bytes

        async def part(name: str, offset: int, length: int) -> None:
            got[name] = await source.part(offset, length)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(part, "first piece", BLOCK + 10, 100)
            nursery.start_soon(part, "across pieces", BLOCK + PIECE - 50, 100)
            await trio.testing.wait_all_tasks_blocked()
            assert got == {}  # waiting on the flight, no request of their own
            async with source.run(1, 1) as landing:
                async for _, block in landing:
                    flights.land(key, flight, block, "store")
        assert got == {
            "first piece": data[BLOCK + 10 : BLOCK + 110],
            "across pieces": data[BLOCK + PIECE - 50 : BLOCK + PIECE + 50],
        }
        assert gets() - before == 1  # the run's GET alone
        given_up = flights.start(blocks.key(0))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(part, "given up", 5, 10)
            await trio.testing.wait_all_tasks_blocked()
            flights.abandon(blocks.key(0), given_up, None)
        assert got["given up"] == data[5:15]

    trio.run(main)

"""pffs.store.fetching with a board of arriving blocks (pffs.cache.pieces), over the S3 backend on
a real moto server: a whole block comes in pieces of `PIECE` bytes, added to the pieces a peer's
request announced before the fetch started, and every block of a run lands exact; the board is
empty once the fetches end, and a partial read never touches it."""

from __future__ import annotations

import random

import trio

from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.cache.pieces import Arriving, Pieces
from pffs.config import SourceConfig
from pffs.routing.table import Mounted
from pffs.store.fetching import PIECE, Store, StoreBlocks

BLOCK = 2 * PIECE


async def collected(pieces: Pieces) -> list[bytes]:
    return [piece async for piece in pieces.stream()]


def test_fetches_fill_the_board_piece_by_piece(s3, bucket, moto) -> None:
    data = random.Random(3).randbytes(3 * BLOCK - 1000)
    s3.put_object(Bucket=bucket, Key="d.bin", Body=data)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    version = backend.stat("d.bin").version
    blocks = ObjectBlocks(backend.source_id, backend.principal, "d.bin", version, len(data), BLOCK)
    board = Arriving()
    source = StoreBlocks(Store.of(Mounted("", backend), arriving=board), blocks)

    async def main() -> None:
        announced = board.announce(blocks.key(1), blocks.length(1))  # as a peer's request does
        assert await source.part(BLOCK, BLOCK) == data[BLOCK : 2 * BLOCK]
        assert await collected(announced) == [
            data[BLOCK : BLOCK + PIECE],
            data[BLOCK + PIECE : 2 * BLOCK],
        ]
        assert await source.part(BLOCK + 10, 100) == data[BLOCK + 10 : BLOCK + 110]
        async with source.run(0, 3) as landing:
            landed = {index: block async for index, block in landing}
        assert landed == {i: data[i * BLOCK : (i + 1) * BLOCK] for i in range(3)}
        assert all(board.get(blocks.key(i)) is None for i in range(3))

    trio.run(main)

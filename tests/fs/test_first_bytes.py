"""A cold read of a block's first bytes (a file's first READ): its own request, and the block
loaded behind it takes those bytes instead of asking the store for them again
(pffs.fs.firstbytes).

The store is tests/fs/test_reads_through_cache.py's fake that serves runs in one request (as S3
does) and records every range asked, which is what these tests count; here it can also refuse
one range for good, which no real server does on demand.
"""

from __future__ import annotations

import os
import random

import pytest
import trio

from pffs.errors import NotFound
from pffs.fs.inodes import ROOT_INODE
from pffs.retry import RetryTerms
from tests.cache.configs import KIB, cache_config
from tests.fs.test_reads_through_cache import RunStore, cached_vfs, with_nursery
from tests.fs.test_region_streams import _fetched_twice

MIB = 1024 * KIB
BLOCK = 2 * MIB
READ = 512 * KIB  # the kernel's READs here (a quarter of a block, as 1 MiB of 4 MiB)
CONFIG = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)


def test_a_file_read_cold_from_its_start_fetches_each_byte_once() -> None:
    data = random.Random(1).randbytes(6 * BLOCK + 1000)
    store = RunStore({"f": data})
    reads = [(offset, READ) for offset in range(0, len(data), READ)]
    got = trio.run(with_nursery, cached_vfs(store, CONFIG), "f", reads)
    assert b"".join(got) == data
    assert (0, READ) in store.ranges  # the first READ's own request
    assert _fetched_twice(store.ranges) == 0
    assert sum(length for _, length in store.ranges) == len(data)


class RefusingStore(RunStore):
    """Refuses one range the first time it is asked (a NotFound: never retried)."""

    def __init__(self, files: dict[str, bytes], refused: tuple[int, int]) -> None:
        super().__init__(files)
        self.refused = refused

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        if (start, length) == self.refused:
            self.refused = (-1, -1)
            raise NotFound(path)
        return super().read_range(path, start, length, version, terms)


def test_a_first_read_whose_request_fails_leaves_its_bytes_to_the_block_load() -> None:
    """The READ sees its request's error; the block behind it, waiting for those bytes, asks
    for them itself, so the block lands whole and the next READ of them is served from it."""
    data = random.Random(2).randbytes(3 * BLOCK)
    store = RefusingStore({"f": data}, refused=(0, READ))
    vfs = cached_vfs(store, CONFIG)

    async def run() -> bytes:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            with pytest.raises(NotFound):
                await vfs.read(fh, 0, READ)
            await vfs.drain()  # the block load behind it ended
            again = bytes(await vfs.read(fh, 0, READ))
            await vfs.release(fh)
            nursery.cancel_scope.cancel()
        return again

    assert trio.run(run) == data[:READ]
    # Of block 0 (the refused request is not counted): the load's rest, and the head it did
    # not get from the READ; the second READ asked for nothing.
    block_zero = [(start, n) for start, n in store.ranges if start < BLOCK]
    assert sorted(block_zero) == [(0, READ), (READ, BLOCK - READ)]

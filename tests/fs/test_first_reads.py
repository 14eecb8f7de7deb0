"""A file's first two READs (pffs.fs.reads `_first_reads`): the kernel sends them together and
waits for both, so the second must not wait for the whole of block 0.

The store is tests/fs/test_reads_through_cache.py's fake that serves runs in one request (as S3
does), here holding the requests for block 0's bytes past the first two READs until the test
lets them go, which no real server does on demand; the real path through S3 and the kernel is
the clients probe's (bench/probes/client_reads.py, docs/notes/clients-first-reads.md).
"""

from __future__ import annotations

import os
import random
import threading

import pytest
import trio
import trio.testing

from pffs.fs.inodes import ROOT_INODE
from pffs.retry import RetryTerms
from tests.cache.configs import KIB, cache_config
from tests.fs.helpers import make_vfs
from tests.fs.test_reads_through_cache import NO_TTLS, RunStore
from tests.fs.test_region_streams import _fetched_twice

MIB = 1024 * KIB
BLOCK = 2 * MIB
READ = 512 * KIB  # the kernel's READs here (a quarter of a block, as 1 MiB of 4 MiB)


class HeldStore(RunStore):
    """Holds every request for bytes of block 0 past its first two READs (in the worker
    thread, so only that request waits) until `release` is set."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.release = threading.Event()

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        if start < BLOCK and start + length > 2 * READ:
            self.release.wait(timeout=30)
        return super().read_range(path, start, length, version, terms)


def _read_through(
    store: HeldStore, order: tuple[int, int] = (0, READ)
) -> tuple[list[bytes], list[bytes], int]:
    """The first two READs at once, the first in `order` asking first (both must return while
    the rest of block 0 is held), then the rest of the file in order; (the first two, the
    rest, bytes parked)."""
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    vfs = make_vfs(store, meta=NO_TTLS, cache=config)
    size = len(store.files["f"])
    first: dict[int, bytes] = {}
    parked = 0

    async def run() -> list[bytes]:
        nonlocal parked
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)

            async def read(offset: int) -> None:
                first[offset] = bytes(await vfs.read(fh, offset, READ))

            try:
                # A guard, not a timing: on a READ waiting for the held bytes it fails.
                with trio.fail_after(20):
                    async with trio.open_nursery() as both:
                        both.start_soon(read, order[0])
                        await trio.testing.wait_all_tasks_blocked()  # it asked first
                        both.start_soon(read, order[1])
                assert not store.release.is_set()
            finally:
                store.release.set()
            rest = [bytes(await vfs.read(fh, o, READ)) for o in range(2 * READ, size, READ)]
            parked = vfs.reader.parking.used
            await vfs.release(fh)
            await vfs.drain()
            nursery.cancel_scope.cancel()
        return rest

    rest = trio.run(run)
    return [first[0], first[READ]], rest, parked


@pytest.mark.parametrize("order", [(0, READ), (READ, 0)])
def test_the_second_read_is_served_without_waiting_for_block_zero(order: tuple[int, int]) -> None:
    """In either order: trio may run the second READ's task first."""
    data = random.Random(1).randbytes(6 * BLOCK + 1000)
    store = HeldStore({"f": data})
    first, rest, parked = _read_through(store, order)
    assert first == [data[:READ], data[READ : 2 * READ]]
    assert b"".join(first + rest) == data
    # Block 0 took the first request's bytes: nothing fetched twice, nor parked on disk.
    assert _fetched_twice(store.ranges) == 0
    assert sum(n for _, n in store.ranges) == len(data)
    assert parked == 0


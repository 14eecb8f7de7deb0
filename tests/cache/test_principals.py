"""Two principals on one source share no block: not in memory, not in flight, not on disk
(another mount over the same cache directory), not in the dataset room.

The store is played by fetch functions: the one principal's returns the bytes, the other's is
refused as a store refuses it (PermissionDenied). A block the first one cached must never be
what the second one reads; it must reach the store and be refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from pffs.cache.blocks import BlockCache
from pffs.cache.datasetroom import DatasetRoom
from pffs.cache.disk import entry_key
from pffs.cache.keys import BlockKey, ObjectBlocks
from pffs.errors import PermissionDenied
from tests.cache.configs import KIB, FetchSource, cache_config

BLOCK = 16 * KIB
SECRET = b"top secret " * (BLOCK // 11)


def _blocks(principal: str) -> ObjectBlocks:
    return ObjectBlocks(
        "s3://bucket@http://store", principal, "secret/plan.txt", '"e1"', 100, BLOCK
    )


async def _allowed() -> bytes:
    return SECRET[:100]


async def _denied() -> bytes:
    await trio.sleep(0)
    raise PermissionDenied("secret/plan.txt: AccessDenied")


def test_the_principal_is_part_of_every_key() -> None:
    alice, bob = _blocks("alice"), _blocks("bob")
    assert alice.key(0) != bob.key(0)
    assert alice.ident != bob.ident  # the preload engine's items
    assert entry_key(alice.key(0), BLOCK) != entry_key(bob.key(0), BLOCK)
    # The entry key is a digest: the principal (itself a digest) does not show in it.
    assert "alice" not in entry_key(alice.key(0), BLOCK)


def test_a_block_one_principal_cached_on_disk_is_not_served_to_another(tmp_path: Path) -> None:
    """The first mount reads and writes the block to the shared directory, then closes; the
    second, over the same directory, reads the same object as another principal."""

    async def first_mount() -> None:
        cache = BlockCache(cache_config(tmp_path, BLOCK))
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            assert (
                await cache.read(_blocks("alice").key(0), FetchSource(_allowed), 100)
                == SECRET[:100]
            )
            await cache.flush()
            nursery.cancel_scope.cancel()
        cache.close()

    async def second_mount() -> None:
        cache = BlockCache(cache_config(tmp_path, BLOCK))
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            with pytest.raises(PermissionDenied):
                await cache.read(_blocks("bob").key(0), FetchSource(_denied), 100)
            # The first principal's block is there all the same: the keys differ, not the data.
            assert (
                await cache.read(_blocks("alice").key(0), FetchSource(_denied), 100) == SECRET[:100]
            )
            nursery.cancel_scope.cancel()
        cache.close()

    trio.run(first_mount)
    trio.run(second_mount)


def test_two_principals_in_one_process_share_neither_memory_nor_a_fetch() -> None:
    """Both readers at once: each waits on its own fetch, never on the other's."""
    cache = BlockCache(cache_config(None, BLOCK))
    results: dict[str, bytes | Exception] = {}

    async def slow_allowed() -> bytes:
        await trio.sleep(0.05)
        return SECRET[:100]

    async def reader(principal: str, fetch: Callable[[], Awaitable[bytes]]) -> None:
        try:
            results[principal] = await cache.read(
                _blocks(principal).key(0), FetchSource(fetch), 100
            )
        except PermissionDenied as exc:
            results[principal] = exc

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, "alice", slow_allowed)
            await trio.sleep(0.01)  # alice's fetch is in flight
            nursery.start_soon(reader, "bob", _denied)
        # And after it, from the memory tier: still refused.
        await reader("bob", _denied)

    # Virtual time: alice's fetch is surely in flight when bob starts, however busy the machine.
    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert results["alice"] == SECRET[:100]
    assert isinstance(results["bob"], PermissionDenied)
    assert cache.stats.single_flight_waits == 0


def test_the_dataset_room_counts_only_its_principal_s_blocks() -> None:
    async def main() -> None:
        room = DatasetRoom(capacity=1 << 30)
        watched = room.watch("/train", "s3://b", "alice", "train/")
        assert room.admit(BlockKey("s3://b", "bob", "train/f", "v", 0), 100)  # not in it
        assert watched.cached == 0
        assert room.admit(BlockKey("s3://b", "alice", "train/f", "v", 0), 100)
        assert watched.cached == 100

    trio.run(main)

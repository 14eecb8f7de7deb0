"""The block cache on its own (no VFS): single-flight and the memory tier's bound."""

from __future__ import annotations

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey
from pffs.errors import Transient
from tests.cache.configs import KIB, FetchSource, cache_config

# --- single-flight ---------------------------------------------------------------------------


def test_concurrent_readers_share_one_fetch() -> None:
    cache = BlockCache(cache_config(None))
    calls = 0

    async def fetch() -> bytes:
        nonlocal calls
        calls += 1
        await trio.sleep(0.05)
        return b"x" * 100

    async def main() -> None:
        key = BlockKey("s", "u", "p", "v", 0)
        results = []

        async def reader() -> None:
            results.append(await cache.read(key, FetchSource(fetch), 16 * KIB))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(reader)
        assert results == [b"x" * 100] * 10

    trio.run(main)
    assert calls == 1
    assert cache.stats.single_flight_waits == 9


def test_a_failed_fetch_reaches_every_waiter_and_is_retried_later() -> None:
    cache = BlockCache(cache_config(None))
    attempts = 0

    async def fetch() -> bytes:
        nonlocal attempts
        attempts += 1
        await trio.sleep(0.01)
        if attempts == 1:
            raise Transient("store down")
        return b"ok"

    async def main() -> None:
        key = BlockKey("s", "u", "p", "v", 0)
        errors = 0

        async def reader() -> None:
            nonlocal errors
            try:
                await cache.read(key, FetchSource(fetch), 16 * KIB)
            except Transient:
                errors += 1

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(reader)
        assert errors == 3
        assert await cache.read(key, FetchSource(fetch), 16 * KIB) == b"ok"

    trio.run(main)
    assert attempts == 2


# --- the memory tier ---------------------------------------------------------------------------


def test_memory_tier_stays_within_its_bound() -> None:
    config = cache_config(None, memory_bytes=10 * 16 * KIB, ahead_budget=2 * 16 * KIB)
    cache = BlockCache(config)

    async def main() -> None:
        for index in range(100):

            async def fetch() -> bytes:
                return bytes(16 * KIB)

            await cache.read(BlockKey("s", "u", "p", "v", index), FetchSource(fetch), 16 * KIB)
            assert cache.memory.used <= cache.memory.capacity

    trio.run(main)
    assert cache.memory.used == 8 * 16 * KIB and cache.stats.memory_evictions == 92

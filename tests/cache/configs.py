"""Small cache configurations for the cache's own tests (16 KiB blocks, a memory tier of 64),
and `FetchSource`, the block source of a test that plays the store with a fetch function."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path

import trio

from pffs.config import CacheConfig

KIB = 1024


def cache_config(tmp_path: Path | None, block: int = 16 * KIB, **kwargs) -> CacheConfig:
    settings_ = {
        "block_size": block,
        "memory_bytes": 64 * block,
        "disk_dir": str(tmp_path / "cache") if tmp_path else None,
        "readahead_max": 8 * block,
        "ahead_budget": 16 * block,
        "free_ratio": 0.0,  # no floor: whatever the machine's disk holds (tests/conftest.py)
        **kwargs,
    }
    return CacheConfig(**settings_)


class FetchSource:
    """A block source whose every part is what `fetch` returns: a test's store for readers
    asking for one block at a time. Loading ahead never asks it."""

    def __init__(self, fetch: Callable[[], Awaitable[bytes]]) -> None:
        self.fetch = fetch

    async def part(self, offset: int, length: int) -> bytes:
        return await self.fetch()

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        raise AssertionError("loading ahead asked a source meant for readers")
        yield first, b""  # an async generator all the same

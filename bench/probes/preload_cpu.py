"""`python -m bench.probes.preload_cpu`: the trio thread's CPU per file of the preload engine.

Not part of the bench suite, and no store: `--files` items of one 100 KiB block each go
through pffs.cache.preload's engine into a memory-only BlockCache, each fetched in a worker
thread (pffs.workers.run_blocking, as a GET is) that returns the bytes at once. What is
left is the engine's own cost per file: dispatch, flights, the thread hop, landing in memory.
Run it under another tree's code to compare two commits (see bench.probes.get_cpu).

    python -m bench.probes.preload_cpu --files 4000
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import AsyncGenerator

import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey
from pffs.cache.preload import Preloader, PreloadItem, job_channel
from pffs.config import CacheConfig
from pffs.workers import run_blocking

MIB = 1 << 20
SIZE = 100 * 1024


def _item(limiter: trio.CapacityLimiter, number: int, data: bytes) -> PreloadItem:
    keys = [BlockKey("bench", "u", f"f{number}", "v1", 0)]

    class Source:  # one block, a copy of `data` made in a worker thread, as a GET's
        async def part(self, offset: int, length: int) -> bytes:
            return await run_blocking(limiter, bytes, data)

        @trio.as_safe_channel
        async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
            yield 0, await self.part(0, SIZE)

    return PreloadItem(("bench", f"f{number}"), keys, [SIZE], Source())


async def _run(files: int) -> None:
    config = CacheConfig(
        block_size=4 * MIB,
        memory_bytes=max(64 * MIB, 2 * files * SIZE),
        disk_dir=None,
        readahead_max=32 * MIB,
        ahead_budget=256 * MIB,
    )
    cache = BlockCache(config)
    engine = Preloader(cache, budget=64 * MIB, unread_max=1 << 40)
    limiter = trio.CapacityLimiter(64)
    data = os.urandom(SIZE)

    send, receive = job_channel()

    async def feed() -> None:
        async with send:
            for number in range(files):
                await send.send(_item(limiter, number, data))

    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        cpu, wall = time.process_time(), time.perf_counter()
        engine.add("bench", receive, for_readers=False)
        nursery.start_soon(feed)
        await engine.wait_idle()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{cpu / files * 1e6:6.1f} us of CPU per file, {files / wall:7.0f} files/s")
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    args = parser.parse_args()
    if args.files <= 0:
        parser.error("--files must be above 0")
    trio.run(_run, args.files)


if __name__ == "__main__":
    main()

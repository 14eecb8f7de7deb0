"""Loading an object's bytes from its store: the one fetch path of readers, dataset prefetch
and warmup.

Both run under a limiter (pffs.workers): a reader's under its source's, prefetch under its
own. A short answer is `Corrupted`, never a short block in the cache; `version` pins every
request to the object version the caller opened, so a changed object raises `Changed`.
"""

from __future__ import annotations

import trio

from pffs.backends.base import Backend, block_runs
from pffs.cache.keys import Deliver, FetchRun, ObjectBlocks
from pffs.errors import Corrupted
from pffs.workers import run_blocking


async def fetch_range(
    limiter: trio.CapacityLimiter,
    backend: Backend,
    path: str,
    version: str,
    offset: int,
    length: int,
) -> bytes:
    """Bytes [offset, offset+length) of `path` in `backend`, all of them."""
    data = await run_blocking(limiter, backend.read_range, path, offset, length, version)
    if len(data) != length:
        raise Corrupted(f"{path}: bytes {offset}+{length} came back with {len(data)} bytes")
    return data


def fetch_runs(
    limiter: trio.CapacityLimiter, backend: Backend, blocks: ObjectBlocks, base: int = 0
) -> FetchRun:
    """The cache's fetch of runs of `blocks`, window position p being block `base` + p: each
    block handed over as it lands. One request for a run where the store streams runs, else one
    per block."""

    async def fetch_run(first: int, count: int, deliver: Deliver) -> None:
        indices = range(base + first, base + first + count)
        streaming = block_runs(backend)
        if count == 1 or streaming is None:
            for position, index in enumerate(indices, first):
                offset, length = blocks.start(index), blocks.length(index)
                data = await fetch_range(
                    limiter, backend, blocks.path, blocks.version, offset, length
                )
                await deliver(position, data)
            return

        token = trio.lowlevel.current_trio_token()

        def hand_over(i: int, data: bytes) -> None:  # in the worker thread
            trio.from_thread.run(deliver, first + i, data, trio_token=token)

        await run_blocking(
            limiter,
            streaming.read_blocks,
            blocks.path,
            blocks.start(indices.start),
            blocks.lengths(indices),
            blocks.version,
            hand_over,
        )

    return fetch_run

"""Loading an object's bytes from its store: the one fetch path of readers, dataset prefetch
and warmup.

Both run under a limiter (pffs.workers): a reader's under its source's, prefetch under its
own. A short answer is `Corrupted`, never a short block in the cache; `version` pins every
request to the object version the caller opened, so a changed object raises `Changed`.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from pffs.backends.base import Backend, block_runs
from pffs.cache.keys import Deliver
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


async def fetch_blocks(
    limiter: trio.CapacityLimiter,
    backend: Backend,
    path: str,
    version: str,
    block_size: int,
    first_index: int,
    sizes: Sequence[int],
    deliver: Deliver,
    first_position: int,
) -> None:
    """Consecutive blocks from `first_index` (their lengths `sizes`), each handed over as it
    lands: `deliver(first_position + i, data)` for the i-th. One request for the whole run
    where the store streams runs, else one per block."""
    streaming = block_runs(backend)
    if len(sizes) == 1 or streaming is None:
        for i, size in enumerate(sizes):
            offset = (first_index + i) * block_size
            data = await fetch_range(limiter, backend, path, version, offset, size)
            await deliver(first_position + i, data)
        return

    token = trio.lowlevel.current_trio_token()

    def hand_over(i: int, data: bytes) -> None:  # in the worker thread
        trio.from_thread.run(deliver, first_position + i, data, trio_token=token)

    await run_blocking(
        limiter,
        streaming.read_blocks,
        path,
        first_index * block_size,
        list(sizes),
        version,
        hand_over,
    )

"""Loading an object's bytes from its store: the one fetch path of readers, readahead, preload
and warmup.

Each runs under a limiter (pffs.workers): a reader's under its source's, a load ahead under its
own, sized by its `Pace` (pffs.pace: halved when the store pushes back). A short answer is
`Corrupted`, never a short block in the cache; `version` pins every request to the object
version the caller opened, so a changed object raises `Changed`. Every request passes its
source's breaker (pffs.routing.health): while the source is down it fails at once, and its
outcome tells the breaker. A reader's request carries when the reader asked
(pffs.retry.asking), so its retries stop within the one bound the README states. With a block
source joined (pffs.group: a cache group, a shared tier), it is asked before the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from pffs import group, retry
from pffs.backends.base import Backend, block_runs
from pffs.cache.keys import Deliver, FetchRun, ObjectBlocks
from pffs.errors import Corrupted
from pffs.pace import Pace
from pffs.routing import health
from pffs.workers import run_blocking

T = TypeVar("T")


async def fetch_range(
    limiter: trio.CapacityLimiter,
    backend: Backend,
    path: str,
    version: str,
    offset: int,
    length: int,
    pace: Pace | None = None,
    blocks: ObjectBlocks | None = None,
) -> bytes:
    """Bytes [offset, offset+length) of `path` in `backend`, all of them. Given the `blocks`
    of the object, a joined block source (pffs.group) is asked first, and hears of a whole
    block the store served."""
    peers = group.current()
    if peers is not None and blocks is not None:
        from_peer = await peers.fetch_range(blocks, offset, length)
        if from_peer is not None:
            return from_peer
    data = await _request(limiter, pace, backend, backend.read_range, path, offset, length, version)
    if len(data) != length:
        raise Corrupted(f"{path}: bytes {offset}+{length} came back with {len(data)} bytes")
    if peers is not None and blocks is not None:
        peers.stored(blocks, offset, data)
    return data


def fetch_runs(
    limiter: trio.CapacityLimiter | Pace, backend: Backend, blocks: ObjectBlocks, base: int = 0
) -> FetchRun:
    """The cache's fetch of runs of `blocks`, window position p being block `base` + p: each
    block handed over as it lands. One request for a run where the store streams runs, else one
    per block. Under a `Pace`, the store's push backs shrink the limiter."""
    pace = limiter if isinstance(limiter, Pace) else None
    places = limiter.limiter if isinstance(limiter, Pace) else limiter

    async def fetch_run(first: int, count: int, deliver: Deliver) -> None:
        indices = range(base + first, base + first + count)
        streaming = block_runs(backend)
        if count == 1 or streaming is None:
            for position, index in enumerate(indices, first):
                offset, length = blocks.start(index), blocks.length(index)
                data = await fetch_range(
                    places, backend, blocks.path, blocks.version, offset, length, pace
                )
                await deliver(position, data)
            return

        token = trio.lowlevel.current_trio_token()

        def hand_over(i: int, data: bytes) -> None:  # in the worker thread
            trio.from_thread.run(deliver, first + i, data, trio_token=token)

        await _request(
            places,
            pace,
            backend,
            streaming.read_blocks,
            blocks.path,
            blocks.start(indices.start),
            blocks.lengths(indices),
            blocks.version,
            hand_over,
        )

    peers = group.current()
    return fetch_run if peers is None else peers.fetch_runs(blocks, base, fetch_run)


async def _request(
    limiter: trio.CapacityLimiter,
    pace: Pace | None,
    backend: Backend,
    fn: Callable[..., T],
    *args: object,
) -> T:
    """`fn(*args)` in a worker thread under `limiter`, through the source's breaker; a
    load ahead's request (under a `pace`) tells that pace of the store's push backs."""
    breaker = health.of(backend.source_id)
    if pace is not None:
        pace.settle()
    pushed_back = None if pace is None else pace.pushed_back
    if breaker is None:  # a backend no mount table holds (warmup)
        result = await run_blocking(limiter, retry.carrying(fn, pushed_back), *args)
    else:
        # A load ahead's failure does not mark the source down: its readers will ask themselves.
        result = await breaker.call(
            limiter, fn, *args, counts=pace is None, on_pushback=pushed_back
        )
    if pace is not None:
        pace.settle()
        pace.went_well()
    return result

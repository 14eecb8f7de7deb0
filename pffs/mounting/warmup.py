"""Warmup of a source: its files loaded into the disk cache through the parts a mount uses.

The source is opened as a mount opens it (pffs.mounting.serving's `open_table`: its backend,
its flow and its breaker), the cache as a mount opens it (`open_cache`), and its files go
through the preload engine (pffs.cache.preload), the one code path that fills the cache, with
their fetches taking permits of the source's flow as warmup (pffs.flow.permits: after
readahead and preload). So a mount over the same cache directory finds the blocks, a source
that goes down fails the rest at once instead of each file waiting out its retries, and the
store's throttling slows warmup down.

One task lists the files, a chunk of a listing at a time, and sends them into the job's bounded
channel as the engine takes them: a prefix of millions of objects is never held as one list.
`WarmupTally` counts what was found and done; the CLI (pffs.cli.warmup) prints it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import trio

from pffs.backends.base import ObjectInfo, join
from pffs.cache.preload import Preloader, PreloadItem, job_channel
from pffs.config import CacheConfig, GroupConfig, SourceConfig, TableEntry
from pffs.errors import UsageError
from pffs.flow.permits import at_once
from pffs.fs.datasets import file_item
from pffs.group.sources import Joined
from pffs.mounting.grouping import asking_group
from pffs.mounting.serving import open_cache, open_table
from pffs.routing.table import Mounted
from pffs.store.fetching import Store

# Entries of a listing taken at once: an S3 page's worth.
LIST_CHUNK = 1000


@dataclass
class WarmupTally:
    """What warmup found and did so far (files and bytes), for a progress line and a summary."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    bytes_fetched: int = 0
    bytes_cached: int = 0
    bytes_read_through: int = 0  # read through a mount, whose own cache keeps what it fetched
    blocks_skipped: int = 0
    failures: list[str] = field(default_factory=list)


async def warm_source(
    source: SourceConfig,
    cache_config: CacheConfig,
    paths: list[str],
    jobs: int,
    tally: WarmupTally,
    group_config: GroupConfig | None = None,
) -> None:
    """Fill the disk tier with the files at or under `paths` of `source`, `jobs` files at a
    time at most; each file's outcome counted in `tally`. With the mount's `group_config`, the
    blocks other members own are asked of them (each owner loads its own once)."""
    table = open_table([TableEntry("", source)])
    (mounted,) = table.mounted
    await mounted.health.call(mounted.flow.permit("reader"), mounted.backend.check)
    cache = open_cache(cache_config, table.memory_only)
    if not cache.disk_holds(mounted.backend.source_id):
        cache.close()
        raise UsageError(f"{source.url} is cached in memory only")
    # `jobs` files at once at most, and no more than the permits the flow gives warmup now.
    engine = Preloader(
        cache,
        cache.ahead.total,
        concurrency=lambda: at_once([mounted.flow], "warmup", jobs),
        idle_after=math.inf,
    )
    peers = await asking_group(group_config, table) if group_config is not None else None
    # The source's parts: warmup's permits of its flow (pffs.flow.permits), the group's owners asked
    # before the store.
    tier = None if peers is None else Joined(peers)
    store = Store.of(mounted, "warmup", tier)
    skips_before = cache.stats.disk_write_skips
    send, receive = job_channel()

    async def list_files() -> None:
        async with send:
            for path in paths:
                async for child, info in _files(mounted, path):
                    tally.files_total += 1
                    tally.bytes_total += info.size
                    if info.size == 0:
                        tally.files_done += 1  # nothing to load
                        continue
                    await send.send(file_item(store, child, info, cache.block_size))

    def done(item: PreloadItem, outcome: int | Exception) -> None:
        tally.files_done += 1
        tally.bytes_done += item.size
        if isinstance(outcome, Exception):
            tally.failures.append(f"{item.keys[0].path}: {outcome}")
            return
        tally.bytes_fetched += outcome
        tally.bytes_cached += item.size - outcome

    try:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            engine.attach(nursery)
            nursery.start_soon(mounted.health.watch)  # the source's probes while it is down
            engine.add("warmup", receive, report=done, for_readers=False)
            nursery.start_soon(list_files)
            await engine.wait_idle()
            await cache.flush()  # every block written before the cache is closed
            nursery.cancel_scope.cancel()
    finally:
        tally.blocks_skipped += cache.stats.disk_write_skips - skips_before
        cache.close()
        if peers is not None:
            peers.close()


async def _files(mounted: Mounted, path: str) -> AsyncIterator[tuple[str, ObjectInfo]]:
    """Every file at or under `path`, depth first; a listing is taken a chunk at a time (its
    pages fetched as taken), so no directory, however large, is held whole."""
    backend = mounted.backend
    health = mounted.health
    info = await health.call(mounted.flow.permit("reader"), backend.stat, path, health.terms())
    if not info.is_dir:
        yield path, info
        return
    # A generator: no request until a chunk is taken; its pages' retries stop when the source
    # goes down.
    entries = iter(backend.list(path, health.terms()))
    while True:
        chunk = await health.call(mounted.flow.permit("reader"), _take, entries, LIST_CHUNK)
        for entry in chunk:
            child = join(path, entry.name)
            if entry.is_dir:
                async for found in _files(mounted, child):
                    yield found
            else:
                yield child, entry
        if len(chunk) < LIST_CHUNK:
            return


def _take(entries: Iterator[ObjectInfo], count: int) -> list[ObjectInfo]:
    return list(itertools.islice(entries, count))

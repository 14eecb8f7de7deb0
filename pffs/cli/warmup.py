"""Warmup and cache administration: fill, inspect and empty the disk cache (the cli calls these).

Warmup talks to the store directly (no FUSE round trips) with the very block keys a mount uses, so a
mount over the same cache directory finds the blocks. It loads files through the preload engine
(pffs.cache.preload), the one code path that fills the cache, as preload by dataset does. For a path
inside a live pffs mount the mount's own configuration (source, block size, cache directory) is
used; for a source URL, the cache options on the command line. Blocks already on disk are skipped,
so a second run costs one database lookup per block. A path in a mount that left no record here
(a bind mount in a Fluid or CSI pod, a mount given keys of its own) is read through the mount
instead (pffs.cli.warmthrough).
On a member of a cache group (pffs.group), the blocks other members own are asked of them: each
owner loads its own from the store once, so one warmup fills the whole group in parallel.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import trio

from pffs import group
from pffs.backends import Backend, ObjectInfo, open_backend
from pffs.backends.base import join
from pffs.cache.disk import DiskTier
from pffs.cache.preload import Preloader, PreloadItem
from pffs.cli.warmthrough import warm_through
from pffs.config import CacheConfig, GroupConfig, SourceConfig, TableEntry
from pffs.errors import UsageError
from pffs.fs.datasets import file_item
from pffs.fs.fetching import Store
from pffs.mounting.kernel import FSTYPE, mount_table
from pffs.mounting.registry import registered_config
from pffs.mounting.serving import open_cache
from pffs.pace import Pace
from pffs.routing.table import is_under, longest_prefix, relative
from pffs.workers import run_blocking

GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Target:
    """What to warm: a source and paths inside it, or (source None) paths inside a mount whose
    record this process cannot see, read through the mount (pffs.cli.warmthrough)."""

    source: SourceConfig | None
    cache: CacheConfig
    paths: list[str] = field(default_factory=list)
    # The cache group of the mount (pffs.group): its blocks' owners are asked, not the store.
    group: GroupConfig | None = None


@dataclass
class Progress:
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    bytes_fetched: int = 0
    bytes_cached: int = 0
    bytes_read_through: int = 0  # read through a mount, whose own cache keeps what it fetched
    blocks_skipped: int = 0
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.bytes_done / elapsed
        share = self.bytes_done / self.bytes_total if self.bytes_total else 1.0
        bar = "#" * int(share * 24)
        eta = (self.bytes_total - self.bytes_done) / rate if rate > 0 else 0.0
        return (
            f"[{bar:<24}] {self.files_done}/{self.files_total} files  "
            f"{_size(self.bytes_done)}/{_size(self.bytes_total)}  "
            f"{rate / MIB:.0f} MiB/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        )

    def summary(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.bytes_fetched / elapsed / MIB if elapsed > 0 else 0.0
        text = (
            f"warmup: {self.files_done} files, {_size(self.bytes_total)}: "
            f"{_size(self.bytes_fetched)} fetched, {_size(self.bytes_cached)} already cached, "
            f"{self.blocks_skipped} blocks not stored (disk full), in {elapsed:.1f}s "
            f"({rate:.0f} MiB/s)"
        )
        if self.bytes_read_through:
            text += (
                f"; {_size(self.bytes_read_through)} read through the mount "
                "(its cache keeps what it fetched)"
            )
        if self.failures:
            text += f"; {len(self.failures)} failed: " + "; ".join(self.failures[:3])
        return text


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def _mount_of(path: str) -> tuple[str, str] | None:
    """(mountpoint, path inside it) of the live pffs mount holding `path`."""
    best = None
    for entry in mount_table():
        if entry.fstype != FSTYPE:
            continue
        mp = entry.mountpoint
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) > len(best)
        ):
            best = mp
    if best is None:
        return None
    return best, os.path.relpath(path, best).replace(os.sep, "/").removeprefix(".")


def resolve_targets(
    items: list[str], url_source: Callable[[str], SourceConfig], url_cache: CacheConfig
) -> list[Target]:
    """Group what to warm by source: URLs with the given settings, paths with their mount's."""
    targets: dict[str, Target] = {}
    for item in items:
        if "://" in item:
            target = targets.setdefault(f"url:{item}", Target(url_source(item), url_cache))
            target.paths.append("")
            continue
        path = os.path.abspath(item)
        found = _mount_of(path)
        if found is None:
            raise UsageError(f"{item} is not inside a pffs mount (or give a source URL)")
        mountpoint, inside = found
        config = registered_config(mountpoint)
        if config is None:  # a bind mount of a mount served elsewhere (Fluid, CSI pods)
            if not os.path.exists(path):
                raise UsageError(f"{item}: no such file or directory")
            targets.setdefault(f"through:{mountpoint}", Target(None, url_cache)).paths.append(path)
            continue
        found_any = False
        for entry, path_in_source in _entries_holding(config.table, inside):
            if entry.cache != "disk":
                continue  # a memory-only entry has nothing to fill
            key = f"mount:{mountpoint}:{entry.path}"
            target = targets.setdefault(key, Target(entry.source, config.cache, group=config.group))
            target.paths.append(path_in_source)
            found_any = True
        if not found_any:
            raise UsageError(f"{item}: no disk-cached source of the mount holds it")
    return list(targets.values())


def _entries_holding(table: Sequence[TableEntry], inside: str) -> Iterator[tuple[TableEntry, str]]:
    """The mount table entries with data at or below tree path `inside`, and where in each."""
    owner = longest_prefix(table, inside)
    if owner is not None:
        yield owner, relative(inside, owner.path)
    for entry in table:
        if entry is not owner and is_under(entry.path, inside):
            yield entry, ""


async def _collect(
    backend: Backend, limiter: trio.CapacityLimiter, path: str, out: list[tuple[str, ObjectInfo]]
) -> None:
    """Every file under `path` (or `path` itself), depth first."""
    info = await run_blocking(limiter, backend.stat, path)
    if not info.is_dir:
        out.append((path, info))
        return
    entries = await run_blocking(limiter, lambda: list(backend.list(path)))
    for entry in entries:
        child = join(path, entry.name)
        if entry.is_dir:
            await _collect(backend, limiter, child, out)
        else:
            out.append((child, entry))


async def warm(target: Target, jobs: int, progress: Progress, show: bool) -> None:
    """Fill the disk tier with the target's files through the preload engine (the one way
    pffs fills its cache), `jobs` files at a time at most."""
    if target.source is None:
        await warm_through(target.paths, jobs, lambda *done: _read_through(progress, *done))
        return
    backend = open_backend(target.source)
    limiter = trio.CapacityLimiter(backend.max_concurrency)
    await run_blocking(limiter, backend.check)
    cache = open_cache(target.cache)
    files: list[tuple[str, ObjectInfo]] = []
    for path in target.paths:
        await _collect(backend, limiter, path, files)
    progress.files_total += len(files)
    progress.bytes_total += sum(info.size for _, info in files)
    progress.files_done += sum(1 for _, info in files if info.size == 0)
    if not cache.disk_holds(backend.source_id):
        raise UsageError(f"{target.source.url} is cached in memory only")
    if target.group is not None:  # each owner loads its own blocks, once for the group
        from pffs.mounting.grouping import asking_group

        peers = await asking_group(target.group)
    engine = Preloader(
        cache, cache.ahead_budget, concurrency=jobs, max_concurrency=jobs, idle_after=math.inf
    )
    # Loads ahead, `jobs` at once at most, halved when the store pushes back (pffs.pace).
    store = Store(backend, limiter, Pace(jobs))
    block_size = cache.block_size
    skips_before = cache.stats.disk_write_skips

    async def items() -> AsyncIterator[PreloadItem]:
        for path, info in files:
            if info.size > 0:
                yield file_item(store, path, info, block_size)

    def done(item: PreloadItem, outcome: int | Exception) -> None:
        progress.files_done += 1
        progress.bytes_done += item.size
        if isinstance(outcome, Exception):
            progress.failures.append(f"{item.keys[0].path}: {outcome}")
            return
        progress.bytes_fetched += outcome
        progress.bytes_cached += item.size - outcome

    async def report() -> None:
        while True:
            sys.stderr.write("\r" + progress.line())
            sys.stderr.flush()
            await trio.sleep(0.5)

    try:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            engine.attach(nursery)
            if show:
                nursery.start_soon(report)
            engine.add("warmup", items(), report=done, for_readers=False)
            await engine.wait_idle()
            await cache.flush()  # every block written before the cache is closed
            nursery.cancel_scope.cancel()
    finally:
        progress.blocks_skipped += cache.stats.disk_write_skips - skips_before
        cache.close()
        if target.group is not None:
            group.join(None)
            peers.close()
        if show:
            sys.stderr.write("\r" + progress.line() + "\n")


def _read_through(progress: Progress, path: str, count: int, error: OSError | None) -> None:
    progress.files_total += 1
    progress.files_done += 1
    progress.bytes_total += count
    progress.bytes_done += count
    progress.bytes_read_through += count
    if error is not None:
        progress.failures.append(f"{path}: {error.strerror}")


def run_warmup(targets: list[Target], jobs: int, quiet: bool) -> int:
    """Warm every target; print the summary; non-zero when any file failed."""
    for target in targets:
        if target.source is not None and target.cache.disk_dir is None:
            raise UsageError(f"{target.source.url}: the disk cache is disabled, nothing to fill")
    progress = Progress()
    show = not quiet and sys.stderr.isatty()

    async def main() -> None:
        for target in targets:
            await warm(target, jobs, progress, show)

    trio.run(main)
    print(progress.summary())
    return 1 if progress.failures else 0


def cache_admin(cache_dir: str, action: str, source: str | None = None) -> int:
    """`pffs cache info|clear`: show the disk tier's usage per source, or empty it (and remove
    the files a crashed writer left that no entry names)."""
    directory = os.path.abspath(cache_dir)
    if not os.path.isdir(directory):
        print(f"no cache at {directory}")
        return 0
    tier = DiskTier(directory, capacity=1 << 62, free_ratio=0.0, compress=False)
    try:
        if action == "clear":
            removed = tier.clear(source)
            what = f"{source}'s blocks" if source else "blocks"
            print(f"removed {removed} {what} from {directory}")
            orphans = tier.sweep()  # files a crashed writer left unindexed (pffs.cache.orphans)
            if orphans.files:
                print(f"removed {orphans.files} orphaned files ({_size(orphans.bytes)})")
            return 0
        usage = list(tier.usage_by_source())
        blocks = sum(u.blocks for u in usage)
        print(f"cache {directory}: {_size(tier.volume())} on disk, {blocks} blocks")
        for u in usage:
            print(f"  {u.source}: {u.blocks} blocks, {_size(u.bytes)}")
        return 0
    finally:
        tier.close()

"""`pffs warmup`: what to warm, resolved from paths and URLs, and its progress printed.

Warmup fills the disk cache with the very block keys a mount uses, so a mount over the same
cache directory finds the blocks. For a path inside a live pffs mount the mount's own
configuration (source, block size, cache directory) is used; for a source URL, the cache options
on the command line. The loading itself runs in pffs.mounting.warmup, through the parts a mount
uses. Blocks already on disk are skipped, so a second run costs one database lookup per block. A
path in a mount that left no record here (a bind mount in a Fluid or CSI pod, a mount given keys
of its own) is read through the mount instead (pffs.cli.warmthrough). On a member of a cache
group (pffs.group), the blocks other members own are asked of them: each owner loads its own
from the store once, so one warmup fills the whole group in parallel.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import trio

from pffs.cli.progress import Progress
from pffs.cli.warmthrough import warm_through
from pffs.config import CacheConfig, GroupConfig, SourceConfig, TableEntry
from pffs.errors import UsageError
from pffs.mounting.kernel import FSTYPE, mount_table
from pffs.mounting.registry import registered_config
from pffs.mounting.warmup import WarmupTally, warm_source
from pffs.routing.table import is_under, longest_prefix, relative


@dataclass
class Target:
    """What to warm: a source and paths inside it, or (source None) paths inside a mount whose
    record this process cannot see, read through the mount (pffs.cli.warmthrough)."""

    source: SourceConfig | None
    cache: CacheConfig
    paths: list[str] = field(default_factory=list)
    # The cache group of the mount (pffs.group): its blocks' owners are asked, not the store.
    group: GroupConfig | None = None


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


def _read_through(tally: WarmupTally, path: str, count: int, error: OSError | None) -> None:
    tally.files_total += 1
    tally.files_done += 1
    tally.bytes_total += count
    tally.bytes_done += count
    tally.bytes_read_through += count
    if error is not None:
        tally.failures.append(f"{path}: {error.strerror}")


def run_warmup(targets: list[Target], jobs: int, quiet: bool) -> int:
    """Warm every target; print the summary; non-zero when any file failed."""
    for target in targets:
        if target.source is not None and target.cache.disk_dir is None:
            raise UsageError(f"{target.source.url}: the disk cache is disabled, nothing to fill")
    progress = Progress()
    tally = progress.tally
    show = not quiet and sys.stderr.isatty()

    async def warm_all() -> None:
        for target in targets:
            if target.source is None:
                await warm_through(target.paths, jobs, partial(_read_through, tally))
            else:
                await warm_source(
                    target.source, target.cache, target.paths, jobs, tally, target.group
                )

    async def main() -> None:
        failed: Exception | None = None
        async with trio.open_nursery() as nursery:
            if show:
                nursery.start_soon(progress.draw)
            try:
                await warm_all()
            except Exception as exc:  # raised below as it is (one line), not in a group
                failed = exc
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed

    try:
        trio.run(main)
    finally:
        if show:
            progress.draw_once(end="\n")
    print(progress.summary())
    return 1 if tally.failures else 0

"""The mount table: which source serves which part of the tree.

A tree path is routed to the entry with the longest matching path prefix (so `/data` may be one
bucket and `/data/logs` an HDFS directory). Directories that lead to an entry but belong to no
source (`/` and `/data` when the only entry is `/data/imagenet`) are synthesised; a mount point
hides whatever its parent source holds under the same name, as a mount does.

Paths here are tree paths in the VFS's form: '/'-separated, no leading or trailing slash, ""
for the root.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pffs.backends.base import Backend
from pffs.flow.permits import SourceFlow
from pffs.routing import health
from pffs.workers import run_blocking


class HasPath(Protocol):
    @property
    def path(self) -> str: ...


E = TypeVar("E", bound=HasPath)


def is_under(path: str, base: str) -> bool:
    """Whether tree path `path` is `base` or inside it."""
    return not base or path == base or path.startswith(base + "/")


def relative(path: str, base: str) -> str:
    """`path` relative to `base` (which it must be under)."""
    return path[len(base) :].lstrip("/") if base else path


def longest_prefix(entries: Iterable[E], path: str) -> E | None:
    """The entry whose path is the longest prefix of `path`, or None."""
    best: E | None = None
    for entry in entries:
        if is_under(path, entry.path) and (best is None or len(entry.path) > len(best.path)):
            best = entry
    return best


@dataclass(eq=False)
class Mounted:
    """A live source in the tree: its backend, its flow of requests and its per-entry policies."""

    path: str
    backend: Backend
    read_only: bool = False
    # False for `cache = "memory"`: the block cache never writes this source's blocks to disk.
    disk_cache: bool = True

    def __post_init__(self) -> None:
        # One flow per source (docs/ARCHITECTURE.md): its request permits, a reader's and
        # loading ahead's (pffs.flow.permits); a slow store cannot starve the others' threads.
        self.flow = SourceFlow(self.backend.max_concurrency)
        # Its breaker: every request to the source passes it (pffs.store.fetching.Store).
        self.health = health.SourceHealth(self.backend.source_id, self._probe)

    async def _probe(self) -> None:
        """Whether the store answers again: its probe (short timeouts, a fresh connection)."""
        await run_blocking(self.flow.permit("probe"), self.backend.probe)


class MountTable:
    """Routing from tree paths to mounted sources."""

    def __init__(self, mounted: Sequence[Mounted]) -> None:
        paths = [m.path for m in mounted]
        if len(set(paths)) != len(paths):
            raise ValueError(f"duplicate paths in the mount table: {paths}")
        self.mounted = list(mounted)

    @classmethod
    def single(cls, backend: Backend, read_only: bool = False) -> MountTable:
        """One source at the root: what `pffs mount SOURCE MOUNTPOINT` builds."""
        return cls([Mounted("", backend, read_only)])

    @property
    def memory_only(self) -> frozenset[str]:
        """The sources whose blocks the cache keeps in memory only (`cache = "memory"`)."""
        return frozenset(m.backend.source_id for m in self.mounted if not m.disk_cache)

    def route(self, path: str) -> tuple[Mounted, str] | None:
        """The source serving `path` and the path inside that source, or None."""
        mounted = longest_prefix(self.mounted, path)
        return None if mounted is None else (mounted, relative(path, mounted.path))

    def mount_points_below(self, path: str) -> list[str]:
        """Names in directory `path` that lead to a mount point deeper in the tree."""
        names: list[str] = []
        for mounted in self.mounted:
            if mounted.path != path and is_under(mounted.path, path):
                name = relative(mounted.path, path).split("/", 1)[0]
                if name not in names:
                    names.append(name)
        return sorted(names)

    def leads_to_mount(self, path: str) -> bool:
        """Whether `path` is a mount point or a directory above one (it always exists)."""
        return any(is_under(m.path, path) for m in self.mounted)

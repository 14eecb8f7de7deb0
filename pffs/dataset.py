"""Handing a job's read order to a pffs mount, for data loaders that know it (no torch needed).

`prefetch_order(mountpoint, paths)` writes the paths (relative to the mount root, or absolute
under the mountpoint) to the mount's `.pffs/prefetch` control file; pffs then loads the files
in that order, ahead of the readers (pffs.fs.datasets). It returns the bad entries, one line
each; the others proceed.

`PrefetchOrder` wraps a sampler (any iterable of dataset indices, such as a PyTorch Sampler):
each time it is iterated, one epoch, it hands the paths of its indices over in the sampler's
order, then yields the indices. Give it to a DataLoader as its sampler:

    sampler = PrefetchOrder(RandomSampler(ds), lambda i: ds.files[i], "/mnt/data")
    loader = DataLoader(ds, sampler=sampler, num_workers=8)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized

log = logging.getLogger(__name__)

# The control file pffs.fs.special serves at the root of every mount.
CONTROL_FILE = os.path.join(".pffs", "prefetch")


class NotAMount(ValueError):
    """The directory given is not the root of a pffs mount."""


def prefetch_order(mountpoint: str, paths: Iterable[str]) -> list[str]:
    """Hand `paths` to the pffs mount at `mountpoint`, to load in that order; the bad entries.

    Raises NotAMount when `mountpoint` has no `.pffs/prefetch` control file.
    """
    root = os.path.abspath(mountpoint)
    control = os.path.join(root, CONTROL_FILE)
    if not os.path.isfile(control):
        raise NotAMount(f"{mountpoint} is not the root of a pffs mount (no {CONTROL_FILE})")
    lines = [_inside(root, path) for path in paths]
    with open(control, "w", encoding="utf-8") as handed:
        handed.write("".join(f"{line}\n" for line in lines if line))
        # fsync hands the list over before close returns, also where a read-only mount has
        # the kernel's FLUSH turned off (a RELEASE is not waited for).
        handed.flush()
        os.fsync(handed.fileno())
    with open(control, encoding="utf-8") as report:
        # "queued N", then one line per bad entry.
        return report.read().splitlines()[1:]


def _inside(root: str, path: str) -> str:
    path = path.strip()
    if os.path.isabs(path) and (path == root or path.startswith(root + os.sep)):
        return os.path.relpath(path, root)
    return path.lstrip("/")


class PrefetchOrder:
    """Yields a sampler's indices, having handed their files' paths to pffs, once per epoch."""

    def __init__(
        self, sampler: Iterable[int], path_of: Callable[[int], str], mountpoint: str
    ) -> None:
        self.sampler = sampler
        self.path_of = path_of
        self.mountpoint = mountpoint
        self.bad: list[str] = []  # the bad entries of the last epoch's list

    def __iter__(self) -> Iterator[int]:
        order: Sequence[int] = list(self.sampler)
        try:
            self.bad = prefetch_order(self.mountpoint, (self.path_of(i) for i in order))
        except OSError as exc:  # a hint lost, never an epoch: a read-only bind refuses the list
            log.warning("pffs prefetch: the order was not handed over: %s", exc)
            self.bad = []
        for line in self.bad[:10]:
            log.warning("pffs prefetch: %s", line)
        return iter(order)

    def __len__(self) -> int:
        if not isinstance(self.sampler, Sized):
            raise TypeError("the wrapped sampler has no length")
        return len(self.sampler)

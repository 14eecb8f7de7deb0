"""Room in the cache for the datasets being consumed: a stable subset of one that does not fit.

Under shuffled epochs, a cache that admits every block and evicts the oldest (or the least
recently used) cycles through a dataset larger than itself: each block admitted pushes out one
the next epoch is about to read, and epoch 2 of a dataset twice the cache finds about a fifth
of it cached (docs/notes/dataset-larger-than-cache.md). Keeping one subset for good finds the whole
subset: about the cache's share of the dataset.

The rule, for each dataset preload (pffs.fs.datasets) watches, by its source, the principal
reading it (the key's) and the path prefix of its files in that source:
- Its room is a share of the disk tier (the tier that keeps what epochs reread; the memory
  tier stays LRU): `KEEP_SHARE` of the tier's bound, shared max-min fairly by the datasets
  watched at once (a small one gets all it needs, the large ones split the rest).
- A dataset whose size (its listing's, as far as it is listed) is at most its room *fits*:
  every block is admitted as before this rule existed.
- One that does not fit keeps a subset of its files: a file is in it when a hash of its name
  (`subset_point`, in [0, 1)) falls below a threshold, placed where the files below it take
  the room (counted in bins of the hash as the listing is read, so the subset fills its room
  to a bin's worth, however few the files). Blocks of files outside it are served
  from the store and kept in memory, never written to disk, so they never push out the subset
  (CoorDL's rule: new blocks of the dataset do not replace other blocks of it). Blocks of
  other data are admitted as usual and evict the oldest, whatever they are.
- The subset is chosen by name, not by arrival: it is the same in every epoch, after a
  remount, and in every process sharing the directory, with nothing remembered per file. A
  larger room (the dataset shrank, another ended) gives a superset.
- The preload engine loads only files the subset keeps (`keeps`): loading any other would
  fetch bytes the cache drops before the epoch reaches them.

`KEEP_SHARE` leaves room for the index's own pages, for the hash subset being a little
larger than its mean, and for other data. A dataset no reader opened for `idle_after`
seconds is forgotten (its room goes to the others) at the next block of it.

Touched from trio tasks only, like the rest of the cache's state; the metrics read the
figures of `describe` from their own thread (plain numbers, read whole under the GIL).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import trio

from pffs.cache.keys import BlockKey

# The share of the disk tier's bound the datasets being consumed may keep between them.
KEEP_SHARE = 0.95
# Bins of subset_point a dataset's bytes are counted in: the subset's bytes miss its room by at
# most one bin (a 1/4096 of the dataset), whatever the spread of the hash over few files.
BINS = 4096


def subset_point(source: str, path: str) -> float:
    """Where a file falls in [0, 1): the same for the same source and path everywhere."""
    digest = hashlib.blake2b(f"{source}\0{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class WatchedDataset:
    """A dataset being consumed: its files are `prefix`* in `source`, read as `principal`."""

    name: str  # its directory in the tree, for the stats
    source: str
    principal: str
    prefix: str  # "" (the whole source) or a path ending in "/"
    seen: float  # trio time a reader last opened one of its files
    size: int = 0  # bytes of its files counted so far
    files: int = 0
    listed: bool = False  # its counting ended (size is the whole size, unless listing failed)
    cached: int = 0  # bytes of it the disk tier holds: found at detection, plus admitted since
    room: int = 0  # the bytes of the cache it may keep (set by DatasetRoom)
    # The files whose subset_point is below it are kept (1.0: all of them; set with `room`).
    threshold: float = 1.0
    # Bytes of its files by subset_point, in BINS equal bins: where the subset ends.
    bins: list[int] = field(default_factory=lambda: [0] * BINS)

    @property
    def fits(self) -> bool:
        return self.size <= self.room

    def count(self, path: str, size: int) -> None:
        """One more file of it, `size` bytes, at `path` in its source."""
        self.size += size
        self.files += 1
        self.bins[int(subset_point(self.source, path) * BINS)] += size

    def holds(self, key: BlockKey) -> bool:
        return (
            key.source == self.source
            and key.principal == self.principal
            and key.path.startswith(self.prefix)
        )

    def place_threshold(self) -> None:
        """Set `threshold` so the files below it take at most `room` bytes (all when it fits)."""
        if self.fits:
            self.threshold = 1.0
            return
        total = 0
        for position, size in enumerate(self.bins):
            total += size
            if total > self.room:
                self.threshold = position / BINS
                return


class DatasetRoom:
    """Admission to the disk tier for datasets being consumed (see the module docstring)."""

    def __init__(self, capacity: int, idle_after: float = 30.0) -> None:
        self.capacity = capacity  # the disk tier's bound; 0: no disk tier, no rule
        self.idle_after = idle_after
        self._datasets: dict[str, WatchedDataset] = {}

    def watch(self, name: str, source: str, principal: str, prefix: str) -> WatchedDataset:
        """Start watching a dataset (again: its figures start over). Datasets inside it are
        dropped: their files are its files now."""
        for inside in list(self._datasets.values()):
            same_reader = (inside.source, inside.principal) == (source, principal)
            if same_reader and inside.prefix.startswith(prefix):
                del self._datasets[inside.name]
        watched = WatchedDataset(name, source, principal, prefix, trio.current_time())
        self._datasets[name] = watched
        self._share()
        return watched

    def touch(self, name: str) -> None:
        """A reader opened a file of dataset `name`."""
        watched = self._datasets.get(name)
        if watched is not None:
            watched.seen = trio.current_time()

    def listed(self, watched: WatchedDataset, complete: bool) -> None:
        """The files counted so far (`WatchedDataset.count`) are to be taken into account;
        with `complete`, they are all of them."""
        watched.listed = complete
        self._share()

    def keeps(self, key: BlockKey) -> bool:
        """Whether the block's file belongs in the cache: outside every dataset watched, in
        one that fits, or in the subset of one that does not."""
        watched = self._dataset_of(key) if self._datasets else None
        return watched is None or _kept(watched, key)

    def admit(self, key: BlockKey, size: int) -> bool:
        """Whether a block fetched from the store may be written to the disk tier (`keeps`);
        an admitted block of a watched dataset counts as cached."""
        watched = self._dataset_of(key) if self._datasets else None
        if watched is None:
            return True
        if not _kept(watched, key):
            return False
        watched.cached += size  # at most its size when shown (a block may come twice)
        return True

    def describe(self) -> list[dict[str, float | int | str | bool]]:
        """Each dataset watched: its size, files, cached bytes and share, room, whether it
        fits and whether its listing is complete (for the metrics and `pffs stats`)."""
        described: list[dict[str, float | int | str | bool]] = []
        for watched in list(self._datasets.values()):
            # An estimate: a block evicted and admitted again counts twice; never more than
            # the dataset or the tier.
            cached = min(watched.cached, watched.size, self.capacity)
            described.append({
                "dataset": watched.name,
                "size": watched.size,
                "files": watched.files,
                "listed": watched.listed,
                "cached": cached,
                "cached_share": cached / watched.size if watched.size else 0.0,
                "room": watched.room,
                "fits": watched.fits,
                "threshold": watched.threshold,
            })  # fmt: skip
        return described

    def _dataset_of(self, key: BlockKey) -> WatchedDataset | None:
        for watched in self._datasets.values():
            if watched.holds(key):
                if trio.current_time() - watched.seen > self.idle_after:
                    del self._datasets[watched.name]  # its readers went away
                    self._share()
                    return None
                return watched
        return None

    def _share(self) -> None:
        """Max-min fair rooms: smallest first, each gets its size or an equal part of what
        is left, whichever is less; the largest split the remainder."""
        left = int(KEEP_SHARE * self.capacity)
        ordered = sorted(self._datasets.values(), key=lambda watched: watched.size)
        for position, watched in enumerate(ordered):
            watched.room = left // (len(ordered) - position)
            left -= min(watched.size, watched.room)
            watched.place_threshold()


def _kept(watched: WatchedDataset, key: BlockKey) -> bool:
    return watched.fits or subset_point(key.source, key.path) < watched.threshold

"""A mount's byte budget: the bytes held or loading ahead of its readers, and how it is shared.

Bytes loaded ahead sit in memory before any reader asks for them, so one budget per mount
(`AheadBudget`, on its BlockCache) bounds them, and every kind of load ahead draws from it:

- `readahead`: the blocks of readers' windows, a small file's block at its open, the rest of a
  block behind a cold start (pffs.cache.readahead_engine). A window's blocks start only while
  they fit; the others are skipped (a reader fetches them itself).
- `preload`: the blocks of files preload and warmup load (pffs.cache.preload). A file starts
  only while its bytes fit beside readahead's (`fits`), and preload's files in flight hold at
  most `preload_max` (half the budget: readahead keeps the other half); its blocks are then
  counted as they are claimed (`add`), since a started file is loaded whole.
- `region`: the spans streamed for a tensor's region run (pffs.fs.regions), at most
  `region_per_file` per open file. They are counted here but bounded against the budget on
  their own, as before this budget was one (regions had a bound of their own of the same size):
  readahead and preload filling the budget must not starve a tensor's spans, which would fall
  back to whole blocks. Making them share readahead's bytes is a retuning to measure first.

The same figures size what the budget is carved from and into: at most half the memory bound
is reserved for it (the memory tier keeps the rest), one reader's window is at most half the
memory tier (a larger one would evict blocks loaded ahead before their reader gets to them)
and never above the budget (it could never be in flight); and preload's files loaded but not yet
read stay under half of what the cache can keep (`unread_max`), so loading ahead never pushes
out what it loaded before readers get to it. Blocks fetched and waiting for the disk tier's
write-behind hold at most two budgets (`write_room`): a budget's burst of GETs lands while the
writers still write the burst before it, where with one budget's room the next loads ahead
waited for the disk with nothing in flight, the disk's write pace being bursty on a busy
machine (docs/notes/clients-full-load-waits.md). How the budget is shared among readers' windows
(Little's law) is pffs.cache.window's; which requests reach the store is pffs.flow.permits'.
The measurements behind the numbers: docs/notes/flow-control.md.
"""

from __future__ import annotations

from typing import Literal

from pffs.config import CacheConfig

# The memory bound's share the budget may reserve for blocks in flight (the rest is the
# memory tier's).
MEMORY_SHARE = 0.5
# The memory tier's share one reader's window may be at most.
WINDOW_SHARE_OF_MEMORY = 0.5
# The budget's share preload's files in flight may hold at most (readahead keeps the rest).
PRELOAD_SHARE = 0.5
# What the cache can keep (the disk tier's bound, else the memory tier), the share preload's
# files loaded and not yet read may hold at most.
UNREAD_SHARE = 0.5
# Budgets of bytes the blocks waiting for the disk tier's write-behind may hold at most.
WRITE_ROOM_BUDGETS = 2
# Blocks' bytes of spans one open file's region runs may hold or have coming at most.
REGION_BLOCKS_PER_FILE = 4

Kind = Literal["readahead", "preload", "region"]
KINDS: tuple[Kind, ...] = ("readahead", "preload", "region")


class AheadBudget:
    """A mount's bytes held or loading ahead of its readers (trio side only)."""

    def __init__(self, config: CacheConfig) -> None:
        self.total = min(config.ahead_budget, int(config.memory_bytes * MEMORY_SHARE))
        self.memory_tier = config.memory_bytes - self.total  # what the memory tier may hold
        # The largest window a reader may get (pffs.cache.window asks for more on a far store).
        self.largest_window = min(int(self.memory_tier * WINDOW_SHARE_OF_MEMORY), self.total)
        self.region_per_file = REGION_BLOCKS_PER_FILE * config.block_size
        # Bytes of fetched blocks that may wait for the disk tier's writers (pffs.cache.diskio).
        self.write_room = WRITE_ROOM_BUDGETS * self.total
        keeps = config.disk_bytes if config.disk_dir else self.memory_tier
        self.unread_max = int(keeps * UNREAD_SHARE)
        self.held: dict[Kind, int] = dict.fromkeys(KINDS, 0)

    def window_max(self, readahead_max: int) -> int:
        """One reader's window at most, for a configured `readahead_max`."""
        return min(readahead_max, self.largest_window)

    def preload_max(self, configured: int) -> int:
        """Bytes of preload's files in flight at most, for a configured preload budget."""
        return min(configured, int(self.total * PRELOAD_SHARE))

    @property
    def loading(self) -> int:
        """Bytes of blocks loaded ahead (readahead and preload), asked for and not yet landed
        or given up."""
        return self.held["readahead"] + self.held["preload"]

    def fits(self, kind: Kind, size: int) -> bool:
        """Whether `size` more bytes of `kind` fit now."""
        if kind == "region":
            return self.held["region"] + size <= self.total
        return self.loading + size <= self.total

    def take(self, kind: Kind, size: int) -> bool:
        """Count `size` bytes of `kind` if they fit (True), else nothing (False)."""
        if not self.fits(kind, size):
            return False
        self.held[kind] += size
        return True

    def add(self, kind: Kind, size: int) -> None:
        """Count `size` bytes of `kind` unchecked: a preload file's blocks, checked with
        `fits` when the file started."""
        self.held[kind] += size

    def give_back(self, kind: Kind, size: int) -> None:
        """`size` bytes of `kind` landed, were read or were given up."""
        self.held[kind] -= size

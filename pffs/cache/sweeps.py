"""A file swept into the cache: loaded whole in the background while its reader faults at
random over it or walks it in hops (`Readahead.sweeping`), continued by the cache itself as its
blocks land, not only when a READ comes.

The reader's policy (pffs.cache.readahead) decides whether a file is swept and in which order
(`Readahead.sweep`: from where a walk reached to the end, then what lies before). This module
does the loading: the blocks of that order neither held nor coming, as many as the mount's
budget of bytes ahead lets start (pffs.flow.budget), through `BlockCache.read_ahead`, so they
are flights readers join, land in memory and are written behind to disk like any readahead.
Each landing gives its budget back and asks for the next, so the store stays busy while the
reader waits on one block (a walk's hop, a gather's fault) and no READ comes to ask for more.

Only a file the cache keeps unread beside what else it holds is swept (`unread_max`, as a
preload's files): a larger file's faults stay in their neighbourhoods instead of loading it
over and over. The sweep ends with its reader's close (the order is then empty): a block that
lands after asks for no more.
"""

from __future__ import annotations

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockSource, ObjectBlocks
from pffs.cache.readahead import Readahead


class FileSweep:
    """The sweep of one open file (see the module doc); `advance` starts what fits now."""

    def __init__(
        self,
        cache: BlockCache,
        blocks: ObjectBlocks,
        readahead: Readahead,
        source: BlockSource,
        *,
        coalesce: bool,
    ) -> None:
        self._cache = cache
        self._blocks = blocks
        self._readahead = readahead
        self._source = source
        self._coalesce = coalesce  # the store serves runs of blocks in one request
        # The order's first blocks found held or coming: not looked at again (a block evicted
        # since is its reader's to fetch).
        self._passed = 0
        # Blocks asked and not landed yet: while some are, the next start a run at a time.
        self._coming = 0

    def advance(self) -> None:
        """Start the order's next blocks neither held nor coming, as the budget allows: at
        each READ of a swept file, and again as each of its blocks lands."""
        cache, blocks, readahead = self._cache, self._blocks, self._readahead
        if blocks.size > cache.ahead.unread_max:
            return
        passed = 0
        for load in readahead.sweep(self._passed):
            held = next(
                (n for n, i in enumerate(load) if not cache.is_cached_or_coming(blocks.key(i))),
                len(load),
            )
            passed += held
            if held < len(load):
                break
        self._passed += passed
        order = readahead.sweep(self._passed)
        # While its blocks are on their way, a run's worth at a time (or the rest, when less
        # is left): a landing frees one block of the budget, and asking for it alone makes a
        # GET per block; the landings coming free the rest of a run soon, and fewer, larger
        # GETs cost the store and the mount less per byte. None on their way: what fits.
        left = sum(len(load) for load in order)
        run = min(cache.run_blocks, left) * blocks.block_size
        if self._coming > 0 and not cache.ahead.fits("readahead", run):
            return
        room = max(1, cache.ahead.total // blocks.block_size)  # what could start at most
        for load in order:  # in order: the rest starts once the budget frees
            load = load[:room]
            room -= len(load)
            self._coming += cache.read_ahead(
                blocks.keys(load),
                blocks.lengths(load),
                self._source,
                coalesce=self._coalesce,
                window=readahead.reader_window,
                landed=self._landed,
            )
            if room <= 0:
                break

    def _landed(self) -> None:
        self._coming -= 1
        self.advance()

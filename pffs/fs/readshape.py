"""How one open file of a dataset is read, as far as the dataset preload (pffs.fs.datasets)
needs to know: read through, or by ranges.

Loading a dataset's other files whole pays when its readers read files whole: an epoch of small
files, a tar shard streamed front to back, a scan of Parquet files. It fetches ten times what is
read when they read a few ranges of each (a column projection of Parquet files reads a tenth of
each: docs/notes/clients-parquet.md). A file is read through once a run from its start has read
THROUGH_BLOCKS blocks, or to its end; it was read by ranges when, at its close, it was neither,
it had reads in its middle that were no run (a footer's read, which ends the file, is not one)
and they read less than half of it.

Pure bookkeeping on the readahead's view of each read (pffs.cache.readahead), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from pffs.cache.readahead import Readahead

# A run from a file's start this long (in blocks) shows a reader that reads files through.
THROUGH_BLOCKS = 2


class ReadShape:
    """The reads of one open file, for its dataset's preload."""

    __slots__ = ("_enough", "_on_through", "_run_bytes", "_size", "bytes_read", "ranged", "through")

    def __init__(self, size: int, block_size: int, on_through: Callable[[], None]) -> None:
        self._size = size
        self._enough = min(size, THROUGH_BLOCKS * block_size)  # run bytes that show through
        self._on_through = on_through  # told once, when the file shows it is read through
        self.bytes_read = 0
        self._run_bytes = 0  # read by runs from the file's start
        self.ranged = False  # a read in its middle that was no run
        self.through = False

    def read(self, offset: int, end: int, readahead: Readahead) -> None:
        """A read of [offset, end), after the readahead has placed it."""
        self.bytes_read += end - offset
        if readahead.sequential and not readahead.region:
            self._run_bytes += end - offset
            if self._run_bytes >= self._enough and not self.through:
                self.through = True
                self._on_through()
        elif offset > 0 and end < self._size:
            self.ranged = True

    @property
    def by_ranges(self) -> bool:
        """Whether the file, now closed, was read by ranges (see the module's docstring)."""
        return not self.through and self.ranged and 2 * self.bytes_read < self._size

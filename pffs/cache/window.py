"""Readahead windows of sequential readers: how far ahead of each one to load, and in how many
requests. (Not to be confused with a source's pace, pffs.flow.permits: how many requests
loading ahead may have in flight at that source.)

A reader streaming a large object is served by several ranged GETs at once, each on its own
connection (each GET is one worker thread's call, on a connection of the source's pool), as
mountpoint-s3's and s3fs's parallel downloads do: one stream's pace (one TCP connection, one
server thread) is not the store's. How many bytes to keep ahead follows Little's law, bytes in
flight = rate x the time a request takes, measured per reader:

- its read rate: the bytes it consumed per second, a moving average over periods of its reads;
- its requests' time: how long its readahead GETs took from the ask to the last byte, a moving
  average (the store's latency, plus one part's transfer at one connection's pace).

Its window is the configured one (`--readahead-max`), or HEADROOM x rate x time when that is
more: a far store (a large rate x latency product) gets the bytes in flight it needs, a near
one keeps the window measured best on a small machine (a wider one only adds work contending
for its cores). A reader of a long file (one of at least the largest window) starts at the
largest window instead: the configured one suits files read whole in a few windows, often
several at once sharing the budget (a Parquet scan's, tar shards); a long file's reader (a
checkpoint loaded whole) would otherwise wait through the growth from the configured window,
its rate measured while it starves (docs/notes/clients-full-load-window.md).

While the store does not keep up, the reader consumes blocks as fast as they come, so each new
estimate makes the window HEADROOM times larger, until the reader itself sets the pace (the
window then stays at what its rate needs) or the window meets its ceiling: the largest window
(`largest`: what the memory tier and the budget can hold) and the reader's share.
The window is carried by parts of whole blocks, each of the largest readahead request when the
window holds STREAMS of those, so a window grown for a far store is several GETs at once; a
near store's window keeps the few large requests measured cheapest in CPU per byte.

Fairness: the global budget of bytes loaded ahead is shared by the readers that streamed in the
last ACTIVE_SECONDS: each one's window is at most the budget over those readers, so a reader
starting while others stream gets its share at once rather than the budget's leftovers, and
none takes the whole budget while others wait for theirs.

Pure bookkeeping with an injected clock, no I/O; trio tasks only (the cache's threading rule).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The window over rate x request time: room for the rate to double before the next estimate.
HEADROOM = 2.0
# GETs that carry one reader's window at least: a part is half the window at most. More, smaller
# parts cost CPU per byte (each GET signs, parses and hops; the server opens and seeks); the
# measurements are in docs/notes/parallel-reads.md.
STREAMS = 2
# A reader that asked for no window for this long no longer takes a share of the budget.
ACTIVE_SECONDS = 1.0
# A rate sample spans at least this long (one 1 MiB read takes a millisecond or two).
RATE_PERIOD = 0.05
# Weight of the newest sample in the moving averages.
SMOOTHING = 0.3


def _average(old: float | None, sample: float) -> float:
    return sample if old is None else old + SMOOTHING * (sample - old)


class Windows:
    """The readers streaming from one cache and the budget they share."""

    def __init__(
        self,
        budget: int,
        readahead_max: int,
        largest: int,
        block_size: int,
        max_part: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget  # bytes loaded ahead in flight, all readers together
        self.readahead_max = readahead_max  # the configured window of one reader, in bytes
        self.largest = max(readahead_max, largest)  # the largest window Little's law may ask for
        self.block_size = block_size
        self.max_part = max(block_size, max_part)  # the largest GET of a load ahead, in bytes
        self.clock = clock
        self._last_asked: dict[ReaderWindow, float] = {}
        self._swept_at = clock()

    def reader(self, file_size: int = 0) -> ReaderWindow:
        """The window of a new reader (one per open file) of a file of `file_size` bytes."""
        least = self.largest if file_size >= self.largest else self.readahead_max
        return ReaderWindow(self, least)

    def streaming(self) -> int:
        """Readers that asked for a window in the last ACTIVE_SECONDS."""
        return len(self._last_asked)

    def share(self, reader: ReaderWindow) -> int:
        """`reader`'s share of the budget, in bytes; counts it as streaming from now."""
        now = self.clock()
        self._last_asked[reader] = now
        if now - self._swept_at > ACTIVE_SECONDS / 4:  # a sweep per period, not per read
            self._swept_at = now
            for other, asked in list(self._last_asked.items()):
                if now - asked > ACTIVE_SECONDS:
                    del self._last_asked[other]
        return self.budget // len(self._last_asked)

    def forget(self, reader: ReaderWindow) -> None:
        """The reader is closed: its share goes back to the others at once."""
        self._last_asked.pop(reader, None)


class ReaderWindow:
    """One reader's rate and request time, and the window and parts they call for."""

    __slots__ = (
        "_period_bytes",
        "_period_start",
        "_windows",
        "least",
        "part",
        "rate",
        "request_time",
    )

    def __init__(self, windows: Windows, least: int) -> None:
        self._windows = windows
        self.least = least  # the window before Little's law asks for more, in bytes
        self.rate: float | None = None  # bytes per second the reader consumes
        self.request_time: float | None = None  # seconds one of its readahead GETs takes
        self.part = 1  # blocks per request of the last window
        self._period_start: float | None = None
        self._period_bytes = 0

    def read(self, count: int) -> None:
        """The reader consumed `count` bytes of a sequential run."""
        now = self._windows.clock()
        if self._period_start is None:
            self._period_start = now
            return  # the first read of a run starts the clock; its bytes came before it
        self._period_bytes += count
        elapsed = now - self._period_start
        if elapsed >= RATE_PERIOD:
            self.rate = _average(self.rate, self._period_bytes / elapsed)
            self._period_start, self._period_bytes = now, 0

    def paused(self) -> None:
        """The reader left its sequential run (a seek): the time until it resumes is not part
        of its rate."""
        self._period_start = None
        self._period_bytes = 0

    def fetched(self, seconds: float) -> None:
        """One of the reader's readahead GETs took `seconds` from the ask to its last byte."""
        self.request_time = _average(self.request_time, seconds)

    def size(self) -> int:
        """Bytes to keep loaded or on their way ahead of the reader: at least one block. Sets
        `part` for it."""
        windows = self._windows
        wanted = self.least
        if self.rate is not None and self.request_time is not None:
            wanted = max(wanted, int(HEADROOM * self.rate * self.request_time))
        window = max(windows.block_size, min(wanted, windows.largest, windows.share(self)))
        self.part = self.part_blocks(window)
        return window

    def part_blocks(self, window: int) -> int:
        """Blocks per GET for a window of `window` bytes: the largest readahead request, or less
        so that STREAMS GETs carry it; one block at least."""
        windows = self._windows
        return max(1, min(windows.max_part, window // STREAMS) // windows.block_size)

    def close(self) -> None:
        self._windows.forget(self)

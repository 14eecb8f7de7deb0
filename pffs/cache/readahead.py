"""Readahead policy for one open file: detect sequential reads, grow a window, reset on seeks.

Pure bookkeeping with no I/O, so it is tested on its own. The window starts at one block when
a read continues where the previous one ended (or starts the file), doubles each time the reader
moves into a new block, up to a maximum, and drops to nothing on a seek: random access never
reads ahead. With a pace (pffs.cache.pacing), the maximum is the pace's window instead (the
configured one, or more by Little's law, within the reader's share of the budget), and the
reads of a sequential run feed the pace's rate.
"""

from __future__ import annotations

from pffs.cache.pacing import ReaderPace

MIB = 1 << 20
# The kernel may reorder or slightly skip its own readahead requests; mountpoint-s3 tolerates
# 1 MiB backwards, and we tolerate up to two blocks forwards, before calling a read a seek.
BACKWARD_TOLERANCE = 1 * MIB
FORWARD_BLOCKS_TOLERANCE = 2


class Readahead:
    def __init__(
        self,
        block_size: int,
        max_window_bytes: int,
        file_size: int,
        pace: ReaderPace | None = None,
    ) -> None:
        self.block_size = block_size
        self.max_window = max_window_bytes // block_size
        self.last_block = (file_size - 1) // block_size if file_size > 0 else -1
        self.backward = min(BACKWARD_TOLERANCE, block_size)
        self.pace = pace
        self.window = 0
        self.expected = 0  # where a sequential reader reads next
        # Reads in a row that continued the previous one. A file opened and read from offset 0
        # counts as one already; otherwise two are needed, so a random reader whose next read
        # happens to land nearby does not start a readahead.
        self.streak = 1
        self.sequential = False  # whether the last read was part of a sequential run
        self.current_block = -1

    def on_read(self, offset: int, end: int) -> range:
        """Record a read of [offset, end); return the block indices worth loading ahead."""
        near = (
            self.expected - self.backward
            <= offset
            <= self.expected + FORWARD_BLOCKS_TOLERANCE * self.block_size
        )
        self.streak = self.streak + 1 if near else 0
        self.sequential = self.streak >= 2
        self.expected = max(end, self.expected) if near else end
        block = (max(end, 1) - 1) // self.block_size
        if self.streak < 2 or self.max_window == 0:
            self.window = 0
            self.current_block = block
            if self.pace is not None:
                self.pace.paused()
            return range(0)
        most = self.max_window
        if self.pace is not None:
            self.pace.read(end - offset)
            most = max(1, self.pace.window() // self.block_size)
        if self.window == 0:
            self.window = 1
        elif block > self.current_block:
            self.window = min(most, self.window * 2)
        self.window = min(self.window, most)
        self.current_block = max(self.current_block, block)
        return range(block + 1, min(self.last_block, block + self.window) + 1)

    def close(self) -> None:
        """The file is closed: its pace no longer takes a share of the budget."""
        if self.pace is not None:
            self.pace.close()

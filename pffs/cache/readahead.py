"""Readahead policy for one open file: detect sequential runs, grow a window, reset on seeks.

Pure bookkeeping with no I/O, so it is tested on its own. The window starts at one block when
a read continues where the previous one ended (or starts the file), doubles each time the reader
moves into a new block, up to a maximum, and drops to nothing on a seek: random access never
reads ahead. With a reader window (pffs.cache.window), the maximum is its size instead (the
configured one, or more by Little's law, within the reader's share of the budget), and the
reads of a sequential run feed its rate.

One handle may carry several runs at once: the page faults of a memory-mapped file read
through one handle, and a lazy loader copying a few tensors (safetensors' `safe_open`), from
one thread or several, makes a run per tensor, each a stretch of the kernel's read-around and
readahead. So runs are tracked as streams, up to STREAMS per handle, each with its own window;
a read continuing none of them starts a stream (the least recently read one is forgotten).

A run that starts in the middle of the file is a region (a tensor, a column chunk): where it
ends is unknown, so its window is also held to a share of what the run has read so far
(REGION_SHARE): a region read whole costs at most that share more, never the rest of the file.
A run from the start of the file is a whole-file reader and keeps the full window. While a
region run is short (REGION_STREAM_BLOCKS), of large reads (the kernel's), it loads no blocks:
`stream_to` says how far its bytes should be streamed (pffs.fs.regions), a share of what it
has read ahead of it, and `stream_gap` the bytes between a copy's start and its end when the
copy faulted at both (REGION_COPY_END); a region run within REGION_STREAM_FIRST of the file's
end loads the file's last blocks instead. Only a run that has read a read-around (READ_AROUND)
does either of the last two: a pread the kernel split in two READs is a short region too.

Random page faults over a mapped file (`datasets`' gathers of rows from an Arrow file) are
regions too, short ones that never continue: the kernel's read-around (two READs) at a random
offset, then a fault elsewhere. Once such faults have touched a share of the file's blocks
(SWEEP_SHARE), the rest of the file is loaded as a scan's blocks are (`sweeping`), within the
mount's budget of bytes ahead, so later faults find it (docs/notes/clients-arrow-mmap.md).
The same file's metadata walk before them (`read_all`: a hop per record batch, forward from the
file's start) starts that load sooner (pffs.cache.walks), from the walk's front: the blocks it
goes on to first, those behind it after.
"""

from __future__ import annotations

from pffs.cache.walks import HopWalk
from pffs.cache.window import ReaderWindow

MIB = 1 << 20
# The kernel may reorder or slightly skip its own readahead requests; mountpoint-s3 tolerates
# 1 MiB backwards, and we tolerate up to two blocks forwards, before calling a read a seek.
# Forwards, only a run already under way (RUN_READS reads in a row) is given the two blocks: a
# read that would start or confirm one must land within its own size of where the last ended.
# A reader at named offsets (pyarrow's column chunks of a Parquet projection, a few hundred KiB
# each, a few MiB apart) otherwise makes a run of a file it reads a tenth of, and its readahead
# loads all of it (docs/notes/clients-parquet.md).
BACKWARD_TOLERANCE = 1 * MIB
FORWARD_BLOCKS_TOLERANCE = 2
RUN_READS = 2
# Runs followed at once in one handle (the faults of a few tensors, from a few threads).
STREAMS = 4
# A read at least this large is the kernel's read-around or readahead (a page fault in a mapped
# file, a buffered reader): only such reads continue a run other than the last read's, so a
# program's small random reads landing near an older run never make a sequential run of it.
LARGE_READ = 128 << 10
# A region's window is at most this share of the bytes its run has read (one block at least).
REGION_SHARE = 0.5
# A region run that has read less than this many blocks is streamed (pffs.fs.regions): its
# bytes come from ranged GETs just ahead of it, no blocks loaded; past it, blocks as above.
REGION_STREAM_BLOCKS = 4
# How far ahead of a streamed region run its bytes are asked for: this share of what the run
# has read, at most REGION_STREAM_FIRST bytes at its second read (the page fault's read-around:
# most of the region in one round trip), at most REGION_STREAM_AHEAD after it. None: the
# kernel's own readahead of a mapping keeps its READs 2-4 MiB ahead of the copy, several asked
# at once, so a READ's bytes asked when it comes are still ahead of the reader; bytes streamed
# past the kernel's last READ are those past the region's end it never asks for (a lazy
# loader's tensor: docs/notes/clients-safetensors.md).
REGION_STREAM_SHARE = 2.0
REGION_STREAM_FIRST = 4 * MIB
REGION_STREAM_AHEAD = 0
# REGION_STREAM_FIRST is asked at a region's second READ, though a random fault's read-around
# ends there and wastes it (unless the file is swept, below, which takes those bytes): waiting
# for a third READ in order cost a lazy loader's tensors a round trip each (their READs waiting
# more than 15 ms: 70 of 74, against 53-57; docs/notes/clients-arrow-mmap.md).
# Random faults: once short regions that never continued, each landing behind the furthest
# fault before it (not a forward walk), have touched this share of the file's blocks, the rest
# of the file is loaded. What tells them apart in this view: a fault is the kernel's
# read-around, two READs in order at least; a lazy loader's tensor is a region that continues
# in order (its run goes past its read-around), so it never counts; a Parquet projection's
# ranged reads (pread of its column chunks) are a READ each, which never counts either: pyarrow
# asks for a file's chunks at once from several threads, so they may land anywhere behind the
# furthest, and then a projection loaded whole files (docs/notes/clients-parquet.md); an Arrow
# file's metadata walk goes forward. The gathers of random rows land anywhere, mostly behind
# the furthest one so far.
SWEEP_SHARE = 1 / 8
# A region starting at most this far ahead of another region being read streams nothing ahead
# at its second READ: a lazy loader's copy of a tensor faults at its start, then at its end
# (likely glibc's memmove, which loads a large buffer's last bytes first), then its middle; the
# end's region would stream REGION_STREAM_FIRST past the tensor, bytes the loader never reads
# (about 3 MiB of each 8 MiB tensor: docs/notes/clients-full-load-window.md). Larger tensors'
# ends land further ahead and keep the stream, a smaller share of their bytes. The middle
# between the two is streamed at once (`stream_gap`): asked for only when the copy reached it,
# it cost each tensor a round trip more.
REGION_COPY_END = 8 * MIB
# A region that has read this much is a fault's read-around (two READs of 1 MiB here) or a
# large read's readahead; less is a pread the kernel split in two READs (a Parquet projection's
# column chunk of a few hundred KiB), which asks for no copy's middle (between two chunks: the
# columns the projection skips) and never loads the file's last blocks (the rule for a last
# row group, below): docs/notes/clients-parquet.md.
READ_AROUND = 1 * MIB
# Drop-behind (`passes`) follows the bytes a handle read without a gap: a read this far past
# them is a seek (that gap is never filled), and so are reads past gaps once this many wait
# (random access); either starts the coverage over.
COVERAGE_SEEK = 64 * MIB
COVERAGE_GAPS = 64


class _Coverage:
    """What a handle has read without a gap: from a start (the file's, or a seek's) up to
    `through`, the reads past it waiting for the gap before them to fill, and the first block
    not yet passed (drop-behind: `Readahead.passes`)."""

    __slots__ = ("_ahead", "_block_size", "passed", "through")

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self.through = 0
        self.passed = 0
        self._ahead: dict[int, int] = {}  # start -> end of reads past a gap

    def read(self, offset: int, end: int) -> None:
        if offset > self.through + COVERAGE_SEEK or len(self._ahead) >= COVERAGE_GAPS:
            # A seek, or random reads: start over here.
            self.through, self._ahead, self.passed = end, {}, offset // self._block_size
            return
        if offset > self.through:
            self._ahead[offset] = max(end, self._ahead.get(offset, end))
            return
        self.through = max(self.through, end)
        while self._ahead:
            filled = next((start for start in self._ahead if start <= self.through), None)
            if filled is None:
                return
            self.through = max(self.through, self._ahead.pop(filled))


class _Stream:
    """One sequential run (or a read that may start one) within a handle."""

    __slots__ = ("current_block", "expected", "origin", "streak", "window")

    def __init__(self, origin: int, streak: int) -> None:
        self.origin = origin  # where the run started
        self.expected = origin  # where it reads next
        self.streak = streak  # reads in a row that continued the one before
        self.window = 0
        self.current_block = -1


class Readahead:
    def __init__(
        self,
        block_size: int,
        readahead_max: int,
        file_size: int,
        reader_window: ReaderWindow | None = None,
    ) -> None:
        self.block_size = block_size
        self.max_blocks = readahead_max // block_size  # the configured window, in blocks
        self.file_size = file_size
        self.last_block = (file_size - 1) // block_size if file_size > 0 else -1
        self.backward = min(BACKWARD_TOLERANCE, block_size)
        self.reader_window = reader_window
        # Most recently read first. A file opened and read from offset 0 counts as one read
        # of a run already; otherwise two are needed, so a random reader whose next read
        # happens to land nearby does not start a readahead.
        self._streams = [_Stream(0, 1)]
        self.sequential = False  # whether the last read was part of a sequential run
        self.region = False  # whether that run started past the file's start
        # Where a streamed region run's bytes should be asked for up to (pffs.fs.regions), or
        # None: the last read is not one.
        self.stream_to: int | None = None
        # The bytes between a copy's start and its end's region, to be streamed now, or None
        # (see REGION_COPY_END): the copy reads them next.
        self.stream_gap: tuple[int, int] | None = None
        # Random faults (see SWEEP_SHARE): the blocks touched by short regions landing behind
        # the furthest fault start, the stream of the last fault (counted once the next comes,
        # if it never continued) and the furthest fault start so far.
        self._fault_blocks: set[int] = set()
        self._last_fault: _Stream | None = None
        self._fault_front = -1
        # Reads of a forward walk answered out of order (a few threads' preads) land at most
        # this far behind the furthest one: not random.
        self._reorder = FORWARD_BLOCKS_TOLERANCE * block_size
        self.sweeping = False  # whether the rest of the file is being loaded
        self._walk = HopWalk()  # a walk forward in hops from the start also starts it
        self._sweep_from = 0  # the block a sweep loads first (then on to the end, then before)
        self._coverage = _Coverage(block_size)

    @property
    def window(self) -> int:
        """The window of the last read's run, in blocks."""
        return self._streams[0].window

    def _near(self, stream: _Stream, offset: int, size: int) -> bool:
        forward = FORWARD_BLOCKS_TOLERANCE * self.block_size
        if stream.streak < RUN_READS:
            forward = min(forward, size)
        return stream.expected - self.backward <= offset <= stream.expected + forward

    def _stream_for(self, offset: int, size: int) -> tuple[_Stream, bool]:
        """The stream this read continues (moved to the front), or a new one; whether near.

        Of several it may continue, the longest run: a straggler of the kernel's readahead (a
        READ answered late, behind the run) starts a stream of its own, which must not take
        the reads that follow from the run they belong to."""
        streams = self._streams
        candidates = streams if size >= LARGE_READ else streams[:1]
        near = [stream for stream in candidates if self._near(stream, offset, size)]
        if near:
            stream = max(near, key=lambda s: s.streak)  # the first of the longest
            if stream is not streams[0]:
                streams.remove(stream)
                streams.insert(0, stream)
            return stream, True
        stream = _Stream(offset, 0)
        streams.insert(0, stream)
        del streams[STREAMS:]
        return stream, False

    def on_read(self, offset: int, end: int) -> range:
        """Record a read of [offset, end); return the block indices worth loading ahead."""
        self._coverage.read(offset, end)
        stream, near = self._stream_for(offset, end - offset)
        if not near and end - offset >= LARGE_READ and offset > 0:
            self._fault(stream, end)
        if end - offset >= LARGE_READ and not self.sweeping:
            self._walked(offset, end)
        stream.streak = stream.streak + 1 if near else 0
        stream.expected = max(end, stream.expected) if near else end
        self.sequential = stream.streak >= RUN_READS
        self.region = stream.origin > 0
        self.stream_to = self.stream_gap = None
        block = (max(end, 1) - 1) // self.block_size
        read = stream.expected - stream.origin
        streamed = self.region and near and end - offset >= LARGE_READ and self.max_blocks > 0
        if streamed and read < REGION_STREAM_BLOCKS * self.block_size:
            copied = self._copy_of(stream) if stream.streak == 1 else None
            first = stream.streak == 1 and copied is None
            most = REGION_STREAM_FIRST if first else REGION_STREAM_AHEAD
            ahead = min(most, int(read * REGION_STREAM_SHARE))
            stream.current_block = block
            if stream.expected + REGION_STREAM_FIRST >= self.file_size and read >= READ_AROUND:
                # The stream would run to the file's end (pyarrow reading a Parquet file's
                # last row group): its blocks are loaded instead, whole blocks the cache keeps
                # and the file's run from the start then finds, not spans streamed in pieces
                # for this open alone (each piece a hop, a copy and a wake-up on the main
                # thread). Beyond the stream's bytes, this fetches at most the start of the
                # read's block, before the read.
                return range(offset // self.block_size, self.last_block + 1)
            self.stream_to = stream.expected + ahead
            if copied is not None and min(read, copied.expected - copied.origin) >= READ_AROUND:
                self.stream_gap = (copied.expected, stream.origin)
            return range(0)
        if stream.streak < RUN_READS or self.max_blocks == 0:
            stream.window = 0
            stream.current_block = block
            if self.reader_window is not None:
                self.reader_window.paused()
            return range(0)
        most = self.max_blocks
        if self.reader_window is not None:
            self.reader_window.read(end - offset)
            most = max(1, self.reader_window.size() // self.block_size)
        if self.region:
            most = min(most, max(1, int(read * REGION_SHARE) // self.block_size))
        if stream.window == 0:
            stream.window = 1
        elif block > stream.current_block:
            stream.window = min(most, stream.window * 2)
        stream.window = min(stream.window, most)
        stream.current_block = max(stream.current_block, block)
        return range(block + 1, min(self.last_block, block + stream.window) + 1)

    def passes(self, offset: int) -> range:
        """The blocks a sequential read at `offset` leaves behind for good (drop-behind: they
        may leave memory once on disk), each once. Reading into a block of a file of several
        (one with a reader window), those up to the block two back: not the one just before,
        as the kernel's READs of one run arrive several at once and one of its end may come
        after this one; and only those read through (every byte before their end read since
        the file's start or the last seek), not only the run's front: a whole-file loader's
        copy faults at each tensor's end before the kernel reads the tensor's middle
        (docs/notes/clients-full-load-window.md), so its run goes ahead over a gap the kernel's
        READs fill later. Any read may pass them, not only one at a block's start: a mapping's
        READs start at a block's first byte for one block in two (docs/notes/drop-behind.md)."""
        coverage = self._coverage
        if self.reader_window is None:
            return range(0)
        last = min(offset // self.block_size - 2, coverage.through // self.block_size - 1)
        passed = range(coverage.passed, last + 1)
        coverage.passed = max(coverage.passed, last + 1)
        return passed

    def _copy_of(self, stream: _Stream) -> _Stream | None:
        """The region `stream` starts a little ahead of, when it is the end of a buffer the
        copy faulted before its middle (see REGION_COPY_END); else None."""
        for other in self._streams:
            if other is stream or other.origin == 0:
                continue
            if other.expected < stream.origin <= other.expected + REGION_COPY_END:
                return other
        return None

    def _fault(self, stream: _Stream, end: int) -> None:
        """A large read that continues no run (a page fault's first READ) starts `stream`;
        the last fault's run, if it never went past its read-around, was a random one."""
        last = self._last_fault
        behind = last is not None and last.origin + self._reorder < self._fault_front
        if last is not None and 0 < last.streak < RUN_READS and behind:
            first = last.origin // self.block_size
            self._fault_blocks.update(range(first, (last.expected - 1) // self.block_size + 1))
        self._last_fault = stream
        if end < self.file_size:  # a footer's read is no walk's front
            self._fault_front = max(self._fault_front, stream.origin)
        blocks = self.last_block + 1
        if not self.sweeping and blocks > 2 and len(self._fault_blocks) >= blocks * SWEEP_SHARE:
            self.sweeping = True

    def _walked(self, offset: int, end: int) -> None:
        """A large READ, seen as part of a walk in hops; once the walk is told, the file is
        swept from where the walk is: it goes on to the blocks ahead (a round trip per hop
        otherwise), the gathers of its bodies come after it and land anywhere."""
        walk = self._walk
        walk.read(offset, end)
        if walk.walking and self.last_block + 1 > 2:
            self.sweeping = True
            self._sweep_from = min(walk.front // self.block_size, self.last_block)

    def sweep(self, passed: int = 0) -> list[range]:
        """The file's blocks to load while it is swept (none when not), in the order to load
        them: from the block a walk reached (the first, after random faults) to the end, then
        those before it; less the order's first `passed`. The cache loads them
        (pffs.cache.sweeps)."""
        if not self.sweeping:
            return []
        first = self._sweep_from
        ahead = range(first + passed, self.last_block + 1)
        behind = range(max(0, passed - len(range(first, self.last_block + 1))), first)
        return [r for r in (ahead, behind) if r]

    def close(self) -> None:
        """The file is closed: its window no longer takes a share of the budget, nor is the
        file swept on (a load that lands after asks for no more)."""
        self.sweeping = False
        if self.reader_window is not None:
            self.reader_window.close()

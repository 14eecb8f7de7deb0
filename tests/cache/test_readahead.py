"""The per-file readahead policy: pure bookkeeping, no I/O."""

from __future__ import annotations

import random

from pffs.cache.readahead import (
    REGION_STREAM_AHEAD,
    REGION_STREAM_BLOCKS,
    REGION_STREAM_FIRST,
    SWEEP_SHARE,
    Readahead,
)
from pffs.cache.window import Windows
from tests.cache.configs import KIB

MIB = 1024 * KIB


def test_readahead_grows_on_sequential_reads_and_resets_on_seek() -> None:
    block = 4 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    windows = []
    for offset in range(0, 20 * block, block // 2):
        windows.append(len(ra.on_read(offset, offset + block // 2)))
    assert windows[0] == 1 and max(windows) == 8
    assert list(ra.on_read(500 * block, 500 * block + 100)) == []  # a seek: nothing
    # Sequential again: the first continuation may be chance, the second starts a window.
    assert list(ra.on_read(500 * block + 100, 500 * block + 200)) == []
    assert len(ra.on_read(500 * block + 200, 500 * block + 300)) == 1


def test_random_reads_never_read_ahead() -> None:
    block = 4 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    rng = random.Random(0)
    for _ in range(200):
        offset = rng.randrange(1, 999) * block + 7
        assert list(ra.on_read(offset, offset + 4096)) == []


def test_readahead_stops_at_the_end_of_the_file() -> None:
    ra = Readahead(100, readahead_max=10_000, file_size=350)
    assert list(ra.on_read(0, 100)) == [1]
    assert list(ra.on_read(100, 200)) == [2, 3]
    assert list(ra.on_read(200, 300)) == [3]


def test_a_region_gets_a_window_held_to_half_of_what_its_run_read() -> None:
    """A run starting mid-file (a tensor's page faults) is a sequential reader of its region:
    readahead follows it, but never runs ahead more than half of what it has read, so a region
    read whole costs little more than itself, never the rest of the file."""
    block = 4 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    start = 100 * block + 512
    farthest = 0
    for offset in range(start, start + 16 * block, block // 4):
        end = offset + block // 4
        ahead = ra.on_read(offset, end)
        assert ra.region
        if ahead:
            farthest = max(farthest, ahead[-1])
            beyond = (ahead[-1] - (end - 1) // block) * block
            assert beyond <= max(block, (end - start) // 2)
    assert farthest > (start + 8 * block) // block  # it did read ahead
    # From the start of the file the full window is kept.
    whole = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    windows = [len(whole.on_read(o, o + block)) for o in range(0, 8 * block, block)]
    assert max(windows) == 8 and not whole.region


def test_interleaved_runs_of_large_reads_each_keep_their_window() -> None:
    """Faults of two tensors copied by two threads reach one handle interleaved: each run stays
    sequential and reads ahead for itself."""
    block = 256 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    size = 128 * KIB  # the kernel's readahead-sized reads
    a, b = 100 * block, 500 * block
    for step in range(12):
        ahead_a = ra.on_read(a + step * size, a + (step + 1) * size)
        assert ra.sequential == (step >= 2)
        ahead_b = ra.on_read(b + step * size, b + (step + 1) * size)
        assert ra.sequential == (step >= 2)
    assert ahead_a and all(100 <= i < 110 for i in ahead_a)
    assert ahead_b and all(500 <= i < 510 for i in ahead_b)


def test_small_reads_near_an_older_run_stay_random() -> None:
    """Only large reads (the kernel's) continue a run other than the last read's: a program's
    4 KiB reads hopping between two neighbourhoods never look sequential."""
    block = 4 * KIB * 1024
    ra = Readahead(block, readahead_max=8 * block, file_size=100 * block)
    for step in range(10):
        assert not ra.on_read(20 * block + step * 4096, 20 * block + (step + 1) * 4096 - 8192)
        assert not ra.on_read(5 * block + step * 4096, 5 * block + step * 4096 + 4096)
        assert not ra.sequential


def test_a_straggler_behind_a_whole_file_run_does_not_take_it_over() -> None:
    """A READ of the kernel's readahead answered late lands behind the run: it starts a stream
    of its own, and the reads after it still belong to the run, with its window."""
    block = 256 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=1000 * block)
    size = 128 * KIB
    for offset in range(0, 40 * block, size):
        ra.on_read(offset, offset + size)
    window = ra.window
    assert window == 8 and not ra.region
    ra.on_read(38 * block, 38 * block + size)  # a straggler, 2 blocks behind
    assert not ra.sequential
    ahead = ra.on_read(40 * block, 40 * block + size)
    assert ra.sequential and not ra.region and len(ahead) == window


def test_a_short_region_run_of_large_reads_is_streamed_then_loads_blocks() -> None:
    """A region run of the kernel's READs (1 MiB, from mid-file) loads no blocks while it is
    short: its second read asks for its bytes to be streamed REGION_STREAM_FIRST ahead (a share
    of what it read), the reads after it REGION_STREAM_AHEAD ahead; past REGION_STREAM_BLOCKS
    blocks read, the run loads blocks ahead as any region does."""
    block, size = 4 * MIB, MIB
    ra = Readahead(block, readahead_max=8 * block, file_size=100 * block)
    start = 30 * block + 5616
    assert not ra.on_read(start, start + size) and ra.stream_to is None  # starts no run
    assert not ra.on_read(start + size, start + 2 * size)
    assert ra.stream_to == start + 2 * size + REGION_STREAM_FIRST
    ends = []
    offset = start + 2 * size
    while offset + size - start < REGION_STREAM_BLOCKS * block:
        assert not ra.on_read(offset, offset + size)
        assert ra.stream_to == offset + size + REGION_STREAM_AHEAD
        ends.append(ra.stream_to)
        offset += size
    assert ends
    assert ra.on_read(offset, offset + size) and ra.stream_to is None  # long: blocks


def test_no_stream_for_a_whole_file_run_small_reads_or_readahead_off() -> None:
    block, size = 4 * MIB, MIB
    whole = Readahead(block, readahead_max=8 * block, file_size=100 * block)
    small = Readahead(block, readahead_max=8 * block, file_size=100 * block)
    off = Readahead(block, readahead_max=0, file_size=100 * block)
    for step in range(8):
        whole.on_read(step * size, (step + 1) * size)
        small.on_read(10 * block + step * 4096, 10 * block + (step + 1) * 4096)
        off.on_read(10 * block + step * size, 10 * block + (step + 1) * size)
        assert whole.stream_to is None and small.stream_to is None and off.stream_to is None


def test_a_region_run_to_the_end_of_the_file_loads_its_last_blocks_not_a_stream() -> None:
    """pyarrow's read of a Parquet file's last row group (traced: from 31.76 MiB of a 35.73 MiB
    file, in 1 MiB READs to the end): a stream would reach the file's end, so the blocks from
    the second READ's on are loaded (cached whole, found by the run from the file's start),
    never a stream; a region ending further from the end still streams, and a pread's two
    READs there load nothing."""
    block, size = 4 * MIB, MIB
    file_size = 35 * MIB + 750 * KIB
    ra = Readahead(block, readahead_max=8 * block, file_size=file_size)
    start = 31 * MIB + 780 * KIB
    assert not ra.on_read(start, start + size) and ra.stream_to is None  # the fault: alone
    second = start + size  # in block 8, the file's last
    assert ra.on_read(second, second + size) == range(8, 9) and ra.stream_to is None
    assert ra.on_read(second + size, second + 2 * size) == range(8, 9)
    assert ra.stream_to is None
    far = Readahead(block, readahead_max=8 * block, file_size=file_size + 8 * MIB)
    far.on_read(start, start + size)
    assert not far.on_read(second, second + size)
    assert far.stream_to == second + size + REGION_STREAM_FIRST
    # A column chunk's pread split in two READs there loads nothing (a projection's).
    chunk = Readahead(block, readahead_max=8 * block, file_size=file_size)
    chunk.on_read(start, start + 160 * KIB)
    assert not chunk.on_read(start + 160 * KIB, start + 460 * KIB)


def test_reads_at_named_offsets_a_few_mib_apart_never_make_a_run() -> None:
    """pyarrow's projection of 2 of 20 columns: a column chunk of ~460 KiB every ~3.5 MiB,
    in order, from near the file's start (as traced: docs/notes/clients-parquet.md)."""
    ra = Readahead(4 * MIB, readahead_max=32 * MIB, file_size=36 * MIB)
    for offset in (1_400_000, 5_150_000, 10_780_000, 14_530_000, 20_150_000, 23_910_000):
        assert list(ra.on_read(offset, offset + 470_000)) == []
        assert not ra.sequential and ra.stream_to is None


def test_a_run_under_way_still_takes_the_kernels_skips_forward() -> None:
    """Once a run is going, a READ a block past where it is expected (the kernel skipping
    pages it holds, or answering out of order) continues it; a run not yet started needs a
    read within its own size."""
    ra = Readahead(4 * MIB, readahead_max=32 * MIB, file_size=400 * MIB)
    for offset in range(0, 4 * MIB, MIB):
        ra.on_read(offset, offset + MIB)
    assert ra.sequential
    assert list(ra.on_read(9 * MIB, 10 * MIB))  # 5 MiB past: within two blocks
    assert ra.sequential
    # Mid-file (a region), a read 1.5 MiB past the last one's end, of 1 MiB, starts its own.
    fresh = Readahead(4 * MIB, readahead_max=32 * MIB, file_size=400 * MIB)
    fresh.on_read(100 * MIB, 101 * MIB)
    fresh.on_read(int(102.5 * MIB), int(103.5 * MIB))
    assert not fresh.sequential
    fresh.on_read(int(103.5 * MIB), int(104.5 * MIB))
    assert not fresh.sequential
    fresh.on_read(int(104.5 * MIB), int(105.5 * MIB))  # two continuations in a row: a run
    assert fresh.sequential


def _faults(ra: Readahead, starts: list[int], reads: int, size: int) -> list[range]:
    """Each start a page fault's run of `reads` READs of `size` in order (2: a read-around);
    the ranges the readahead asked to load."""
    asked = []
    for start in starts:
        for step in range(reads):
            asked.append(ra.on_read(start + step * size, start + (step + 1) * size))
    return asked


def test_random_faults_over_a_share_of_the_file_load_all_of_it() -> None:
    """Read-arounds at random offsets that never continue (`datasets`' gathers of rows from a
    mapped Arrow file): once they have touched SWEEP_SHARE of the file's blocks, every block is
    worth loading; before, none."""
    block, size, blocks = 4 * MIB, MIB, 64
    ra = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    starts = random.Random(5).sample(range(0, blocks * block - 2 * size, 64 * KIB), 40)
    touched: set[int] = set()
    for start in starts:
        _faults(ra, [start], 2, size)
        if not ra.sweeping:
            assert not ra.sweep()
            touched.add(start // block)
    assert ra.sweeping and ra.sweep() == [range(blocks)]
    assert len(touched) >= blocks * SWEEP_SHARE  # not at the first faults


def test_forward_faults_and_continuing_tensors_never_load_the_file() -> None:
    """A Parquet projection's ranged reads (forward through the file, a few answered out of
    order; or a READ each in any order) and a lazy loader's tensors (regions that continue, in
    random order) are no random faults, however much of the file they touch."""
    block, size, blocks = 4 * MIB, MIB, 64
    forward = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    _faults(forward, [blocks * block - 2 * size], 2, size)  # the footer
    starts = list(range(size, (blocks - 2) * block, 3 * MIB))
    for i in range(0, len(starts) - 1, 2):  # pairs of chunks answered out of order
        starts[i], starts[i + 1] = starts[i + 1], starts[i]
    _faults(forward, starts, 2, size)
    assert not forward.sweeping
    # pyarrow's chunks asked at once from several threads: a READ each, landing anywhere.
    preads = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    _faults(preads, [blocks * block - 2 * size], 2, size)  # the footer
    chunks = random.Random(7).sample(range(size, (blocks - 2) * block, 3 * MIB), 60)
    _faults(preads, chunks, 1, 460 * KIB)
    assert not preads.sweeping
    tensors = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    starts = random.Random(6).sample(range(block, (blocks - 2) * block, 2 * block), 24)
    _faults(tensors, [s + 5616 for s in starts], 4, size)
    assert not tensors.sweeping


def _walk_reads(hops: list[int], size: int) -> list[tuple[int, int]]:
    """An Arrow file's `read_all` by mmap (docs/notes/clients-arrow-mmap.md): the file's start,
    then a hop per record batch's metadata: the fault's read-around (two READs, here the second
    first now and then) and one READ of readahead after it."""
    reads = [(0, size), (size, size)]
    for n, hop in enumerate(hops):
        pair = [(hop, size), (hop + size, size)]
        reads += (pair[::-1] if n % 2 else pair) + [(hop + 2 * size, size)]
    return reads


def test_a_walk_in_hops_from_the_start_loads_the_file_from_its_front() -> None:
    """Forward hops of read-arounds at alike strides from the file's first byte: at the third
    fault the file is swept, the blocks ahead of the walk first, then those behind it."""
    block, size, blocks = 4 * MIB, MIB, 64
    stride = 15 * MIB + 656 * KIB  # a record batch and its metadata
    hops = [14 * MIB + 660 * KIB + n * stride for n in range(6)]
    ra = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    reads = _walk_reads(hops, size)
    third = reads.index((hops[1] + size, size))  # the third fault's first READ (pair reversed)
    for n, (offset, length) in enumerate(reads):
        ra.on_read(offset, offset + length)
        assert ra.sweeping == (n >= third), n
    front = (hops[1] + size) // block
    assert ra.sweep() == [range(front, blocks), range(front)]


def test_reads_that_walk_no_file_in_hops_never_sweep_it() -> None:
    """What is no walk: a Parquet projection (its footer first, then one pread per column chunk,
    a few answered out of order: the bench's trace), a lazy loader's tensors (the header at the
    start, then runs of many READs), hops not from the file's start, or at strides unalike."""
    block, size, blocks = 4 * MIB, MIB, 64

    def swept(reads: list[tuple[int, int]]) -> bool:
        ra = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
        for offset, length in reads:
            ra.on_read(offset, offset + length)
        return ra.sweeping

    footer = [(blocks * block - 68 * KIB, 68 * KIB)]
    chunks = [n * 3 * MIB + 600 * KIB for n in range(40)]
    for i in range(0, len(chunks) - 1, 2):
        chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
    assert not swept(footer + [(chunk, 460 * KIB) for chunk in chunks])
    tensors = [(0, size), (size, size)]
    for start in (135 * MIB + 4 * KIB, 160 * MIB + 4 * KIB, 190 * MIB + 4 * KIB):
        tensors += [(start + n * size, size) for n in range(11)]
    assert not swept(tensors)
    stride = 15 * MIB
    walk = _walk_reads([stride + n * stride for n in range(6)], size)
    assert swept(walk)  # the control
    assert not swept(walk[2:])
    assert not swept(_walk_reads([stride, 40 * MIB, 55 * MIB, 70 * MIB], size))


def test_a_whole_file_loaded_in_order_is_no_walk() -> None:
    """safetensors' `load_file` by mmap, the first READs as the bench's trace had them: a fault
    at the second tensor's start (8 MiB) comes before the kernel reads the first tensor's rest,
    and the next at 16 MiB before 10-14 MiB: hops at the tensors' stride at first, until READs
    fill the gaps. That is a reader in order, not a walk: the file is not swept."""
    block, size, blocks = 4 * MIB, MIB, 128
    ra = Readahead(block, readahead_max=8 * block, file_size=blocks * block)
    first = [0, 1, 7, 8, 2, 3, 4, 5, 6, 9, 15, 16, 10, 11, 12, 13, 14, 17, 23, 24, 18, 19, 20, 21]
    offsets = [n * MIB + (4 * KIB if n in (7, 8, 9, 15, 16, 17, 23, 24) else 0) for n in first]
    offsets += [n * MIB for n in range(25, 64)]
    for offset in offsets:
        ra.on_read(offset, offset + size)
        assert not ra.sweeping, offset // MIB
    assert ra.sequential


def test_a_block_is_passed_only_once_read_through_and_its_gaps_filled() -> None:
    """Drop-behind's question, in the full load's READ order: the copy of the tensor at 24 MiB
    faults at its end (READs at 31 and 32 MiB) while the kernel has read it up to 26 MiB; the
    block before 28 MiB is passed only once READs fill 26-28 MiB. Any read passes every block
    read through two blocks behind it, each once; a seek starts over. Only in a file with a
    reader window."""
    block, size = 4 * MIB, MIB
    windows = Windows(32 * block, 8 * block, 32 * block, block, 4 * block)
    ra = Readahead(
        block, readahead_max=8 * block, file_size=128 * block, reader_window=windows.reader()
    )
    for n in range(26):
        ra.on_read(n * size, (n + 1) * size)
    assert list(ra.passes(28 * MIB + 4 * KIB)) == [0, 1, 2, 3, 4, 5]  # read through to 24 MiB
    assert list(ra.passes(28 * MIB)) == []  # each once
    for n in (31, 32):
        ra.on_read(n * size, (n + 1) * size)
    assert list(ra.passes(32 * MIB)) == []  # 26-28 MiB not read yet
    for n in (26, 27):
        ra.on_read(n * size, (n + 1) * size)
    assert list(ra.passes(33 * MIB)) == [6] and list(ra.passes(36 * MIB)) == []
    for n in (28, 29, 30):
        ra.on_read(n * size, (n + 1) * size)
    assert list(ra.passes(36 * MIB)) == [7]
    ra.on_read(300 * MIB, 301 * MIB)  # a seek: the blocks before it were not read since
    ra.on_read(302 * MIB, 303 * MIB)
    assert list(ra.passes(304 * MIB)) == []
    for n in (301, 303, 304, 305, 306):
        ra.on_read(n * MIB, (n + 1) * MIB)
    assert list(ra.passes(312 * MIB)) == [75]
    windowless = Readahead(block, readahead_max=8 * block, file_size=128 * block)
    for n in range(26):
        windowless.on_read(n * size, (n + 1) * size)
    assert list(windowless.passes(24 * MIB)) == []


def test_a_region_just_ahead_of_another_streams_nothing_ahead() -> None:
    """A lazy loader's copy of the tensor at 136 MiB faults at its start (READs at 135 and 136
    MiB), then at its end (143 and 144), then reads its middle: the start's region streams ahead
    at its second READ, the end's streams only its own READ's bytes (not 4 MiB past the
    tensor) and asks for the middle between them. A region far ahead of the others still
    streams."""
    block, size = 4 * MIB, MIB
    ra = Readahead(block, readahead_max=8 * block, file_size=128 * block)
    ra.on_read(0, size)  # the header
    start = 135 * MIB + 4 * KIB
    ra.on_read(start, start + size)
    ra.on_read(start + size, start + 2 * size)
    assert ra.stream_to == start + 2 * size + REGION_STREAM_FIRST
    end = start + 8 * MIB
    ra.on_read(end, end + size)
    assert ra.stream_gap is None
    ra.on_read(end + size, end + 2 * size)
    assert ra.stream_to == end + 2 * size + REGION_STREAM_AHEAD
    assert ra.stream_gap == (start + 2 * size, end)  # the middle, which the copy reads next
    far = start + 64 * MIB
    ra.on_read(far, far + size)
    ra.on_read(far + size, far + 2 * size)
    assert ra.stream_to == far + 2 * size + REGION_STREAM_FIRST and ra.stream_gap is None
    # Column chunks read by pread, each split in two READs: no middle between them is asked.
    chunks = Readahead(block, readahead_max=8 * block, file_size=128 * block)
    for chunk in (40 * MIB, 43 * MIB):
        chunks.on_read(chunk, chunk + 160 * KIB)
        chunks.on_read(chunk + 160 * KIB, chunk + 460 * KIB)
        assert chunks.stream_gap is None

"""The pure parts of the read floor (bench.probes.fuse_floor's `--read-mib`) and of the READ
sizes bench.probes.client_reads prints: how a file is shared among readers, how repetitions
and READ sizes are written down; and the caching store floor's disk writes."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from bench.probes._floorfs import file_spans
from bench.probes._storefloor import PIECE, StoreFloor, _Tree
from bench.probes.client_reads import size_classes
from bench.probes.fuse_floor import (
    MIB,
    MODES,
    read_jobs,
    reader_spans,
    sizes_text,
    spread,
)


def test_one_reader_takes_the_whole_file() -> None:
    assert reader_spans(256 * MIB, 1) == [(0, 256 * MIB)]


def test_four_readers_share_a_file_in_whole_reads() -> None:
    assert reader_spans(256 * MIB, 4) == [(i * 64 * MIB, 64 * MIB) for i in range(4)]


@pytest.mark.parametrize("size", [10 * MIB + 5, 3 * MIB, 1, 7 * MIB - 1])
def test_spans_cover_the_file_once_each_a_whole_number_of_reads_but_the_last(size: int) -> None:
    spans = reader_spans(size, 4)
    assert spans[0][0] == 0
    for (offset, length), (next_offset, _) in itertools.pairwise(spans):
        assert next_offset == offset + length
        assert length % MIB == 0
    assert spans[-1][0] + spans[-1][1] == size
    assert len(spans) <= 4


def test_spread_lists_the_repetitions_then_median_and_range() -> None:
    assert spread([0.6, 0.52, 0.64]) == "0.60, 0.52, 0.64 (median 0.60, 0.52-0.64)"
    assert spread([973.4, 1016.0], 0) == "973, 1016 (median 1016, 973-1016)"


def test_sizes_text_puts_the_most_common_size_first() -> None:
    assert sizes_text({4096: 2, MIB: 254, MIB - 4096: 2}) == "1024 KiB x254, 1020 KiB x2, 4 KiB x2"


def test_size_classes_count_reads_and_their_share_of_the_bytes() -> None:
    sizes = [MIB] * 3 + [256 * 1024] + [4096] * 4
    assert size_classes(sizes) == {
        "under 128 KiB": "4 (0%)",
        "128 KiB to 1 MiB": "1 (8%)",
        "1 MiB": "3 (92%)",
    }
    assert size_classes([]) == {}
    assert size_classes([MIB + 1]) == {"1 MiB": "1 (100%)"}


def test_the_files_are_the_whole_and_its_four_quarters_in_a_directory() -> None:
    assert file_spans(256 * MIB) == {
        "data": (0, 256 * MIB),
        "parts/part0": (0, 64 * MIB),
        "parts/part1": (64 * MIB, 64 * MIB),
        "parts/part2": (128 * MIB, 64 * MIB),
        "parts/part3": (192 * MIB, 64 * MIB),
    }


def test_each_mode_reads_every_byte_once() -> None:
    size = 256 * MIB
    assert read_jobs("/m", "1 reader", size) == [("/m/data", 0, size)]
    offsets = read_jobs("/m", "4 offsets", size)
    assert [(path, offset) for path, offset, _ in offsets] == [
        ("/m/data", i * 64 * MIB) for i in range(4)
    ]
    assert read_jobs("/m", "4 files", size) == [
        (f"/m/parts/part{i}", 0, 64 * MIB) for i in range(4)
    ]
    for mode in MODES:
        assert sum(length for *_, length in read_jobs("/m", mode, size)) == size


def test_the_kept_floor_writes_each_piece_whole_to_a_file_of_its_own(tmp_path: Path) -> None:
    """The caching floor's writer (its O_DIRECT write from a reused aligned buffer), on the
    test's own directory; no store is asked, so the backend is left out."""
    tree = _Tree({"dir/a": PIECE + 5})
    floor = StoreFloor(tree, backend=None, keep_dir=str(tmp_path))  # type: ignore[arg-type]
    (file,) = tree.files.values()
    file.opened = 0
    file.pieces = [os.urandom(PIECE), b"tail!"]
    for piece in (0, 1):
        floor._write(file, piece)
    assert (tmp_path / "0-0").read_bytes() == file.pieces[0]
    padded = b"tail!" + bytes(4096 - 5)  # to O_DIRECT's alignment, with zeros
    assert (tmp_path / "0-1").read_bytes() == padded
    assert len(floor._spare) == 1  # one buffer, reused

"""A disk tier directory of another layout (disklayout.py): adopted when its entries are in this
format, else cleared with one log line; never an error to readers."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from pffs.cache.disk import DiskTier
from pffs.cache.disklayout import LAYOUT, LAYOUT_FILE

BLOCKS = {f"block-{n}": random.Random(n).randbytes(100_000 + n) for n in range(4)}


def _filled(directory: Path) -> None:
    tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    for key, data in BLOCKS.items():
        assert tier.put(key, data, "src")
    tier.close()


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.val"))


def _cleared_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "another layout" in r.getMessage()]


def test_a_new_directory_is_marked_and_a_marked_one_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "cache"
    _filled(directory)
    assert (directory / LAYOUT_FILE).read_text() == LAYOUT
    with caplog.at_level(logging.WARNING):
        tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    for key, data in BLOCKS.items():
        assert tier.get(key).data == data
    tier.close()
    assert not _cleared_lines(caplog)


def test_an_unmarked_directory_of_this_format_is_adopted(tmp_path: Path) -> None:
    """Written by a pffs from before the marker, in the same entry format: still served."""
    directory = tmp_path / "cache"
    _filled(directory)
    (directory / LAYOUT_FILE).unlink()
    tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    for key, data in BLOCKS.items():
        assert tier.get(key).data == data
    tier.close()
    assert (directory / LAYOUT_FILE).read_text() == LAYOUT


@pytest.mark.parametrize("how", ["older entries, no marker", "another marker", "garbled marker"])
def test_a_directory_of_another_layout_is_cleared_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    directory = tmp_path / "cache"
    _filled(directory)
    (directory / "not-ours.txt").write_text("left alone")
    if how == "older entries, no marker":
        (directory / LAYOUT_FILE).unlink()
        for entry in _entries(directory):  # the format before this one
            with entry.open("r+b") as f:
                f.write(b"PFB2")
    elif how == "another marker":
        (directory / LAYOUT_FILE).write_text("pffs disk tier 4\n")
    else:
        (directory / LAYOUT_FILE).write_bytes(b"\xff\xfe" * 10)
    with caplog.at_level(logging.WARNING):
        tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    assert len(_cleared_lines(caplog)) == 1
    assert not _entries(directory)
    for key in BLOCKS:  # misses, no errors, and no line per entry
        assert tier.get(key).data is None
    assert len(caplog.records) == 1
    # The tier works as a fresh one, and the next open keeps it.
    assert tier.put("new", b"fresh", "src")
    tier.close()
    assert (directory / "not-ours.txt").read_text() == "left alone"
    tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    assert tier.get("new").data == b"fresh"
    tier.close()
    assert len(_cleared_lines(caplog)) == 1

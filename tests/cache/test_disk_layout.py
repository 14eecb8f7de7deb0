"""A disk tier directory of another layout (disklayout.py): adopted when its entries are in this
format, else cleared with one log line; never an error to readers. Each case leaves a directory
diskcache's own check finds sound."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from pffs.cache.disk import DiskTier
from pffs.cache.disklayout import INDEX, LAYOUT, mark, read_mark
from tests.cache.test_disk_batch import _check_diskcache

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
    assert read_mark(str(directory / INDEX)) == LAYOUT
    with caplog.at_level(logging.WARNING):
        tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    for key, data in BLOCKS.items():
        assert tier.get(key).data == data
    tier.close()
    assert not _cleared_lines(caplog)
    _check_diskcache(directory)


def test_an_unmarked_directory_of_this_format_is_adopted(tmp_path: Path) -> None:
    """Written by a pffs from before the marker, in the same entry format: still served."""
    directory = tmp_path / "cache"
    _filled(directory)
    mark(str(directory / INDEX), 0)
    tier = DiskTier(str(directory), 1 << 30, 0.0, compress=False)
    for key, data in BLOCKS.items():
        assert tier.get(key).data == data
    tier.close()
    assert read_mark(str(directory / INDEX)) == LAYOUT


@pytest.mark.parametrize(
    "how",
    ["older entries, unmarked", "keys without the principal", "another mark", "garbled index"],
)
def test_a_directory_of_another_layout_is_cleared_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    directory = tmp_path / "cache"
    _filled(directory)
    (directory / "not-ours.txt").write_text("left alone")
    index = directory / INDEX
    if how == "older entries, unmarked":
        mark(str(index), 0)
        for entry in _entries(directory):  # the format before this one
            with entry.open("r+b") as f:
                f.write(b"PFB2")
    elif how == "keys without the principal":  # layout 3: blocks shared by every principal
        mark(str(index), 3)
    elif how == "another mark":
        mark(str(index), LAYOUT + 1)
    else:
        for name in (INDEX, f"{INDEX}-wal", f"{INDEX}-shm"):
            (directory / name).unlink(missing_ok=True)
        index.write_bytes(b"\xff\xfe" * 1000)
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
    (directory / "not-ours.txt").unlink()  # an unknown file to diskcache's check
    _check_diskcache(directory)

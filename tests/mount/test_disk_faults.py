"""The disk tier's faults through real mounts: entries truncated or overwritten by hand, a cache
directory of another layout, a mount killed while it writes the tier. Each gives zero wrong
bytes and a working mount after the next mount (a full cache disk: test_crash_and_disk.py)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from pffs.cache.disklayout import INDEX, LAYOUT, mark
from pffs.cache.entries import ALIGN
from tests.conftest import NO_FREE_FLOOR, mounted, run_pffs, unmount_quietly
from tests.mount.test_crash_and_disk import daemon_pid, kill_daemon

pytestmark = [pytest.mark.mount]
MIB = 1 << 20
# No free-space floor: on a shared machine's nearly full disk the tier would otherwise write
# nothing, and these tests are about what it wrote.


def metric(mnt: Path, name: str) -> float:
    """A counter of the mount's `.pffs/stats`, summed over its samples."""
    samples = json.loads((mnt / ".pffs" / "stats").read_text())["metrics"][name]["samples"]
    return float(sum(sample["value"] for sample in samples))


def entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.val"))


def source_with(tmp_path: Path, size: int) -> tuple[str, bytes]:
    """A local source holding `data.bin` of `size` random bytes (4 MiB blocks: size / 4 MiB
    entries)."""
    source = tmp_path / "source"
    source.mkdir()
    data = random.Random(size).randbytes(size)
    (source / "data.bin").write_bytes(data)
    return f"file://{source}", data


def test_entries_damaged_by_hand_are_fetched_again(tmp_path: Path) -> None:
    source, data = source_with(tmp_path, 16 * MIB)
    cache = tmp_path / "cache"
    options = ("--cache-dir", str(cache), *NO_FREE_FLOOR)
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        assert (mnt / "data.bin").read_bytes() == data
    damaged = entries(cache)
    assert len(damaged) == 4
    os.truncate(damaged[0], damaged[0].stat().st_size // 2)  # cut short
    with damaged[1].open("r+b") as f:  # the payload overwritten, the header intact
        f.seek(ALIGN + 12345)
        f.write(os.urandom(4096))
    damaged[2].write_bytes(os.urandom(damaged[2].stat().st_size))  # all of it
    with damaged[3].open("r+b") as f:  # one bit of the last chunk flipped
        f.seek(damaged[3].stat().st_size - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last[0] ^ 1]))
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        with open(mnt / "data.bin", "rb") as f:  # random reads first, then the whole file
            for offset in (5 * MIB + 7, 9 * MIB, 13 * MIB + 4095, 100):
                f.seek(offset)
                assert f.read(8192) == data[offset : offset + 8192]
        assert (mnt / "data.bin").read_bytes() == data
        assert metric(mnt, "pffs_cache_disk_corrupt_total") >= 3  # each damaged entry found out
    # Fetched again and written anew: the next mount reads them all from the disk tier.
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        assert (mnt / "data.bin").read_bytes() == data
        assert metric(mnt, "pffs_cache_disk_corrupt_total") == 0


@pytest.mark.parametrize("how", ["older entries", "another layout"])
def test_a_cache_directory_of_another_layout_is_cleared_with_one_log_line(
    tmp_path: Path, how: str
) -> None:
    source, data = source_with(tmp_path, 8 * MIB)
    cache = tmp_path / "cache"
    options = ("--cache-dir", str(cache), *NO_FREE_FLOOR)
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        assert (mnt / "data.bin").read_bytes() == data
    if how == "older entries":  # written by a pffs before the mark, in the older format
        mark(str(cache / INDEX), 0)
        for entry in entries(cache):
            with entry.open("r+b") as f:
                f.write(b"PFB2")
    else:
        mark(str(cache / INDEX), LAYOUT + 1)
    log_file = tmp_path / "mnt.log"
    log_file.unlink()
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        assert (mnt / "data.bin").read_bytes() == data
        assert metric(mnt, "pffs_cache_disk_corrupt_total") == 0  # nothing was read from it
    lines = log_file.read_text().splitlines()
    assert len([line for line in lines if "another layout" in line]) == 1, lines
    assert not [line for line in lines if "dropping corrupt" in line]
    with mounted(source, tmp_path / "mnt", *options) as mnt:  # the tier works as before
        assert (mnt / "data.bin").read_bytes() == data
        assert metric(mnt, "pffs_cache_disk_corrupt_total") == 0


def test_a_mount_killed_while_it_writes_the_tier_serves_the_same_bytes_after(
    tmp_path: Path,
) -> None:
    """SIGKILL while blocks are being written behind a large read: whatever reached the disk
    is either whole and indexed, or never served."""
    source, data = source_with(tmp_path, 64 * MIB)
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    mnt.mkdir()
    args = ("mount", source, str(mnt), "--cache-dir", str(cache), *NO_FREE_FLOOR)
    first = run_pffs(*args, "--log-file", str(tmp_path / "first.log"))
    assert first.returncode == 0, first.stderr
    try:
        with open(mnt / "data.bin", "rb") as f:
            assert f.read(40 * MIB) == data[: 40 * MIB]  # the tier is still writing behind
        kill_daemon(daemon_pid(first.stdout), mnt)
    finally:
        run_pffs("umount", str(mnt))
        unmount_quietly(mnt)
    with mounted(source, mnt, "--cache-dir", str(cache), *NO_FREE_FLOOR) as again:
        assert (again / "data.bin").read_bytes() == data
        assert metric(again, "pffs_cache_disk_corrupt_total") == 0

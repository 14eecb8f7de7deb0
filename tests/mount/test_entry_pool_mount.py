"""Entry files created ahead (pffs.cache.entrypool), through a real mount: the mount fills the
pool as it starts, a cold read's blocks go into those files rather than new ones, and the
unmount leaves no file that no row names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pffs.cache.entrypool import POOL_FILES
from tests.cache.test_disk_batch import _entry_files as entry_files
from tests.cache.test_disk_batch import _rows
from tests.conftest import NO_FREE_FLOOR, mounted
from tests.mount.test_disk_faults import metric, source_with
from tests.waiting import eventually

MIB = 1 << 20


@pytest.mark.mount
def test_a_cold_read_writes_its_blocks_into_files_the_mount_created_ahead(
    tmp_path: Path,
) -> None:
    source, data = source_with(tmp_path, 16 * MIB)  # four blocks of 4 MiB
    cache = tmp_path / "cache"
    with mounted(source, tmp_path / "mnt", "--cache-dir", str(cache), *NO_FREE_FLOOR) as mnt:
        eventually(lambda: len(entry_files(cache)) == POOL_FILES, 30, "the pool filled")
        ahead = entry_files(cache)
        assert all(os.path.getsize(cache / name) == 0 for name in ahead)

        assert (mnt / "data.bin").read_bytes() == data

        writes = lambda: metric(mnt, "pffs_cache_disk_writes_total")  # noqa: E731
        eventually(lambda: writes() >= 4, 30, "the four writes behind")
        rows = set(_rows(cache).values())
        assert len(rows) == 4 and rows <= ahead  # no entry file created in the burst
    assert entry_files(cache) == rows  # the pool's files left with the mount

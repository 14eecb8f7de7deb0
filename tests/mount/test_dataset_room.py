"""A dataset twice the cache, read for two shuffled epochs through a real mount over moto:
the cache keeps a stable subset of it, so epoch 2 takes a substantial share of its bytes from
the cache (counted by the mount's own `.pffs/stats`, not timed), every byte exact, and the
stats show the dataset as not fitting."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import NO_FREE_FLOOR, metric_value, stats_snapshot
from tests.mount.test_remount_epoch import read_epoch

pytestmark = [pytest.mark.mount]

KIB = 1024
FILES = 160  # of 64 KiB: 10 MiB, twice the --cache-size below


def served(mnt: Path) -> tuple[float, float]:
    """(bytes served from memory or disk, bytes served in all) so far."""
    snapshot = stats_snapshot(mnt)
    by_tier = {
        tier: metric_value(snapshot, "pffs_cache_served_bytes_total", tier=tier)
        for tier in ("memory", "disk", "store")
    }
    cached = by_tier["memory"] + by_tier["disk"]
    return cached, cached + by_tier["store"]


def forget_pages(mnt: Path, files: dict[str, bytes]) -> None:
    """Drop the kernel's cached pages of the files, so the next epoch asks the mount."""
    for key in files:
        fd = os.open(mnt / key, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_epoch_two_of_a_dataset_twice_the_cache_comes_from_a_stable_subset(
    s3, bucket: str, mount_s3, tmp_path: Path
) -> None:
    rng = random.Random(31)
    files = {f"train/s{i:04d}.bin": rng.randbytes(64 * KIB) for i in range(FILES)}
    with ThreadPoolExecutor(8) as workers:
        list(workers.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=files[k]), files))
    options = ["--cache-dir", str(tmp_path / "cache"), "--cache-size", "5M", *NO_FREE_FLOOR]
    options += ["--cache-memory", "1M", "--block-size", "64K"]

    with mount_s3(f"s3://{bucket}", *options) as mnt:
        read_epoch(mnt, files, seed=1)
        forget_pages(mnt, files)
        after_one = served(mnt)
        read_epoch(mnt, files, seed=2)
        after_two = served(mnt)
        snapshot = stats_snapshot(mnt)

    share = (after_two[0] - after_one[0]) / (after_two[1] - after_one[1])
    # The room keeps 95% of 5 MiB of 10 MiB (47.5%); cycling through the set keeps ~20%.
    assert share >= 0.35, share
    assert metric_value(snapshot, "pffs_dataset_size_bytes", dataset="/train") == FILES * 64 * KIB
    assert metric_value(snapshot, "pffs_dataset_fits", dataset="/train") == 0
    assert metric_value(snapshot, "pffs_cache_disk_writes_declined_total") > 0

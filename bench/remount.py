"""Training epoch 2 after a remount: what a restarted job (or pod) gets from a node's cache.

A system mounted over a cache directory of its own reads the training set once (the first
epochs, untimed here), is unmounted, then mounted again over the same cache directory (pffs's
disk tier, s3fs's use_cache directory, rclone's VFS cache), the page cache is dropped, and the
training set is read once more in an order of its own: that epoch is the figure.

Both mounts talk to the store through one counting proxy (bench.counting), whose counts
restart at the unmount: the figure comes with every request the remounted system made, from
its mount to its unmount (GET, HEAD, LIST, other). The proxy is in the path of this scenario
only, so no other figure pays for its hop; and it is the same endpoint before and after the
remount, as a restarted job sees it (pffs and rclone key their caches by the store's
endpoint, so a different one would be a different cache).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from bench.counting import KINDS, CountingProxy
from bench.data import Dataset
from bench.epoch import read_epoch
from bench.scenarios import drop_caches
from bench.servers import Server
from bench.systems import System, mount_system, peak_rss_mib, unmount

FILL_SEED, REMOUNT_SEED = 1, 3  # the remounted epoch reads in an order of its own


def remount_epoch(
    system: System, server: Server, data: Dataset, workdir: str
) -> tuple[dict[str, float | str], list[float]]:
    """Fill a cache, remount over it, read the training set; figures, and the peak RSS (MiB)
    of each mount process."""
    base = tempfile.mkdtemp(prefix=f"{system.name}-remount-", dir=workdir)
    mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
    os.makedirs(mountpoint)
    os.makedirs(cache)
    proxy = CountingProxy(server)
    results: dict[str, float | str] = {}
    peaks: list[float] = []
    keys, size = data.epoch_keys, data.sizes.epoch_size
    try:
        pid = mount_system(system, proxy.server, data.bucket, mountpoint, cache)
        try:
            read_epoch(mountpoint, keys, size, seed=FILL_SEED)
            if (peak := peak_rss_mib(pid)) is not None:
                peaks.append(peak)
        finally:
            unmount(mountpoint)
        proxy.restart_count()
        drop_caches()
        pid = mount_system(system, proxy.server, data.bucket, mountpoint, cache)
        try:
            drop_caches()
            files_per_s = read_epoch(mountpoint, keys, size, seed=REMOUNT_SEED)
            results["epoch2_remount_files_per_s"] = round(files_per_s, 3)
            if (peak := peak_rss_mib(pid)) is not None:
                peaks.append(peak)
        finally:
            unmount(mountpoint)
    finally:
        counts = proxy.stop()
        shutil.rmtree(base, ignore_errors=True)
    results["epoch2_remount_requests"] = sum(counts.values())
    results["epoch2_remount_requests_by_kind"] = describe(counts)
    return results, peaks


def describe(counts: dict[str, int]) -> str:
    """{"GET": 3, "HEAD": 0, ...} -> "GET 3, HEAD 0, LIST 1, OTHER 0"."""
    return ", ".join(f"{kind} {counts.get(kind, 0)}" for kind in KINDS)

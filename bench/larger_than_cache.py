"""A dataset twice the cache: epoch 2's share of bytes served from the cache.

pffs is mounted over a cache directory of its own with a disk tier half the dataset's size
(`--cache-size 256M --cache-memory 64M` for 1,000 files of 512 KiB; a tenth of that with
--quick) and reads the dataset for two epochs, each shuffled in an order of its own by 8
threads (bench.epoch), the page cache dropped between them. The figure is the share of the
bytes pffs served in epoch 2 that came from its memory or disk tier, from its own counters
(`.pffs/stats`: pffs_cache_served_bytes_total by tier), not from timing. A cache that cycles
through the set under shuffled epochs keeps 13-21% of it; one that keeps a stable subset
(pffs.cache.datasetroom) about its share of the set (docs/notes/dataset-larger-than-cache.md).

Only pffs is measured: its counters say where each byte came from, and s3fs's cache has no
size bound to set, so the same scenario cannot be posed to it.

The files live under `larger/` in the bench bucket, uploaded by the first run on a server.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

from bench.data import Dataset, client
from bench.epoch import read_epoch
from bench.scenarios import drop_caches
from bench.servers import Server
from bench.systems import Pffs, unmount

FILE_SIZE = 512 * 1024
# (files, --cache-size, --cache-memory): the dataset twice the disk tier.
FULL = (1000, "256M", "64M")
QUICK = (100, "25M", "8M")
PREFIX = "larger"


def keys(files: int) -> list[str]:
    return [f"{PREFIX}/s{i:05d}.bin" for i in range(files)]


def upload(server: Server, data: Dataset, files: int) -> list[str]:
    """The scenario's files in the bucket (uploaded unless all are there already)."""
    s3 = client(server)
    names = keys(files)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=data.bucket, Prefix=f"{PREFIX}/")
    present = {item["Key"] for page in pages for item in page.get("Contents", [])}
    missing = [name for name in names if name not in present]
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda k: s3.put_object(Bucket=data.bucket, Key=k, Body=os.urandom(FILE_SIZE)),
                missing,
            )
        )
    return names


def served(mountpoint: str) -> tuple[float, float]:
    """(bytes served from memory or disk, bytes served in all), from the mount's stats."""
    with open(os.path.join(mountpoint, ".pffs", "stats"), "rb") as f:
        samples = json.load(f)["metrics"]["pffs_cache_served_bytes_total"]["samples"]
    by_tier = {s["labels"]["tier"]: float(s["value"]) for s in samples}
    cached = by_tier.get("memory", 0.0) + by_tier.get("disk", 0.0)
    return cached, cached + by_tier.get("store", 0.0)


def epoch2_cached_share(
    pffs: Pffs, server: Server, data: Dataset, workdir: str, quick: bool
) -> float:
    """Mount with a cache half the dataset, read two shuffled epochs; epoch 2's share of
    bytes from the cache, in percent."""
    files, cache_size, cache_memory = QUICK if quick else FULL
    names = upload(server, data, files)
    base = tempfile.mkdtemp(prefix="pffs-larger-", dir=workdir)
    mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
    os.makedirs(mountpoint)
    os.makedirs(cache)
    sized = Pffs([*pffs.options, "--cache-size", cache_size, "--cache-memory", cache_memory])
    try:
        sized.mount(server, data.bucket, mountpoint, cache)
        try:
            read_epoch(mountpoint, names, FILE_SIZE, seed=1)
            drop_caches()
            before = served(mountpoint)
            read_epoch(mountpoint, names, FILE_SIZE, seed=2)
            after = served(mountpoint)
        finally:
            unmount(mountpoint)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    total = after[1] - before[1]
    if total <= 0:
        raise RuntimeError("the mount served no bytes in epoch 2 (the page cache did)")
    return 100 * (after[0] - before[0]) / total

"""The block cache through real mounts over a real moto server: persistence, warmup, admin."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import boto3
import pytest

from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer
from tests.conftest import NO_FREE_FLOOR, mounted, run_pffs

pytestmark = [pytest.mark.mount]
MIB = 1 << 20


def drop_page_cache() -> None:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass  # not root: keep_cache is off for a new mount anyway


def test_remounted_warm_read_makes_no_data_requests(counted: MotoServer, tmp_path: Path) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="data")
    data = os.urandom(64 * MIB)  # 16 blocks
    s3.put_object(Bucket="data", Key="big.bin", Body=data)
    cache = ("--cache-dir", str(tmp_path / "cache"), *NO_FREE_FLOOR)  # whatever the disk's room
    options = ("--endpoint-url", counted.endpoint_url, *cache)
    with mounted("s3://data", tmp_path / "mnt", *options) as mnt:
        assert (mnt / "big.bin").read_bytes() == data
    cold_gets = counted.requests("GET", "/data/big.bin")
    # Ranged GETs of at most 16 MiB (readahead asks for consecutive 4 MiB blocks together),
    # never more than one per block (a few retried at most): no block is fetched twice.
    assert 64 // 16 <= cold_gets <= 16 + 6
    drop_page_cache()
    with mounted("s3://data", tmp_path / "mnt", *options) as mnt:
        assert (mnt / "big.bin").read_bytes() == data
    assert counted.requests("GET", "/data/big.bin") == cold_gets  # zero GETs for data


def test_readers_streaming_at_once_get_exact_bytes_each_block_once(
    counted: MotoServer, tmp_path: Path
) -> None:
    """Four readers stream four files at once (the shards pattern; one reads in 8 MiB reads,
    as a checkpoint load does): each is paced on its own within its share of the prefetch
    budget, every byte is the store's, and no block is fetched twice. How the windows split
    into GETs follows the budget's room at each moment (a loaded machine makes more, smaller
    runs): the bytes are the check, counted at the store's door."""
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="shards")
    bodies = {f"s{i}.tar": os.urandom(24 * MIB + i * 12345) for i in range(4)}
    for key, body in bodies.items():
        s3.put_object(Bucket="shards", Key=key, Body=body)
    cache = ("--cache-dir", str(tmp_path / "cache"), *NO_FREE_FLOOR)  # whatever the disk's room
    read: dict[str, bytes] = {}

    def stream(key: str, chunk: int) -> None:
        pieces = []
        with open(mnt / key, "rb", buffering=0) as f:
            while piece := f.read(chunk):
                pieces.append(piece)
        read[key] = b"".join(pieces)

    with FaultProxy(counted.port) as store:  # no faults: it counts the bytes of object GETs
        options = ("--endpoint-url", store.endpoint_url, *cache)
        with mounted("s3://shards", tmp_path / "mnt", *options) as mnt:
            readers = [
                threading.Thread(target=stream, args=(key, 8 * MIB if n == 0 else MIB))
                for n, key in enumerate(bodies)
            ]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
        fetched = store.body_bytes
    for key, body in bodies.items():
        assert read[key] == body, key
    # Each block once: the files' bytes, and at most one block more (a retry's).
    size = sum(len(body) for body in bodies.values())
    assert size <= fetched <= size + 4 * MIB, (fetched, size)


def test_warmup_fills_the_cache_a_mount_then_uses(counted: MotoServer, tmp_path: Path) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="dset")
    rng = random.Random(1)
    files = {f"train/{i:02d}.bin": rng.randbytes(rng.randrange(1, 3 * MIB)) for i in range(20)}
    for key, body in files.items():
        s3.put_object(Bucket="dset", Key=key, Body=body)
    cache_dir = str(tmp_path / "cache")
    options = ("--endpoint-url", counted.endpoint_url, "--cache-dir", cache_dir, *NO_FREE_FLOOR)
    with mounted("s3://dset", tmp_path / "mnt", *options) as mnt:
        first = run_pffs("warmup", str(mnt / "train"))
        assert first.returncode == 0, first.stderr
        assert "20 files" in first.stdout and "0.0 MiB already cached" in first.stdout
        again = run_pffs("warmup", str(mnt / "train"))
        assert again.returncode == 0 and " 0.0 MiB fetched" in again.stdout, again.stdout
        gets = sum(counted.requests("GET", f"/dset/{key}") for key in files)
        for key, body in files.items():
            assert (mnt / key).read_bytes() == body
        assert sum(counted.requests("GET", f"/dset/{key}") for key in files) == gets
    info = run_pffs("cache", "info", "--cache-dir", cache_dir)
    assert info.returncode == 0 and "s3://dset@" in info.stdout and "20 blocks" in info.stdout
    cleared = run_pffs("cache", "clear", "--cache-dir", cache_dir)
    assert cleared.returncode == 0 and "removed 20" in cleared.stdout
    assert "0 blocks" in run_pffs("cache", "info", "--cache-dir", cache_dir).stdout


def test_warmup_of_a_source_url(counted: MotoServer, tmp_path: Path) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="urls")
    s3.put_object(Bucket="urls", Key="a/b.bin", Body=os.urandom(5 * MIB))
    listing = tmp_path / "list.txt"
    listing.write_text("s3://urls/a\n")
    cache_dir = str(tmp_path / "cache")
    args = ("--endpoint-url", counted.endpoint_url, "--cache-dir", cache_dir, *NO_FREE_FLOOR)
    result = run_pffs("warmup", "--list", str(listing), *args)
    assert result.returncode == 0, result.stderr
    assert "1 files" in result.stdout and "5.0 MiB fetched" in result.stdout
    bad = run_pffs("warmup", str(tmp_path))
    assert bad.returncode == 2 and "not inside a pffs mount" in bad.stderr

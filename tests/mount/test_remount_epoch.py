"""A training set's second epoch after a remount, through real mounts over a real moto server:
served from the disk tier with no GET of its bytes, and named with a listing, not a HEAD a file."""

from __future__ import annotations

import random
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest

from pffs.testing.servers import MotoServer
from tests.conftest import NO_FREE_FLOOR, mounted
from tests.mount.test_cache_mount import drop_page_cache

pytestmark = [pytest.mark.mount]

# werkzeug's access log line; it may colour the quoted request.
REQUEST = re.compile(r'"(?:\x1b\[[\d;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/')


def requests_by_kind(access_log: str, bucket: str) -> Counter[str]:
    """The server's requests for `bucket` so far: LIST, and GET and HEAD of objects."""
    kinds: Counter[str] = Counter()
    with open(access_log, encoding="utf-8", errors="replace") as f:
        for match in REQUEST.finditer(f.read()):
            method, target = match.groups()
            path, _, query = target.partition("?")
            if not path.lstrip("/").startswith(bucket):
                continue
            on_bucket = path.rstrip("/") == f"/{bucket}"
            if method == "GET" and (on_bucket or "list-type" in query):
                kinds["LIST"] += 1
            else:  # the mount's preflight HEAD of the bucket is not a HEAD of an object
                kinds[f"{method} bucket" if on_bucket else method] += 1
    return kinds


def read_epoch(root: Path, files: dict[str, bytes], seed: int) -> None:
    """Every file whole, in a shuffled order, by 8 threads: a data loader's workers."""
    order = sorted(files)
    random.Random(seed).shuffle(order)
    with ThreadPoolExecutor(8) as workers:
        bodies = workers.map(lambda key: (root / key).read_bytes(), order)
        for key, body in zip(order, bodies, strict=True):
            assert body == files[key], key


def test_a_remounted_second_epoch_fetches_no_bytes_and_asks_no_heads(
    counted: MotoServer, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="train")
    rng = random.Random(7)
    files = {f"images/{i:03d}.jpg": rng.randbytes(rng.randrange(1, 60_000)) for i in range(300)}
    with ThreadPoolExecutor(8) as workers:
        list(workers.map(lambda k: s3.put_object(Bucket="train", Key=k, Body=files[k]), files))
    cache = ("--cache-dir", str(tmp_path / "cache"), *NO_FREE_FLOOR)  # whatever the disk's room
    options = ("--endpoint-url", counted.endpoint_url, *cache)
    assert counted.access_log is not None

    with mounted("s3://train", tmp_path / "mnt", *options) as mnt:
        read_epoch(mnt, files, seed=1)
    first = requests_by_kind(counted.access_log, "train")
    assert first["GET"] >= len(files)  # the first epoch fetched every file

    drop_page_cache()
    with mounted("s3://train", tmp_path / "mnt", *options) as mnt:
        read_epoch(mnt, files, seed=2)
    second = requests_by_kind(counted.access_log, "train") - first
    assert second["GET"] == 0, second  # every byte from the disk tier
    assert second["HEAD"] == 0, second  # every name from a listing
    # The mount's preflight (one key), the root (to find `images`) and `images`: a page each;
    # and a page of what lies under the root and under `images` at every depth, each given up
    # (the tree holds more).
    assert second["LIST"] <= 5, second

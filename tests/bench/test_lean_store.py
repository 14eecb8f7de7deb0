"""bench.probes.lean_store, the probe's stand-in store: s3rver's directory served read-only.
boto3 over real HTTP to its process: listings (v1 and v2, folded by a delimiter, in pages), HEAD,
whole and ranged GETs, and what it refuses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from bench.probes.lean_store import OBJECT_SUFFIX, byte_range

BODIES = {
    "train/a.bin": os.urandom(3 * 1024 * 1024 + 17),
    "train/b.bin": b"b" * 1000,
    "train/sub/c.bin": b"c" * 10,
    "top.txt": b"",
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = tmp_path_factory.mktemp("s3rver")
    for key, body in BODIES.items():  # as s3rver 3 writes an object and its MD5
        path = root / "bucket" / (key + OBJECT_SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        Path(str(path) + ".md5").write_text(hashlib.md5(body).hexdigest())
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.probes.lean_store", "--root", str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="any",
            aws_secret_access_key="any",
            region_name="us-east-1",
        )
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_listings_fold_by_delimiter_and_page(s3) -> None:
    page = s3.list_objects_v2(Bucket="bucket", Prefix="train/", Delimiter="/")
    assert [o["Key"] for o in page["Contents"]] == ["train/a.bin", "train/b.bin"]
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["train/sub/"]
    assert page["Contents"][1]["Size"] == 1000
    assert page["Contents"][1]["ETag"] == f'"{hashlib.md5(BODIES["train/b.bin"]).hexdigest()}"'
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket="bucket", PaginationConfig={"PageSize": 3}
    )
    assert [o["Key"] for p in pages for o in p["Contents"]] == sorted(BODIES)
    v1 = s3.get_paginator("list_objects").paginate(
        Bucket="bucket", PaginationConfig={"PageSize": 1}
    )
    assert [o["Key"] for p in v1 for o in p["Contents"]] == sorted(BODIES)


def test_objects_whole_ranged_and_headed(s3) -> None:
    body = BODIES["train/a.bin"]
    assert s3.get_object(Bucket="bucket", Key="train/a.bin")["Body"].read() == body
    part = s3.get_object(Bucket="bucket", Key="train/a.bin", Range="bytes=1048570-2097160")
    assert part["Body"].read() == body[1048570:2097161]
    assert part["ContentRange"] == f"bytes 1048570-2097160/{len(body)}"
    tail = s3.get_object(Bucket="bucket", Key="train/a.bin", Range="bytes=-5")["Body"].read()
    assert tail == body[-5:]
    assert s3.head_object(Bucket="bucket", Key="train/a.bin")["ContentLength"] == len(body)
    assert s3.get_object(Bucket="bucket", Key="top.txt")["Body"].read() == b""


def test_what_it_does_not_serve(s3) -> None:
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchKey"):
        s3.get_object(Bucket="bucket", Key="train/missing")
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        s3.list_objects_v2(Bucket="other")
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidRange"):
        s3.get_object(Bucket="bucket", Key="train/b.bin", Range="bytes=5000-")
    with pytest.raises(botocore.exceptions.ClientError, match="NotImplemented"):
        s3.put_object(Bucket="bucket", Key="new", Body=b"x")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", (0, 9)),
        ("bytes=90-200", (90, 99)),
        ("bytes=95-", (95, 99)),
        ("bytes=-10", (90, 99)),
        ("bytes=100-", None),
        ("bytes=5-2", None),
        ("bytes=0-1,4-5", None),
        ("items=0-1", None),
        ("bytes=x-1", None),
    ],
)
def test_byte_ranges(header: str, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, 100) == expected

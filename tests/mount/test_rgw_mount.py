"""Real mounts of a bucket on Ceph's RADOS Gateway (the session's one-node cluster): reads,
writes, the errors of a bad source and the gateway killed under a reader.

What RGW does otherwise than AWS S3 and how pffs copes is in tests/backends/
test_rgw_differences.py; here the same differences are crossed through the kernel: objects
uploaded in parts (ETags that are no MD5, and none in the completion's answer) keep their
cache keys across a remount and pin an open file's version; a file written in parts reads back.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import time
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from pffs.testing.rgw import RgwCluster
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.mount.test_cli_errors import assert_one_line_error
from tests.mount.test_reliability import errno_of, read_when_back

pytestmark = pytest.mark.mount
MIB = 1 << 20
# boto3 uploads above 8 MiB in 8 MiB parts: a 20 MiB object has three, and an ETag "...-3".
IN_PARTS = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB)
REQUEST, RETRY = 1.0, 3.0
FAST = ("--request-timeout", f"{REQUEST:g}", "--connect-timeout", "1")


def _mount(rgw: RgwCluster, bucket: str, mnt: Path, *options: str):
    return mounted(f"s3://{bucket}", mnt, "--endpoint-url", rgw.endpoint, *options)


def _upload(s3, bucket: str, key: str, data: bytes) -> str:
    """Put `data` (in parts when above 8 MiB); its ETag."""
    path = Path(f"/tmp/pffs-rgw-upload-{os.getpid()}-{threading.get_ident()}")
    path.write_bytes(data)
    try:
        s3.upload_file(str(path), bucket, key, Config=IN_PARTS)
    finally:
        path.unlink()
    return str(s3.head_object(Bucket=bucket, Key=key)["ETag"])


def _gets(mnt: Path) -> float:
    return metric_value(stats_snapshot(mnt), "pffs_backend_requests_total", request="GET")


def test_reads(rgw: RgwCluster, rgw_s3, rgw_bucket: str, tmp_path: Path) -> None:
    rng = random.Random(38)
    tree = {
        "a.txt": b"hello rgw\n",
        "dir/b.bin": rng.randbytes(3 * MIB + 5),
        "dir/sub/c": b"c",
        "parts.bin": rng.randbytes(20 * MIB + 7),
    }
    etags = {key: _upload(rgw_s3, rgw_bucket, key, data) for key, data in tree.items()}
    assert etags["parts.bin"].endswith('-3"')  # no MD5 of the content
    rgw_s3.put_object(Bucket=rgw_bucket, Key="empty-dir/", Body=b"")
    cache = tmp_path / "cache"
    options = ("--cache-dir", str(cache), "--block-size", "1M", "--metadata-ttl", "1")
    with _mount(rgw, rgw_bucket, tmp_path / "mnt", *options) as mnt:
        assert sorted(os.listdir(mnt)) == ["a.txt", "dir", "empty-dir", "parts.bin"]
        assert sorted(os.listdir(mnt / "dir")) == ["b.bin", "sub"]
        assert os.listdir(mnt / "empty-dir") == []
        for key, data in tree.items():
            assert (mnt / key).stat().st_size == len(data)
            assert (
                hashlib.sha256((mnt / key).read_bytes()).digest() == hashlib.sha256(data).digest()
            )
        with open(mnt / "parts.bin", "rb") as f:
            f.seek(9 * MIB - 3)
            assert f.read(100) == tree["parts.bin"][9 * MIB - 3 : 9 * MIB + 97]
        assert _gets(mnt) > 0

    # The blocks of the object in parts were cached under its ETag: a remount serves it all
    # from the disk cache, no GET.
    with _mount(rgw, rgw_bucket, tmp_path / "again", *options) as mnt:
        assert (mnt / "parts.bin").read_bytes() == tree["parts.bin"]
        assert _gets(mnt) == 0

    # An open file is pinned to the version it opened: the object replaced behind the mount
    # (in parts again), a block still to fetch is refused (If-Match on the part ETag), never
    # taken from the new version; a new open after the TTL reads the new version.
    new = rng.randbytes(20 * MIB + 7)
    no_cache = ("--cache-dir", "none", "--block-size", "1M", "--metadata-ttl", "1")
    with _mount(rgw, rgw_bucket, tmp_path / "pinned", *no_cache, "--readahead-max", "0") as mnt:
        with open(mnt / "parts.bin", "rb") as f:
            assert f.read(MIB) == tree["parts.bin"][:MIB]
            assert _upload(rgw_s3, rgw_bucket, "parts.bin", new) != etags["parts.bin"]
            f.seek(15 * MIB)
            try:
                got = f.read(MIB)
            except OSError as exc:
                assert exc.errno in (errno.EIO, errno.ESTALE), exc
            else:
                assert got == tree["parts.bin"][15 * MIB : 16 * MIB]
        time.sleep(1.5)
        assert (mnt / "parts.bin").read_bytes() == new


def test_writes(rgw: RgwCluster, rgw_s3, rgw_bucket: str, tmp_path: Path) -> None:
    rng = random.Random(16)
    big = rng.randbytes(20 * MIB + 3)  # above 16 MiB: uploaded in parts
    with _mount(rgw, rgw_bucket, tmp_path / "mnt") as mnt:
        (mnt / "new.txt").write_bytes(b"first")
        assert _object(rgw_s3, rgw_bucket, "new.txt") == b"first"
        (mnt / "new.txt").write_bytes(b"second, longer")  # overwrite
        assert _object(rgw_s3, rgw_bucket, "new.txt") == b"second, longer"
        os.rename(mnt / "new.txt", mnt / "renamed.txt")
        assert _object(rgw_s3, rgw_bucket, "renamed.txt") == b"second, longer"
        assert _missing(rgw_s3, rgw_bucket, "new.txt")
        os.mkdir(mnt / "d")
        with open(mnt / "d" / "big.bin", "wb") as f:
            f.write(big[: 10 * MIB])
            f.flush()
            os.fsync(f.fileno())
            f.write(big[10 * MIB :])
            f.flush()
            os.fsync(f.fileno())
            assert _object(rgw_s3, rgw_bucket, "d/big.bin") == big  # durable at fsync
        head = rgw_s3.head_object(Bucket=rgw_bucket, Key="d/big.bin")
        assert head["ETag"].rstrip('"').rsplit("-", 1)[-1].isdigit()  # uploaded in parts
        assert (mnt / "d" / "big.bin").read_bytes() == big
        os.remove(mnt / "renamed.txt")
        assert _missing(rgw_s3, rgw_bucket, "renamed.txt")
        assert sorted(os.listdir(mnt)) == ["d"]


def _object(s3, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _missing(s3, bucket: str, key: str) -> bool:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return key not in [entry["Key"] for entry in listed]


def test_missing_bucket_and_wrong_keys_as_against_moto(rgw: RgwCluster, tmp_path: Path) -> None:
    """The same exit codes and lines as tests/mount/test_cli_errors.py's against moto."""
    empty = tmp_path / "mnt"
    empty.mkdir()
    args = ("mount", "s3://no-such-bucket", str(empty), "--endpoint-url", rgw.endpoint)
    assert_one_line_error(args, 3, "bucket 'no-such-bucket' at http://127.0.0.1")
    wrong = {**os.environ, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    args = ("mount", "s3://some-bucket", str(empty), "--endpoint-url", rgw.endpoint)
    assert_one_line_error(args, 4, "denied", env=wrong)


def test_gateway_killed_under_a_reader(rgw: RgwCluster, rgw_s3, rgw_bucket: str, tmp_path) -> None:
    """The gateway killed while a file streams: EIO within --retry-timeout and one
    --request-timeout, then, the gateway back, the source breaker's probe finds it and the
    same file reads exact without a remount."""
    data = random.Random(5).randbytes(48 * MIB)
    rgw_s3.put_object(Bucket=rgw_bucket, Key="stream.bin", Body=data)
    options = (*FAST, "--retry-timeout", f"{RETRY:g}", "--cache-dir", "none", "--block-size", "1M")
    try:
        with _mount(rgw, rgw_bucket, tmp_path / "mnt", *options) as mnt:
            with open(mnt / "stream.bin", "rb") as f:
                assert f.read(MIB) == data[:MIB]
                rgw.kill_gateway()
                code, took = errno_of(lambda: f.read())
            assert code == errno.EIO, code
            assert took < RETRY + REQUEST + 10, f"EIO after {took:.1f}s"  # a hang: never
            rgw.start_gateway()
            assert read_when_back(mnt / "stream.bin", within=15) == data
    finally:
        if "rgw" not in rgw.pids():  # the session's other tests need their gateway
            rgw.start_gateway()

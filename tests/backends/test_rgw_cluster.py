"""The one-node Ceph of pffs.testing.rgw serves S3: a bucket, a PUT, a ranged GET, a user of
its own; and a cluster stopped leaves neither a daemon nor its directory behind."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path

import boto3
import pytest

from pffs.testing.rgw import RgwCluster, RgwUnavailable


def client(rgw: RgwCluster, keys: tuple[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=rgw.endpoint,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        region_name="us-east-1",
    )


def test_bucket_put_and_ranged_get(rgw: RgwCluster) -> None:
    s3 = client(rgw, rgw.admin_keys)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    body = os.urandom(100_000)
    s3.put_object(Bucket=bucket, Key="dir/obj", Body=body)
    got = s3.get_object(Bucket=bucket, Key="dir/obj", Range="bytes=1000-1999")
    assert got["ContentRange"] == f"bytes 1000-1999/{len(body)}"
    assert got["Body"].read() == body[1000:2000]


def test_a_created_user_has_keys_of_its_own(rgw: RgwCluster) -> None:
    keys = rgw.create_user(f"u-{uuid.uuid4().hex[:8]}")
    assert keys != rgw.admin_keys
    s3 = client(rgw, keys)
    assert s3.list_buckets()["Buckets"] == []  # the admin's buckets are not this user's
    wrong = client(rgw, (keys[0], "not-the-secret"))
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        wrong.list_buckets()


def test_an_unknown_objectstore_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="objectstore 'filestore'"):
        RgwCluster.start(tmp_path / "c", objectstore="filestore")
    assert not (tmp_path / "c").exists()


def test_missing_ceph_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no Ceph command on it
    with pytest.raises(RgwUnavailable, match=r"Ceph is not installed.*apt-get install"):
        RgwCluster.start(tmp_path / "c")


def test_a_cluster_that_does_not_come_up_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    """The gateway's port taken: the gateway cannot listen, the start says so, and every daemon
    it had started (monitor, OSD) is killed and the directory removed."""
    started: list[subprocess.Popen[bytes]] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RgwUnavailable, match=r"rgw exited|did not answer") as caught:
            RgwCluster.start(tmp_path / "c", port=port, on_spawn=started.append).stop()
    assert "\n" not in str(caught.value)
    assert len(started) == 3  # mon, osd, gateway
    assert all(proc.poll() is not None for proc in started)
    assert not (tmp_path / "c").exists()

"""The one-node Ceph of pffs.testing.rgw serves S3: a bucket, a PUT, a ranged GET, a user of
its own; and a cluster stopped, or whose holder is killed, leaves no daemon behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest

from pffs.testing.rgw import RgwCluster, RgwUnavailable, missing_binaries
from tests.processes import marked_processes

MARK = "PFFS_RGW_HOLDER_TEST"
# A process holding a cluster: starts it, writes its daemons' pids, then waits to be killed.
HOLDER = """
import json, os, sys, time
from pathlib import Path
from pffs.testing.rgw import RgwCluster
cluster = RgwCluster.start(Path(sys.argv[1]))
Path(sys.argv[2] + ".tmp").write_text(json.dumps(cluster.pids()))
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(3600)
"""


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


@pytest.mark.slow  # a monitor and an OSD start before the gateway fails
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


@pytest.mark.slow  # a cluster of its own
def test_a_killed_holder_takes_every_daemon_with_it(tmp_path: Path) -> None:
    """SIGKILL of the process holding a cluster, which no `finally` sees: its monitor, OSD and
    gateway die with it (each is marked, so found in /proc whatever became of it)."""
    if missing_binaries():
        pytest.skip(f"Ceph is not installed ({', '.join(missing_binaries())} missing)")
    token = uuid.uuid4().hex
    pids_file, log = tmp_path / "pids.json", tmp_path / "holder.log"
    argv = [sys.executable, "-c", HOLDER, str(tmp_path / "c"), str(pids_file)]
    with open(log, "wb") as out:
        holder = subprocess.Popen(argv, env={**os.environ, MARK: token}, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 180  # the start's own bound (90 s) and its commands
        while not pids_file.exists():
            assert holder.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the cluster never came up"
            time.sleep(0.2)
        daemons = json.loads(pids_file.read_text())
        assert sorted(daemons) == ["mon.a", "osd.0", "rgw"]
        assert set(daemons.values()) <= set(marked_processes(MARK, token))

        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 30  # the kernel's signal, then each daemon's exit
        while marked_processes(MARK, token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked_processes(MARK, token) == {}
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for pid in marked_processes(MARK, token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

"""Writes through real mounts over a real moto S3 server: bytes in the store, errno, durability."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest

from pffs.mounting.kernel import find_mount, wait_unmounted
from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer
from tests.conftest import mounted, run_pffs, unmount_quietly

pytestmark = [pytest.mark.mount]

MIB = 1 << 20


def stored(s3: Any, bucket: str, key: str) -> bytes:
    body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def write_file(path: Path, data: bytes, chunk: int = 1 << 20) -> None:
    with open(path, "wb") as f:
        for start in range(0, len(data), chunk):
            f.write(data[start : start + chunk])


@pytest.mark.parametrize("size", [0, 1, 5 * MIB + 1, 100 * MIB])
def test_new_files_reach_the_store(s3, bucket, mount_s3, size: int) -> None:
    data = random.Random(size).randbytes(size)
    with mount_s3(f"s3://{bucket}") as mnt:
        write_file(mnt / "new.bin", data)
        # Read-after-write through the mount: stat, listing and bytes show the new object.
        assert (mnt / "new.bin").stat().st_size == size
        assert "new.bin" in os.listdir(mnt)
        assert (mnt / "new.bin").read_bytes() == data
    assert stored(s3, bucket, "new.bin") == data


def test_overwrite_append_truncate_and_random_writes(s3, bucket, mount_s3) -> None:
    rng = random.Random(5)
    original = rng.randbytes(3 * MIB + 17)
    s3.put_object(Bucket=bucket, Key="d/f.bin", Body=original)
    with mount_s3(f"s3://{bucket}") as mnt:
        path = mnt / "d/f.bin"
        assert path.read_bytes() == original  # cached blocks of the old version

        with open(path, "ab") as f:  # append
            f.write(b"tail")
        expected = original + b"tail"
        assert stored(s3, bucket, "d/f.bin") == expected
        assert path.read_bytes() == expected  # the cache serves the new version, not the old

        with open(path, "r+b") as f:  # a random write in the middle
            f.seek(MIB + 5)
            f.write(b"X" * 1000)
        expected = expected[: MIB + 5] + b"X" * 1000 + expected[MIB + 5 + 1000 :]
        assert stored(s3, bucket, "d/f.bin") == expected

        os.truncate(path, 100)  # shrink, without an open file
        assert stored(s3, bucket, "d/f.bin") == expected[:100]
        assert path.stat().st_size == 100
        with open(path, "r+b") as f:  # grow through ftruncate on an open file
            f.truncate(5000)
        assert stored(s3, bucket, "d/f.bin") == expected[:100] + bytes(4900)

        write_file(path, b"replaced")  # O_TRUNC overwrite
        assert stored(s3, bucket, "d/f.bin") == b"replaced"
        assert path.read_bytes() == b"replaced"


def test_fsync_returns_after_the_object_exists(s3, bucket, mount_s3) -> None:
    with mount_s3(f"s3://{bucket}") as mnt:
        fd = os.open(mnt / "synced.txt", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"first")
            os.fsync(fd)
            assert stored(s3, bucket, "synced.txt") == b"first"  # still open
            os.write(fd, b" and second")
            os.fsync(fd)
            assert stored(s3, bucket, "synced.txt") == b"first and second"
        finally:
            os.close(fd)


def test_failed_upload_is_eio_and_the_data_stays(tmp_path: Path) -> None:
    """The store goes away between write and fsync: fsync and close fail, nothing is lost."""
    cache = tmp_path / "cache"
    server = MotoServer()
    server.start()
    try:
        s3 = boto3.client("s3", endpoint_url=server.endpoint_url)
        s3.create_bucket(Bucket="doomed")
        mnt = tmp_path / "mnt"
        with mounted(
            "s3://doomed", mnt, "--endpoint-url", server.endpoint_url, "--cache-dir", str(cache)
        ):
            fd = os.open(mnt / "lost.bin", os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, b"precious bytes")
            server.stop()
            with pytest.raises(OSError) as at_fsync:
                os.fsync(fd)
            assert at_fsync.value.errno == errno.EIO
            with pytest.raises(OSError) as at_close:
                os.close(fd)
            assert at_close.value.errno == errno.EIO
            staged = [p for p in (cache / "staging").iterdir() if p.suffix == ".data"]
            assert [p.read_bytes() for p in staged] == [b"precious bytes"]
            log = (tmp_path / "mnt.log").read_text()
            assert str(staged[0]) in log  # the error says where the data is
    finally:
        server.stop()


def test_kill_9_after_close_loses_nothing(s3, bucket, moto, tmp_path: Path) -> None:
    data = random.Random(9).randbytes(20 * MIB)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_pffs("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url)
    assert result.returncode == 0, result.stderr
    try:
        pid = int(result.stdout.split("(pid ")[1].split(",")[0])
        write_file(mnt / "checkpoint.pt", data)
        os.kill(pid, signal.SIGKILL)  # right after close returned
        assert stored(s3, bucket, "checkpoint.pt") == data
    finally:
        unmount_quietly(mnt)
        assert wait_unmounted(str(mnt))


def test_directory_and_name_semantics(s3, bucket, mount_s3) -> None:
    s3.put_object(Bucket=bucket, Key="full/a.txt", Body=b"a")
    s3.put_object(Bucket=bucket, Key="full/sub/b.txt", Body=b"b")

    def fails(errno_value: int, fn: Any, *args: Any) -> None:
        with pytest.raises(OSError) as caught:
            fn(*args)
        assert caught.value.errno == errno_value, (fn, args, caught.value)

    with mount_s3(f"s3://{bucket}") as mnt:
        os.mkdir(mnt / "empty")
        assert s3.head_object(Bucket=bucket, Key="empty/")  # a marker keeps it
        assert (mnt / "empty").is_dir() and os.listdir(mnt / "empty") == []
        fails(errno.EEXIST, os.mkdir, mnt / "empty")
        fails(errno.ENOTEMPTY, os.rmdir, mnt / "full")
        fails(errno.ENOTDIR, os.rmdir, mnt / "full/a.txt")
        fails(errno.EISDIR, os.unlink, mnt / "full")
        fails(errno.ENOENT, os.unlink, mnt / "full/nope")
        fails(errno.ENOENT, os.rmdir, mnt / "nope")
        os.rmdir(mnt / "empty")
        assert not (mnt / "empty").exists()

        os.rename(mnt / "full/a.txt", mnt / "full/renamed.txt")
        assert (mnt / "full/renamed.txt").read_bytes() == b"a"
        assert not (mnt / "full/a.txt").exists()
        assert stored(s3, bucket, "full/renamed.txt") == b"a"

        os.mkdir(mnt / "target")
        (mnt / "target/x").write_bytes(b"x")
        fails(errno.ENOTEMPTY, os.rename, mnt / "full", mnt / "target")
        fails(errno.EISDIR, os.rename, mnt / "full/renamed.txt", mnt / "target")
        os.rename(mnt / "full", mnt / "moved")  # a directory: every object under it
        assert sorted(os.listdir(mnt / "moved")) == ["renamed.txt", "sub"]
        assert (mnt / "moved/sub/b.txt").read_bytes() == b"b"
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
        assert keys == {"moved/renamed.txt", "moved/sub/b.txt", "target/", "target/x"}

        os.unlink(mnt / "target/x")
        assert "target/x" not in {
            o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        }
        fails(errno.ENOTSUP, os.symlink, "x", mnt / "link")


def test_unlink_while_open_does_not_resurrect(s3, bucket, mount_s3) -> None:
    with mount_s3(f"s3://{bucket}") as mnt:
        with open(mnt / "tmp.txt", "wb") as f:
            f.write(b"scratch")
            f.flush()
            os.unlink(mnt / "tmp.txt")
            f.write(b" more")
        assert not (mnt / "tmp.txt").exists()
        assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_read_only_mount_refuses_writes(s3, bucket, mount_s3) -> None:
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"a")
    s3.put_object(Bucket=bucket, Key="d/b.txt", Body=b"b")
    with mount_s3(f"s3://{bucket}", "--read-only") as mnt:
        for fn, args in (
            (os.open, (mnt / "new", os.O_CREAT | os.O_WRONLY)),
            (os.open, (mnt / "a.txt", os.O_WRONLY)),
            (os.open, (mnt / "a.txt", os.O_RDWR | os.O_TRUNC)),
            (os.mkdir, (mnt / "e",)),
            (os.rmdir, (mnt / "d",)),
            (os.unlink, (mnt / "a.txt",)),
            (os.rename, (mnt / "a.txt", mnt / "b.txt")),
            (os.truncate, (mnt / "a.txt", 0)),
            (os.chmod, (mnt / "a.txt", 0o600)),
            (os.utime, (mnt / "d",)),
        ):
            with pytest.raises(OSError) as caught:
                fn(*args)
            assert caught.value.errno == errno.EROFS, fn
        # pffs refuses them itself (the kernel's `ro` would refuse .pffs/preload too).
        assert (mnt / "a.txt").read_bytes() == b"a"
        listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
        assert [o["Key"] for o in listed] == ["a.txt", "d/b.txt"]


def test_concurrent_writers_on_different_files(s3, bucket, mount_s3) -> None:
    files = {f"w/{i}.bin": random.Random(i).randbytes(3 * MIB + i) for i in range(8)}
    with mount_s3(f"s3://{bucket}") as mnt:
        os.mkdir(mnt / "w")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: write_file(mnt / kv[0], kv[1], 128 << 10), files.items()))
        for key, data in files.items():
            assert (mnt / key).read_bytes() == data
    for key, data in files.items():
        assert stored(s3, bucket, key) == data


def test_shell_tools_work(s3, bucket, mount_s3, tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(random.Random(1).randbytes(2 * MIB))
    with mount_s3(f"s3://{bucket}") as mnt:
        subprocess.run(["cp", str(source), str(mnt / "copy.bin")], check=True)
        subprocess.run(["sh", "-c", f"echo hello >> {mnt}/log.txt"], check=True)
        subprocess.run(["sh", "-c", f"echo world >> {mnt}/log.txt"], check=True)
        subprocess.run(["mv", str(mnt / "copy.bin"), str(mnt / "moved.bin")], check=True)
        assert (mnt / "log.txt").read_text() == "hello\nworld\n"
        time.sleep(0)
    assert stored(s3, bucket, "moved.bin") == source.read_bytes()
    assert stored(s3, bucket, "log.txt") == b"hello\nworld\n"
    assert find_mount(str(tmp_path / "mnt")) is None


@pytest.mark.parametrize("scheme", ["file", "arrow+file"])
def test_writes_on_local_and_arrow_sources(tmp_path: Path, scheme: str) -> None:
    """The same semantics through arrow's output streams (the HDFS path) and local files."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d/old.txt").write_bytes(b"old content")
    data = random.Random(3).randbytes(3 * MIB + 5)
    with mounted(f"{scheme}://{root}", tmp_path / "mnt", "--cache-dir", "none") as mnt:
        write_file(mnt / "d/new.bin", data)
        assert (root / "d/new.bin").read_bytes() == data
        with open(mnt / "d/old.txt", "ab") as f:
            f.write(b" + more")
        assert (root / "d/old.txt").read_bytes() == b"old content + more"
        os.truncate(mnt / "d/old.txt", 3)
        assert (root / "d/old.txt").read_bytes() == b"old"
        os.mkdir(mnt / "e")
        os.rename(mnt / "d/new.bin", mnt / "e/moved.bin")
        assert (root / "e/moved.bin").read_bytes() == data and not (root / "d/new.bin").exists()
        os.unlink(mnt / "d/old.txt")
        os.rmdir(mnt / "d")
        assert sorted(os.listdir(root)) == ["e"]
        with pytest.raises(OSError) as caught:
            os.rmdir(mnt / "e")
        assert caught.value.errno == errno.ENOTEMPTY


def test_streamed_parts_survive_writes_behind_them(s3, bucket, mount_s3) -> None:
    """Parts go up while a large file is written; a write into a sent part restarts at close."""
    rng = random.Random(12)
    data = bytearray(rng.randbytes(48 * MIB + 3))
    with mount_s3(f"s3://{bucket}") as mnt:
        with open(mnt / "streamed.bin", "wb") as f:  # front to back: streamed
            f.write(data[: 40 * MIB])
            f.write(data[40 * MIB :])
        assert stored(s3, bucket, "streamed.bin") == bytes(data)
        with open(mnt / "patched.bin", "wb") as f:
            f.write(data[: 40 * MIB])
            f.seek(MIB)  # behind parts already sent: they are abandoned
            f.write(b"P" * 100)
            f.seek(40 * MIB)
            f.write(data[40 * MIB :])
        data[MIB : MIB + 100] = b"P" * 100
        assert stored(s3, bucket, "patched.bin") == bytes(data)
        assert (mnt / "patched.bin").read_bytes() == bytes(data)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads == []  # the abandoned upload was aborted, not left behind


def the_mounts_tree_page(method: str, path: str, headers: dict[str, str]) -> bool:
    """The page of the mount's whole tree it asks as it starts: a LIST of its root, no
    delimiter, 100 keys."""
    return "max-keys=100" in path and "delimiter" not in path and "prefix=&" in path + "&"


def test_a_file_written_while_the_trees_page_is_on_its_way_is_listed(
    s3, bucket, moto: MotoServer, tmp_path: Path
) -> None:
    """The mount's page of its tree, answered by the store before a file is written through the
    mount and landing after, must not hide that file: `ls` shows it."""
    s3.put_object(Bucket=bucket, Key="old.bin", Body=b"old")
    with FaultProxy(moto.port, match=the_mounts_tree_page) as store:
        store.hold_tail(1)  # the page's body held after its first byte, until released
        options = ("--endpoint-url", store.endpoint_url, "--cache-dir", "none")
        with mounted(f"s3://{bucket}", tmp_path / "mnt", *options) as mnt:
            assert store.holding.wait(30), store.requests
            (mnt / "new.bin").write_bytes(b"new")  # uploaded at close
            assert stored(s3, bucket, "new.bin") == b"new"
            store.release()
            time.sleep(1.0)  # the page lands and is looked at (kept or not) within this
            assert sorted(os.listdir(mnt)) == ["new.bin", "old.bin"]

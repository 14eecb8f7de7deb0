"""Real mounts through /dev/fuse over a real moto S3 server."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pffs.mounting.kernel import find_mount, wait_unmounted
from tests.conftest import PFFS, metric_value, mounted, run_pffs, stats_snapshot
from tests.fusecheck import clear_mount, is_dead, os_errno
from tests.kernel_drops import unless_dropped
from tests.waiting import eventually

pytestmark = [pytest.mark.mount]

MIB = 1 << 20


def upload(s3: Any, bucket: str, objects: dict[str, bytes], threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(
            pool.map(
                lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()
            )
        )


def test_tree_listing_and_stat(s3, bucket, mount_s3) -> None:
    upload(
        s3,
        bucket,
        {
            "top.txt": b"top",
            "a/one.txt": b"1",
            "a/b/two.txt": b"22",
            "a/b/c/d/three.txt": b"333",
            "marked/": b"",  # an empty directory kept by a marker object
            "marked/inside.txt": b"in",
            "emptydir/": b"",
        },
    )
    with mount_s3(f"s3://{bucket}") as mnt:
        assert sorted(os.listdir(mnt)) == ["a", "emptydir", "marked", "top.txt"]
        assert sorted(os.listdir(mnt / "a")) == ["b", "one.txt"]
        assert os.listdir(mnt / "emptydir") == []
        assert os.listdir(mnt / "marked") == ["inside.txt"]
        assert (mnt / "a/b/c/d/three.txt").read_bytes() == b"333"
        st = os.stat(mnt / "a/b/two.txt")
        assert st.st_size == 2 and st.st_mode & 0o777 == 0o644 and st.st_uid == os.getuid()
        assert os.path.isdir(mnt / "a/b/c")
        walked = sorted(
            os.path.relpath(os.path.join(d, f), mnt) for d, _, fs in os.walk(mnt) for f in fs
        )
        assert walked == [
            "a/b/c/d/three.txt",
            "a/b/two.txt",
            "a/one.txt",
            "marked/inside.txt",
            "top.txt",
        ]
        assert not os.path.exists(mnt / "nope")
        vfs = os.statvfs(mnt)
        assert vfs.f_bavail > 0 and vfs.f_namemax == 255


def test_prefix_mount_and_options(s3, bucket, mount_s3) -> None:
    upload(s3, bucket, {"data/x/1.bin": b"1", "data/2.bin": b"22", "other/3.bin": b"333"})
    options = ("--read-only", "--file-mode", "440", "--dir-mode", "550", "--uid", "1234")
    with mount_s3(f"s3://{bucket}/data", *options) as mnt:
        assert sorted(os.listdir(mnt)) == ["2.bin", "x"]
        st = os.stat(mnt / "2.bin")
        assert st.st_mode & 0o777 == 0o440 and st.st_uid == 1234
        assert os.stat(mnt / "x").st_mode & 0o777 == 0o550
        with pytest.raises(OSError) as err:
            os.open(mnt / "2.bin", os.O_WRONLY)
        assert err.value.errno == 30  # EROFS


def test_reads_of_assorted_sizes_at_random_offsets(s3, bucket, mount_s3) -> None:
    rng = random.Random(42)
    sizes = [0, 1, 2, 4095, 4096, 4097, 65535, 131072, 131073, MIB - 1, MIB, MIB + 1, 5 * MIB + 1]
    sizes += [rng.randrange(1, 512 * 1024) for _ in range(100 - len(sizes) - 2)]
    sizes += [17 * MIB + 3, 100 * MIB]
    assert len(sizes) == 100
    objects = {f"files/{i:03d}-{size}.bin": rng.randbytes(size) for i, size in enumerate(sizes)}
    upload(s3, bucket, objects)
    with mount_s3(f"s3://{bucket}") as mnt:
        assert sorted(os.listdir(mnt / "files")) == sorted(k.split("/")[1] for k in objects)
        for key, data in objects.items():
            path = mnt / key
            assert os.stat(path).st_size == len(data)
            fd = os.open(path, os.O_RDONLY)
            try:
                for _ in range(4):
                    offset = rng.randrange(len(data) + 1)
                    length = rng.choice([1, 100, 4096, 65536, 300_000])
                    assert os.pread(fd, length, offset) == data[offset : offset + length], key
                assert os.pread(fd, 10, len(data) + 5) == b""
            finally:
                os.close(fd)
            if len(data) <= MIB:
                assert path.read_bytes() == data, key


def test_pages_of_objects_listed_completely_and_in_order(s3, bucket, mount_s3) -> None:
    """Three pages of the store's listing (1000 entries each: the third has a key and a
    prefix after it), through the kernel's readdir: every name once, in order. (The bench
    lists 10,000.)"""
    names = [f"obj-{i:05d}" for i in range(2001)]
    upload(s3, bucket, {f"wide/{name}": b"" for name in names} | {"wide/sub/x": b"x"}, threads=32)
    with mount_s3(f"s3://{bucket}") as mnt:
        listed = os.listdir(mnt / "wide")  # the order readdir returns, not sorted here
        assert listed == [*names, "sub"]
        assert os.path.getsize(mnt / "wide" / names[-1]) == 0


def test_sigterm_unmounts_cleanly(moto, s3, bucket, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="f", Body=b"data")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen(
        [*PFFS, "mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url, "-f"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: find_mount(str(mnt)), 20, "the mount")
        assert (mnt / "f").read_bytes() == b"data"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert find_mount(str(mnt)) is None
        assert os.listdir(mnt) == []  # an ordinary empty directory again
    finally:
        if proc.poll() is None:
            proc.kill()
        clear_mount(mnt)


def test_dead_mount_is_cleared_by_the_next_mount(moto, s3, bucket, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="f", Body=b"data")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    args = ("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url)
    first = run_pffs(*args)
    assert first.returncode == 0, first.stderr
    pid = int(first.stdout.split("pid ")[1].split(",")[0])
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: is_dead(mnt), 10, "the killed mount dead")
    # "Transport endpoint is not connected"
    assert os_errno("listdir", mnt) == errno.ENOTCONN
    second = run_pffs(*args)
    try:
        assert second.returncode == 0, second.stderr
        assert (mnt / "f").read_bytes() == b"data"
        again = run_pffs(*args)  # a live mount is not mounted over
        assert again.returncode != 0 and "already a pffs mount" in again.stderr
    finally:
        assert run_pffs("umount", str(mnt)).returncode == 0
        assert wait_unmounted(str(mnt))


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a mount's kernel readahead needs root")
def test_reads_reach_the_daemon_as_large_requests(s3, bucket, mount_s3) -> None:
    data = os.urandom(8 * MIB)
    upload(s3, bucket, {"f.bin": data})
    with mount_s3(f"s3://{bucket}", "--kernel-readahead", "4M") as mnt:
        assert (mnt / "f.bin").read_bytes() == data
        # Still 4 MiB after INIT's reply, which sets the readahead the kernel uses.
        entry = find_mount(str(mnt))
        assert entry is not None
        with open(f"/sys/class/bdi/{entry.device}/read_ahead_kb") as f:
            assert int(f.read()) == 4096
        stats = json.loads((mnt / ".pffs" / "stats").read_text())
        reads = [
            sample["value"]
            for sample in stats["metrics"]["pffs_fuse_operations_total"]["samples"]
            if sample["labels"]["op"] == "read"
        ]
        assert reads and reads[0] <= 16  # 1 MiB requests: 8 (with 128 KiB ones, 64)


def test_absent_names_are_answered_by_the_kernel_for_the_negative_ttl(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "present").write_bytes(b"x")
    options = ("--negative-ttl", "30", "--cache-dir", "none")
    with mounted(f"file://{source}", tmp_path / "mnt", *options) as mnt:

        def the_negative_entry_answers() -> None:
            assert not (mnt / "absent").exists()
            lookups = metric_value(stats_snapshot(mnt), "pffs_fuse_operations_total", op="lookup")
            for _ in range(5):
                assert not (mnt / "absent").exists()
            assert (
                metric_value(stats_snapshot(mnt), "pffs_fuse_operations_total", op="lookup")
                == lookups
            )  # the kernel's negative entry answered

        unless_dropped(the_negative_entry_answers)  # another test's drop_caches empties dentries
        (mnt / "absent").write_bytes(b"made through the mount")  # replaces the negative entry
        assert (mnt / "absent").read_bytes() == b"made through the mount"
        assert (source / "absent").read_bytes() == b"made through the mount"


def test_a_read_only_mount_is_sent_one_flush_in_all(tmp_path: Path) -> None:
    """Closing a file costs a FLUSH request on a writable mount; a read-only one answers the
    first with ENOSYS, and the kernel sends no more."""
    source = tmp_path / "source"
    source.mkdir()
    files = {f"f{n}": os.urandom(1000 + n) for n in range(5)}
    for name, data in files.items():
        (source / name).write_bytes(data)
    flushes: dict[bool, float] = {}
    for read_only in (False, True):
        options = ["--cache-dir", "none"] + (["--read-only"] if read_only else [])
        with mounted(f"file://{source}", tmp_path / "mnt", *options) as mnt:
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data
            snapshot = stats_snapshot(mnt)
            flushes[read_only] = metric_value(snapshot, "pffs_fuse_operations_total", op="flush")
    assert flushes[False] >= len(files)
    assert flushes[True] == 1

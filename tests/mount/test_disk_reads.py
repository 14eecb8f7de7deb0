"""Reads through a real mount and the disk tier: random reads served from its open entries
(#18), and the blocks a sequential read passed leaving memory once on disk (drop-behind)."""

from __future__ import annotations

import os
import random
import re
import resource
from pathlib import Path

import boto3
import pytest

from pffs.testing.servers import MotoServer
from tests.conftest import NO_FREE_FLOOR, mounted, run_pffs
from tests.mount.test_cache_mount import drop_page_cache
from tests.mount.test_disk_faults import metric, source_with
from tests.waiting import eventually

pytestmark = [pytest.mark.mount]
MIB = 1 << 20


def entries_held_open(cache_dir: Path) -> set[str]:
    """The disk tier's entry files some process holds open (the mount's daemon: no other
    process uses this cache directory)."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(cache_dir)) and target.endswith(".val"):
                held.add(target)
    return held


def test_random_reads_of_a_remounted_file_come_from_open_entries(
    counted: MotoServer, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="data")
    data = os.urandom(16 * MIB)  # four 4 MiB blocks: incompressible, stored plain
    s3.put_object(Bucket="data", Key="big.bin", Body=data)
    cache_dir = tmp_path / "cache"
    options = (
        *("--endpoint-url", counted.endpoint_url, "--cache-dir", str(cache_dir)),
        *("--cache-memory", "8M"),  # two blocks: most reads must come from the disk tier
        *NO_FREE_FLOOR,
    )
    with mounted("s3://data", tmp_path / "mnt", *options) as mnt:
        assert (mnt / "big.bin").read_bytes() == data
    gets = counted.requests("GET", "/data/big.bin")
    drop_page_cache()
    with mounted("s3://data", tmp_path / "mnt", *options) as mnt:
        assert entries_held_open(cache_dir) == set()
        rng = random.Random(7)
        with open(mnt / "big.bin", "rb", buffering=0) as f:
            for _ in range(200):
                offset = rng.randrange(len(data) // 4096) * 4096
                assert os.pread(f.fileno(), 4096, offset) == data[offset : offset + 4096]
            held = entries_held_open(cache_dir)
        assert 1 <= len(held) <= 4  # the blocks' entries, kept open after their first read
        assert all(os.path.exists(path) for path in held)
    assert counted.requests("GET", "/data/big.bin") == gets  # not one byte from the store
    assert entries_held_open(cache_dir) == set()  # closed with the mount


def test_a_mount_raises_its_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    """So the disk tier's share of it holds more than 256 open entries under systemd's 1,024."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= 1024 or hard == resource.RLIM_INFINITY:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to raise")
    source = tmp_path / "source"
    source.mkdir()
    (tmp_path / "mnt").mkdir()

    def lower() -> None:  # in the child, before `pffs mount` starts
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    result = run_pffs(
        "mount",
        f"file://{source}",
        str(tmp_path / "mnt"),
        "--cache-dir",
        "none",
        preexec_fn=lower,
    )
    assert result.returncode == 0, result.stderr
    try:
        pid = re.search(r"\(pid (\d+)", result.stdout + result.stderr)
        assert pid is not None, result.stdout + result.stderr
        [limit] = [
            line.split()
            for line in Path(f"/proc/{pid[1]}/limits").read_text().splitlines()
            if line.startswith("Max open files")
        ]
        assert int(limit[3]) == hard, limit  # the soft limit, raised from 1,024
    finally:
        run_pffs("umount", str(tmp_path / "mnt"))


def test_a_sequential_read_leaves_the_blocks_it_passed_on_disk_not_in_memory(
    tmp_path: Path,
) -> None:
    """Drop-behind: after a whole 64 MiB file is read in order, the memory tier holds about
    its last blocks, not the file (its default bound, 384 MiB, would hold all of it)."""
    source, data = source_with(tmp_path, 64 * MIB)
    options = ("--cache-dir", str(tmp_path / "cache"), *NO_FREE_FLOOR)
    with mounted(source, tmp_path / "mnt", *options) as mnt:
        with open(mnt / "data.bin", "rb", buffering=0) as f:
            read = [f.read(MIB) for _ in range(64)]
        assert b"".join(read) == data
        # The last blocks' writes behind may still be pending: they leave once written.
        memory = lambda: metric(mnt, "pffs_cache_memory_used_bytes")  # noqa: E731
        eventually(lambda: memory() <= 16 * MIB, 60, "passed blocks out of memory")
        # Up to four blocks may still be in memory here, and their writes behind pending.
        writes = lambda: metric(mnt, "pffs_cache_disk_writes_total")  # noqa: E731
        eventually(lambda: writes() >= 16, 60, "the 16 writes behind")
        assert writes() == 16

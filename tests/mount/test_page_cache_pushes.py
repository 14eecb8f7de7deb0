"""Random reads fill the kernel's page cache through a real mount (pffs.fs.pagecache, #18):
a neighbouring read is then answered by the kernel without reaching pffs, and a changed
object is never served stale."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import boto3
import pytest

from pffs.testing.servers import MotoServer
from tests.conftest import mounted
from tests.kernel_drops import unless_dropped
from tests.waiting import eventually

pytestmark = [pytest.mark.mount]
KIB = 1 << 10
MIB = 1 << 20


def metric(mnt: Path, name: str, **labels: str) -> float:
    """A counter of the mount's `.pffs/stats`, summed over the samples matching `labels`."""
    samples = json.loads((mnt / ".pffs" / "stats").read_text())["metrics"][name]["samples"]
    return float(
        sum(s["value"] for s in samples if all(s["labels"].get(k) == v for k, v in labels.items()))
    )


def reader_reads(mnt: Path) -> tuple[float, float]:
    """(bytes pffs's reader served from any tier, FUSE reads served): the first moves only when
    a read of a file reaches pffs; the second also counts the reads of the stats file."""
    served = metric(mnt, "pffs_cache_served_bytes_total")
    return served, metric(mnt, "pffs_fuse_operations_total", op="read")


def wait_for_pushes(mnt: Path, count: float) -> None:
    pushed = lambda: metric(mnt, "pffs_page_cache_pushes_total") >= count  # noqa: E731
    eventually(pushed, 10, "a window pushed into the page cache")


def test_a_random_read_fills_the_page_cache_around_it_and_never_serves_stale_bytes(
    moto: MotoServer, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    s3.create_bucket(Bucket="pages")
    old = os.urandom(32 * MIB)
    s3.put_object(Bucket="pages", Key="f.bin", Body=old)
    options = (
        *("--endpoint-url", moto.endpoint_url, "--cache-dir", str(tmp_path / "cache")),
        *("--attr-ttl", "0.5", "--dir-ttl", "0.5"),  # an open soon asks the store again
    )
    with mounted("s3://pages", tmp_path / "mnt", *options) as mnt:
        assert (mnt / "f.bin").read_bytes() == old  # the cache holds it: pushes need that
        at, near = 20 * MIB + 60 * KIB, 20 * MIB + 4 * KIB

        def the_push_answers_a_neighbour() -> int:
            """A handle whose random read was pushed around (the push answering the neighbour).
            A handle of its own each attempt: once a drop let the neighbour's read reach pffs,
            the next attempt's read would continue that handle's run (sequential: no push)."""
            fd = os.open(mnt / "f.bin", os.O_RDONLY)
            try:
                # Drop the file's pages (clean pages of this file only; no root needed).
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                # Far from the start (a first read near it would look sequential to pffs), the
                # last 4 KiB of the 64 KiB window [20 MiB, 20 MiB + 64 KiB).
                pushes = metric(mnt, "pffs_page_cache_pushes_total")
                assert os.pread(fd, 4 * KIB, at) == old[at : at + 4 * KIB]
                wait_for_pushes(mnt, pushes + 1)

                # Reading the stats file twice with nothing between: what that alone costs.
                first = reader_reads(mnt)
                second = reader_reads(mnt)
                stats_reads = second[1] - first[1]
                # The neighbour lies before the read, where the kernel's own readahead never
                # goes: only the push can have put it in the page cache.
                assert os.pread(fd, 4 * KIB, near) == old[near : near + 4 * KIB]
                third = reader_reads(mnt)
                assert third[0] == second[0]  # no byte served by pffs's reader
                assert third[1] - second[1] == stats_reads  # no FUSE read but the stats file's
            except BaseException:
                os.close(fd)
                raise
            return fd

        fd = unless_dropped(the_push_answers_a_neighbour)  # another test's drop_caches empties it
        try:
            # The object changes in the store. The old handle reads (and pushes) its version
            # right up to a new open; once that open has seen the new version, no page of the
            # old one may be served, not even one whose push was on its way.
            new = bytes(b ^ 0xFF for b in old[: 16 * MIB]) + old[16 * MIB :]
            s3.put_object(Bucket="pages", Key="f.bin", Body=new)
            time.sleep(1.0)  # past the attribute and listing TTLs: the next open asks the store
            far = 5 * MIB + 60 * KIB
            assert os.pread(fd, 4 * KIB, far) == old[far : far + 4 * KIB]
            fd_new = os.open(mnt / "f.bin", os.O_RDONLY)
            try:
                time.sleep(0.3)
                for offset in (near, far - 32 * KIB, far):
                    assert os.pread(fd_new, 4 * KIB, offset) == new[offset : offset + 4 * KIB]
            finally:
                os.close(fd_new)
        finally:
            os.close(fd)

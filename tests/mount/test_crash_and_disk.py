"""Crashes and full disks, through real mounts: kill -9 of the daemon, staged writes left behind,
a full cache disk and a full staging disk (small tmpfs file systems mounted as the cache dir).
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pffs.backends import open_backend
from pffs.cache.orphans import GRACE
from pffs.config import SourceConfig
from pffs.fs.staging import manifest_path
from pffs.mounting.kernel import wait_unmounted
from pffs.mounting.recovery import recover_staged
from pffs.routing.table import Mounted
from pffs.testing.faults import FaultProxy
from tests.cache.test_disk_batch import _entry_files as entry_files
from tests.cache.test_orphans import age, kill_a_writer_before_its_commit, orphans_of
from tests.conftest import (
    NO_FREE_FLOOR,
    metric_value,
    mounted,
    run_pffs,
    stats_snapshot,
    unmount_quietly,
)
from tests.waiting import eventually

MIB = 1 << 20
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def daemon_pid(stdout: str) -> int:
    return int(stdout.split("(pid ")[1].split(",")[0])


def stored(s3: Any, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


@pytest.fixture
def proxy(moto) -> Iterator[FaultProxy]:
    with FaultProxy(moto.port) as fault_proxy:
        yield fault_proxy


def kill_daemon(pid: int, mnt: Path) -> None:
    os.kill(pid, signal.SIGKILL)

    def dead() -> bool:
        try:
            os.listdir(mnt)  # not stat: the kernel may answer that from its attribute cache
        except OSError as exc:
            return exc.errno == errno.ENOTCONN
        return False

    eventually(dead, 10, "the mount dead")


# --- crash recovery ------------------------------------------------------------------------


@pytest.mark.mount
def test_a_failed_fsync_leaves_the_file_marked_as_being_written(
    s3, bucket, proxy, tmp_path
) -> None:
    """An fsync whose upload fails (the store is down) returns the error, and the file stays
    marked as being written, not closed: its writer goes on, so a crash now must not upload it
    as complete. Its close, once the store is back, uploads all of it."""
    cache = tmp_path / "cache"
    options = (
        *("--endpoint-url", proxy.endpoint_url, "--cache-dir", str(cache)),
        *("--retries", "1", "--retry-timeout", "2", "--request-timeout", "1"),
    )
    with mounted(f"s3://{bucket}", tmp_path / "mnt", *options) as mnt:
        fd = os.open(mnt / "f.txt", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"first half")
            proxy.down()
            with pytest.raises(OSError):
                os.fsync(fd)
            manifests = (cache / "staging").glob("*.json")
            assert [json.loads(p.read_text())["state"] for p in manifests] == ["writing"]
            proxy.up()
            os.write(fd, b", second half")
        finally:
            os.close(fd)
        assert stored(s3, bucket, "f.txt") == b"first half, second half"


def test_kill_9_then_remount_recovers_cache_and_staged_writes(s3, bucket, proxy, tmp_path) -> None:
    """After kill -9: the dead mount is cleared, the disk cache is reused, a file closed while
    the store was down is uploaded, and a file still open is kept and reported, not uploaded."""
    warm = random.randbytes(3 * MIB)
    s3.put_object(Bucket=bucket, Key="warm.bin", Body=warm)
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    mnt.mkdir()
    args = (
        *("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", proxy.endpoint_url),
        *("--cache-dir", str(cache), "--retries", "1", "--retry-timeout", "2"),
        *("--request-timeout", "1", "--log-file", str(tmp_path / "mnt.log")),
        *NO_FREE_FLOOR,
    )
    first = run_pffs(*args)
    assert first.returncode == 0, first.stderr
    pid = daemon_pid(first.stdout)
    try:
        assert (mnt / "warm.bin").read_bytes() == warm
        # The disk tier is written behind the reader: its one block (3 MiB, of 4).
        written = lambda: metric_value(stats_snapshot(mnt), "pffs_cache_disk_writes_total")  # noqa: E731
        eventually(lambda: written() >= 1, 30, "warm.bin on the disk tier")
        closed_fd = os.open(mnt / "closed.txt", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(closed_fd, b"closed while the store was down")
        open_fd = os.open(mnt / "open.txt", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(open_fd, b"half of what I meant to write")
        proxy.down()
        with pytest.raises(OSError):
            os.close(closed_fd)  # EIO: the upload failed, the data is kept for recovery
        proxy.up()
        kill_daemon(pid, mnt)
        with pytest.raises(OSError):
            os.close(open_fd)
        staging = cache / "staging"
        states = sorted(json.loads(p.read_text())["state"] for p in staging.glob("*.json"))
        assert states == ["closed", "writing"]

        # warm.bin's bytes can only come from the disk cache now (a listing of the name as a
        # directory, which its lookup asks beside the root's, may still go through).
        proxy.match = lambda method, path, headers: (
            method == "GET" and "warm.bin" in path and "list-type" not in path
        )
        proxy.set_rates({"reset": 1.0})
        second = run_pffs(*args)
        assert second.returncode == 0, second.stderr
        # One line on stderr for the file kept, one for the file uploaded.
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 2, second.stderr
        kept_line = next(line for line in lines if "in progress" in line)
        assert "open.txt" in kept_line and str(staging) in kept_line
        assert any("uploaded" in line and "closed.txt" in line for line in lines)
        assert stored(s3, bucket, "closed.txt") == b"closed while the store was down"
        assert stored(s3, bucket, "open.txt") is None  # never uploaded: it may be partial
        kept = [p for p in staging.glob("*.data")]
        assert [p.read_bytes() for p in kept] == [b"half of what I meant to write"]
        assert (mnt / "warm.bin").read_bytes() == warm
        assert proxy.injected["reset"] == 0
        assert (mnt / "closed.txt").read_bytes() == b"closed while the store was down"
        log = (tmp_path / "mnt.log").read_text()
        assert "clearing dead pffs mount" in log
        assert "in progress when pffs stopped" in log
    finally:
        run_pffs("umount", str(mnt))
        unmount_quietly(mnt)
        assert wait_unmounted(str(mnt))


def _leftover(
    staging: Path,
    name: str,
    source: tuple[str, str | None],
    path: str,
    state: str,
    data: bytes,
) -> Path:
    """A staging file and its manifest; `source` is (source id, principal), a principal of
    None naming none, as manifests did before they recorded it."""
    file = staging / f"w-{name}.data"
    file.write_bytes(data)
    manifest = {"source": source[0], "path": path, "state": state}
    if source[1] is not None:
        manifest["principal"] = source[1]
    Path(manifest_path(str(file))).write_text(json.dumps(manifest))
    return file


def test_recovery_by_manifest_state(tmp_path: Path) -> None:
    """Each state's rule, on a local source: closed -> uploaded, writing -> kept and reported,
    clean -> removed; other sources, other principals of this one and files of a live
    process -> untouched; this source's without a principal -> kept and reported."""
    root, staging = tmp_path / "root", tmp_path / "staging"
    root.mkdir()
    staging.mkdir()
    backend = open_backend(SourceConfig(url=f"file://{root}"))
    me = (backend.source_id, backend.principal)
    closed = _leftover(staging, "a", me, "sub/closed.txt", "closed", b"complete")
    (root / "sub").mkdir()
    writing = _leftover(staging, "b", me, "writing.txt", "writing", b"partial")
    clean = _leftover(staging, "c", me, "clean.txt", "clean", b"same as the store")
    other = _leftover(staging, "d", ("s3://elsewhere", me[1]), "x", "closed", b"not mine")
    not_my_principal = _leftover(staging, "g", (me[0], "another"), "theirs.txt", "closed", b"x")
    unnamed = _leftover(staging, "h", (me[0], None), "old.txt", "closed", b"from before")
    orphan = staging / "w-e.data"
    orphan.write_bytes(b"no manifest")
    live = _leftover(staging, "f", me, "live.txt", "closed", b"still open")
    import fcntl

    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a live pffs holds its staging files
        lines: list[str] = []
        report = recover_staged(str(staging), [Mounted("", backend)], notify=lines.append)
    assert (root / "sub" / "closed.txt").read_bytes() == b"complete"
    assert report.uploaded == [str(closed)] and not closed.exists()
    assert not (root / "writing.txt").exists() and writing.read_bytes() == b"partial"
    assert not clean.exists() and report.removed == [str(clean)]
    assert other.exists() and live.exists() and not (root / "live.txt").exists()
    assert not_my_principal.exists() and not (root / "theirs.txt").exists()
    assert unnamed.exists() and not (root / "old.txt").exists()
    assert orphan.exists()
    assert sorted(report.kept) == sorted([str(writing), str(orphan), str(unnamed)])
    assert len(lines) == 4  # kept, orphan, unnamed, uploaded: each one line
    assert all("\n" not in line for line in lines)


def test_failed_recovery_upload_keeps_the_data(tmp_path: Path) -> None:
    root, staging = tmp_path / "root", tmp_path / "staging"
    root.mkdir()
    staging.mkdir()
    backend = open_backend(SourceConfig(url=f"file://{root}"))
    # The target's parent directory does not exist: the upload fails, nothing is lost.
    me = (backend.source_id, backend.principal)
    file = _leftover(staging, "a", me, "missing/dir/f.txt", "closed", b"keep me")
    lines: list[str] = []
    report = recover_staged(str(staging), [Mounted("", backend)], notify=lines.append)
    assert report.kept == [str(file)] and file.read_bytes() == b"keep me"
    assert len(lines) == 1 and str(file) in lines[0]


# --- disk pressure -------------------------------------------------------------------------


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


@pytest.mark.mount
@requires_root
@pytest.mark.parametrize("full_before_mount", [False, True])
def test_full_cache_disk_is_read_around(
    s3, bucket, moto, small_disk, tmp_path, full_before_mount
) -> None:
    data = random.randbytes(16 * MIB)  # twice the disk
    s3.put_object(Bucket=bucket, Key="big.bin", Body=data)
    s3.put_object(Bucket=bucket, Key="other.bin", Body=b"readers are fine")
    cache = small_disk / "cache"
    if full_before_mount:
        fill(small_disk)
    options = ("--endpoint-url", moto.endpoint_url, "--cache-dir", str(cache))
    # No free-space floor: the disk tier really meets ENOSPC rather than stepping aside first.
    with mounted(f"s3://{bucket}", tmp_path / "mnt", *options, "--cache-free-ratio", "0") as mnt:
        if not full_before_mount:
            fill(small_disk)
        for _ in range(2):
            assert (mnt / "big.bin").read_bytes() == data
        # A full staging disk: the writer gets ENOSPC (at write or at close), readers nothing.
        with pytest.raises(OSError) as full, open(mnt / "new.bin", "wb") as f:
            for _ in range(16):
                f.write(b"w" * MIB)
                f.flush()
        assert full.value.errno == errno.ENOSPC
        assert (mnt / "other.bin").read_bytes() == b"readers are fine"
        assert (mnt / "big.bin").read_bytes() == data
        assert stored(s3, bucket, "new.bin") is None


@pytest.mark.mount
def test_a_mount_sweeps_the_files_a_killed_cache_writer_left(tmp_path: Path) -> None:
    """Entry files a writer killed before its commit left, old enough, are removed by the
    mount in the background (pffs.cache.orphans); the indexed entries stay."""
    cache, source = tmp_path / "cache", tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_bytes(b"a")
    kill_a_writer_before_its_commit(cache)
    orphans = orphans_of(cache)
    indexed = entry_files(cache) - orphans
    assert orphans and indexed
    age(cache, orphans, GRACE + 60)
    with mounted(f"file://{source}", tmp_path / "mnt", "--cache-dir", str(cache)) as mnt:
        assert (mnt / "a.txt").read_bytes() == b"a"  # the mount serves while it sweeps
        eventually(lambda: not entry_files(cache) & orphans, 10, "the orphans swept")
        assert indexed <= entry_files(cache)

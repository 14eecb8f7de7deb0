"""When things fail, through real mounts and a FaultProxy on 127.0.0.1: one bound on a read of
a hung store, reads failing at once while the source is down (pffs.routing.health) and coming
back without a remount, a store that throttles under load, a cache disk that fills, and a
daemon killed with SIGKILL that the next mount clears at once. Timeouts are seconds-long, set
by flags. (The reader's latency behind a throttling store is measured by bench.probes.throttling.)
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.mounting.kernel import wait_unmounted
from pffs.testing.faults import FaultProxy, any_request
from pffs.testing.servers import MotoServer
from tests.conftest import mounted, run_pffs, unmount_quietly
from tests.mount.test_cli_errors import assert_one_line_error
from tests.mount.test_crash_and_disk import daemon_pid, requires_root
from tests.mount.test_reliability import errno_of, mount_via, read_all, read_when_back

pytestmark = pytest.mark.mount
KIB, MIB = 1 << 10, 1 << 20
REQUEST, RETRY = 1.0, 3.0
SLACK = 10.0  # a loaded machine's delay on top of a configured wait; a hang is twice that
FAST = ("--request-timeout", f"{REQUEST:g}", "--connect-timeout", "1", "--retry-timeout")


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.port, stall_seconds=20.0, seed=3) as fault_proxy:
        yield fault_proxy


def source_up(mnt: Path) -> float:
    snapshot = json.loads((mnt / ".pffs" / "stats").read_text())
    samples = snapshot["metrics"]["pffs_source_up"]["samples"]
    return float(min(sample["value"] for sample in samples))


def test_hung_store_one_bound_then_fail_fast_then_back(s3, bucket, proxy, tmp_path) -> None:
    """Readahead, the reader and dataset preload all wait on a store that stops answering:
    the first error comes within --retry-timeout + one --request-timeout, later reads needing
    the store fail at once, cached bytes keep serving, and the mount reads again by itself."""
    files = {f"d/f{n}.bin": random.randbytes(4 * MIB) for n in range(4)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    options = (*FAST, f"{RETRY:g}", "--cache-dir", "none", "--block-size", "1M")
    with mounted(
        f"s3://{bucket}", tmp_path / "mnt", "--endpoint-url", proxy.endpoint_url, *options
    ) as mnt:
        assert (mnt / "d" / "f0.bin").read_bytes() == files["d/f0.bin"]
        assert source_up(mnt) == 1
        # Every request stalls, the breaker's probes (a one-key LIST) too: with object GETs
        # alone, a probe found the store answering half a second after it went down.
        proxy.match = any_request
        proxy.set_rates({"stall": 1.0})  # headers, a little body, then silence
        code, took = errno_of(read_all, mnt / "d" / "f1.bin")
        assert code == errno.EIO, code
        # The bound is the configured wait; a hang would be the stall's 20 s.
        assert took < RETRY + REQUEST + SLACK, f"first EIO after {took:.1f}s"
        for name in ("f2.bin", "f3.bin"):  # at once: without asking the store for them
            code, _ = errno_of(read_all, mnt / "d" / name)
            asked = [path for method, path in proxy.requests if name in path]
            assert code == errno.EIO and not asked, (name, code, asked)
        assert source_up(mnt) == 0
        assert "DOWN: s3://" in run_pffs("stats", str(mnt), "-n", "1").stdout
        with open(mnt / "d" / "f0.bin", "rb") as f:  # the kernel's pages of it: still served
            assert f.read(MIB) == files["d/f0.bin"][:MIB]
        proxy.set_rates({})
        data = read_when_back(mnt / "d" / "f1.bin")  # within 10 s of the store answering
        assert data == files["d/f1.bin"]
        assert source_up(mnt) == 1
    log = (tmp_path / "mnt.log").read_text()
    assert log.count(" is down: ") == 1 and log.count(" is up again ") == 1, log[-2000:]


def test_a_read_joining_a_failing_readahead_keeps_its_own_bound(
    s3, bucket, proxy, tmp_path
) -> None:
    """The 122 s symptom: the kernel's and pffs's readahead ask first, the reader's read joins
    their failing fetches, and must not start a fresh retry budget after they fail."""
    s3.put_object(Bucket=bucket, Key="big.bin", Body=random.randbytes(16 * MIB))
    options = (*FAST, f"{RETRY:g}", "--cache-dir", "none", "--block-size", "1M")
    with mounted(
        f"s3://{bucket}", tmp_path / "mnt", "--endpoint-url", proxy.endpoint_url, *options
    ) as mnt:
        proxy.set_rates({"stall": 1.0})
        started = time.monotonic()
        outcomes: list[tuple[int | None, float]] = []
        readers = [
            threading.Thread(target=lambda: outcomes.append(errno_of(read_all, mnt / "big.bin")))
            for _ in range(3)
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
        assert len(outcomes) == 3, "a reader hung"
        for code, took in outcomes:
            assert code == errno.EIO and took < RETRY + REQUEST + SLACK, (outcomes, started)


def test_store_throttling_under_load_costs_readers_no_error(s3, bucket, proxy, tmp_path) -> None:
    """503 SlowDown to every GET beyond 2 in flight, while 8 readers and dataset preload read a
    directory: every byte exact, and the store did throttle."""
    files = {f"t/{n:02d}.bin": random.randbytes(256 * KIB + n) for n in range(24)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    proxy.throttle_above(2)
    errors: list[str] = []
    with mount_via(proxy, bucket, tmp_path / "mnt", "--cache-dir", "none") as mnt:
        readers = [
            threading.Thread(target=read_shuffled, args=(mnt, files, n, errors)) for n in range(8)
        ]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join(120)
    assert not errors, errors[:5]
    assert proxy.injected["throttle"] > 0


def test_remount_right_after_sigkill_clears_the_dead_mount(s3, bucket, moto, tmp_path) -> None:
    """SIGKILL while dataset preload, the disk tier's write-behind and a staged upload are
    under way; the next `pffs mount` at once (the kernel still holds the root's attributes for
    their 60 s TTL) clears the dead mount and serves every byte exactly."""
    files = {f"ds/part-{n:02d}.bin": random.randbytes(MIB + n) for n in range(24)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    mnt.mkdir()
    args = (
        *("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url),
        *("--cache-dir", str(cache), "--cache-size", "64M", "--block-size", "1M"),
        *(*FAST, f"{RETRY:g}", "--log-file", str(tmp_path / "mnt.log")),
    )
    first = run_pffs(*args)
    assert first.returncode == 0, first.stderr
    try:
        staged = os.open(mnt / "new.bin", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(staged, b"s" * MIB)
        # The root's attributes, now in the kernel's cache (the create above dropped them).
        os.stat(mnt)
        for n in range(3):  # a job opening a directory's files: dataset preload starts
            assert (mnt / f"ds/part-{n:02d}.bin").read_bytes() == files[f"ds/part-{n:02d}.bin"]
        os.kill(daemon_pid(first.stdout), signal.SIGKILL)
        with pytest.raises(OSError):
            os.close(staged)
        started = time.monotonic()
        second = run_pffs(*args)
        assert second.returncode == 0, second.stderr
        assert time.monotonic() - started < 15
        assert "new.bin" in second.stderr  # the staged write is reported, not uploaded
        for key, data in files.items():
            assert (mnt / key).read_bytes() == data, key
        assert "clearing dead pffs mount" in (tmp_path / "mnt.log").read_text()
    finally:
        run_pffs("umount", str(mnt))
        unmount_quietly(mnt)
        assert wait_unmounted(str(mnt))
    sizes = [p.stat().st_size for p in cache.rglob("*") if p.is_file()]
    assert sum(sizes) < 64 * MIB + 16 * MIB, sum(sizes)  # the bound, and the index beside it


@pytest.mark.parametrize("flag", ["--retry-timeout", "--request-timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_bad_timeout_flags(flag: str, value: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(("mount", "s3://bucket", str(empty), f"{flag}={value}"), 2, value)


@requires_root
def test_cache_disk_filling_under_eight_readers_and_preload(
    s3, bucket, moto, small_disk, tmp_path
) -> None:
    """8 readers and dataset preload fill an 8 MiB cache disk: no reader sees an error, the
    blocks that do not fit come from the store, the free-space floor holds, and after a
    remount every byte is exact."""
    files = {f"train/{n:03d}.bin": random.randbytes(512 * KIB + n) for n in range(40)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    floor = 0.25
    options = (
        *("--endpoint-url", moto.endpoint_url, "--cache-dir", str(small_disk / "cache")),
        *("--cache-free-ratio", f"{floor:g}", "--block-size", "256K", "--cache-memory", "8M"),
    )
    disk = os.statvfs(small_disk)
    lowest_free = [disk.f_bavail * disk.f_frsize]
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            now = os.statvfs(small_disk)
            lowest_free[0] = min(lowest_free[0], now.f_bavail * now.f_frsize)
            time.sleep(0.01)

    errors: list[str] = []

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for round_ in range(2):  # the second mount finds the disk tier the first one left
            with mounted(f"s3://{bucket}", tmp_path / "mnt", *options) as mnt:
                readers = [
                    threading.Thread(
                        target=read_shuffled, args=(mnt, files, round_ * 8 + n, errors)
                    )
                    for n in range(8)
                ]
                for thread in readers:
                    thread.start()
                for thread in readers:
                    thread.join(120)
                assert not any(thread.is_alive() for thread in readers), "a reader hung"
                stats = json.loads((mnt / ".pffs" / "stats").read_text())["metrics"]
                served = {
                    s["labels"]["tier"]: s["value"]
                    for s in stats["pffs_cache_served_bytes_total"]["samples"]
                }
            assert not errors, errors[:5]
            assert served.get("store", 0) > 0  # what did not fit came from the store
    finally:
        watching.set()
        watcher.join()
    size = disk.f_blocks * disk.f_frsize
    assert lowest_free[0] >= floor * size - 256 * KIB, (lowest_free[0], size)


def read_shuffled(mnt: Path, files: dict[str, bytes], seed: int, errors: list[str]) -> None:
    """Read every file once in a seeded order, noting wrong bytes and errors."""
    names = sorted(files)
    random.Random(seed).shuffle(names)
    for key in names:
        try:
            if (mnt / key).read_bytes() != files[key]:
                errors.append(f"{key}: wrong bytes")
        except OSError as exc:
            errors.append(f"{key}: {exc}")

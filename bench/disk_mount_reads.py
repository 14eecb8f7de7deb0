"""Random 4 KiB reads of a cached file through real mounts: pffs beside s3fs and rclone, from
the disk cache and from memory (a quick check of issue 18, not the bench suite).

One object (1 GiB of random bytes by default) goes to s3rver (or moto). Each system mounts it
over a cache directory of its own and reads it whole once, so its cache holds it. Then, for
each repetition, source, engine and system in turn (interleaved, so the machine's noise falls
on all of them alike), one fio run of `bench/jobs/randread.fio` (4 KiB random reads, buffered):

- *disk*: mounted again over the filled cache, page cache dropped: pffs's memory tier starts
  empty and is too small for the file (defaults: 512 MiB), the peers read their cache files;
- *memory*: mounted again and the file read whole once (pffs with `--cache-memory 2G`, so its
  memory tier holds the file), then the page cache dropped; the peers read their cache files.

For pffs it also reports its CPU per fio read and how many of fio's reads reached pffs (its
FUSE read counter in `.pffs/stats`). `--before DIR` adds "pffs-before": pffs run from another
source tree (an export of an earlier commit), interleaved with the others.

    .venv/bin/python -m bench.disk_mount_reads --seconds 10 --reps 2 --before /tmp/pffs-base
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from bench.scenarios import drop_caches, fio
from bench.servers import TOOLS_DIR, Launcher, Server, Unavailable
from bench.systems import Pffs, Rclone, S3fs, System, cpu_seconds, unmount

MIB = 1 << 20
BUCKET = "randread"
KEY = "big.bin"
SOURCES = ("disk", "memory")
ENGINES = (("psync", "1"), ("libaio", "16"))


@dataclass
class Contender:
    """A system under test, with its own cache directory and (pffs-before) source tree."""

    name: str
    system: System
    cache_dir: str
    pythonpath: str | None = None
    memory_options: list[str] = field(default_factory=list)


@dataclass
class Run:
    iops: float
    cpu_us_per_read: float | None = None  # the pffs process's CPU per fio read
    reached: float | None = None  # share of fio's reads that reached pffs
    kib_per_read: float | None = None  # the mean size of the reads that reached it


def _make_object(path: Path, size: int) -> str:
    """A file of `size` random bytes; returns its SHA-256."""
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(0, size, 16 * MIB):
            chunk = os.urandom(min(16 * MIB, size - f.tell()))
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def _read_whole(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as f:
        while chunk := f.read(4 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _mounted(
    contender: Contender, server: Server, mountpoint: str, extra: list[str]
) -> Iterator[int | None]:
    system = contender.system
    saved_path, saved_options, saved_cwd = os.environ.get("PYTHONPATH"), None, os.getcwd()
    if contender.pythonpath is not None:
        os.environ["PYTHONPATH"] = contender.pythonpath  # server.env() copies os.environ
        # `python -m pffs` looks in its working directory first: a worktree's pffs would win.
        os.chdir(contender.pythonpath)
    if isinstance(system, Pffs):
        saved_options = system.options
        system.options = [*saved_options, *extra]
    try:
        pid = system.mount(server, BUCKET, mountpoint, contender.cache_dir)
    finally:
        if contender.pythonpath is not None:
            os.chdir(saved_cwd)
            if saved_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved_path
        if isinstance(system, Pffs) and saved_options is not None:
            system.options = saved_options
    try:
        yield pid
    finally:
        unmount(mountpoint)


def _fuse_reads(mountpoint: str) -> tuple[float, float]:
    """pffs's count of FUSE reads so far, and the bytes its reader served (`.pffs/stats`)."""
    metrics = json.loads(Path(mountpoint, ".pffs", "stats").read_text())["metrics"]
    samples = metrics["pffs_fuse_operations_total"]["samples"]
    reads = sum(s["value"] for s in samples if s["labels"].get("op") == "read")
    served = sum(s["value"] for s in metrics["pffs_cache_served_bytes_total"]["samples"])
    return float(reads), float(served)


def _measure(
    contender: Contender,
    server: Server,
    mountpoint: str,
    source: str,
    engine: tuple[str, str],
    size: int,
    seconds: int,
) -> Run:
    extra = contender.memory_options if source == "memory" else []
    with _mounted(contender, server, mountpoint, extra) as pid:
        if source == "memory":
            _read_whole(Path(mountpoint, KEY))
        drop_caches()
        is_pffs = isinstance(contender.system, Pffs)
        reads_before = _fuse_reads(mountpoint) if is_pffs else (0.0, 0.0)
        cpu_before = cpu_seconds(pid)
        report = fio(
            "randread.fio",
            FILE=os.path.join(mountpoint, KEY),
            SIZE=str(size),
            RUNTIME=str(seconds),
            IOENGINE=engine[0],
            IODEPTH=engine[1],
        )
        cpu_after = cpu_seconds(pid)
        run = Run(float(report["iops"]))
        ios = int(report["total_ios"])
        if is_pffs and ios:
            reads, served = (
                a - b for a, b in zip(_fuse_reads(mountpoint), reads_before, strict=True)
            )
            run.reached = reads / ios
            run.kib_per_read = served / reads / 1024 if reads else 0.0
            if cpu_before is not None and cpu_after is not None:
                run.cpu_us_per_read = (cpu_after - cpu_before) / ios * 1e6
        return run


def _contenders(root: str, before: str | None) -> list[Contender]:
    memory = ["--cache-memory", "2G"]
    found = [Contender("pffs", Pffs([]), f"{root}/cache-pffs", memory_options=memory)]
    if before is not None:
        found.append(Contender("pffs-before", Pffs([]), f"{root}/cache-before", before, memory))
    for peer in (S3fs(), Rclone()):
        try:
            peer.check()
        except Unavailable as exc:
            print(f"disk_mount_reads: {peer.name} left out: {exc}", file=sys.stderr)
            continue
        found.append(Contender(peer.name, peer, f"{root}/cache-{peer.name}"))
    return found


def _summary(runs: list[Run]) -> str:
    iops = [r.iops for r in runs]
    text = f"{statistics.median(iops):>9,.0f} ({min(iops):,.0f}-{max(iops):,.0f})"
    cpu = [r.cpu_us_per_read for r in runs if r.cpu_us_per_read is not None]
    reached = [r.reached for r in runs if r.reached is not None]
    if cpu and reached:
        text += f"  CPU {statistics.median(cpu):.1f} us/read"
        text += f", {statistics.median(reached):.1%} reached pffs"
        sizes = [r.kib_per_read for r in runs if r.kib_per_read is not None]
        text += f" ({statistics.median(sizes):.0f} KiB each)" if sizes else ""
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the object's size (1024)")
    parser.add_argument("--seconds", type=int, default=10, help="each fio run (10)")
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions (2)")
    parser.add_argument("--server", choices=("s3rver", "moto"), default="s3rver")
    parser.add_argument("--before", help="a pffs source tree to run as pffs-before")
    parser.add_argument("--cache", default=TOOLS_DIR)
    parser.add_argument("--only", help="comma-separated systems to run (default: all)")
    args = parser.parse_args()
    size = args.size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="randread-", dir="/var/tmp") as root:
        launcher = Launcher(root, args.cache)
        server = launcher.s3rver() if args.server == "s3rver" else launcher.moto()
        try:
            digest = _make_object(Path(root, "object"), size)
            s3 = boto3.client(
                "s3",
                endpoint_url=server.endpoint_url,
                aws_access_key_id=server.access_key,
                aws_secret_access_key=server.secret_key,
                region_name="us-east-1",
            )
            s3.create_bucket(Bucket=BUCKET)
            s3.upload_file(str(Path(root, "object")), BUCKET, KEY)
            os.unlink(Path(root, "object"))
            contenders = _contenders(root, args.before)
            if args.only:
                contenders = [c for c in contenders if c.name in args.only.split(",")]
            mountpoint = f"{root}/mnt"
            os.makedirs(mountpoint)
            for contender in contenders:  # fill each system's cache, checking the bytes
                os.makedirs(contender.cache_dir)
                started = time.perf_counter()
                with _mounted(contender, server, mountpoint, []):
                    if _read_whole(Path(mountpoint, KEY)) != digest:
                        sys.exit(f"disk_mount_reads: {contender.name} read wrong bytes")
                took = time.perf_counter() - started
                print(f"{contender.name}: filled its cache in {took:.1f} s", flush=True)
            results: dict[tuple[str, str, str], list[Run]] = {}
            for rep in range(args.reps):
                for source in SOURCES:
                    for engine in ENGINES:
                        for contender in contenders:
                            run = _measure(
                                contender, server, mountpoint, source, engine, size, args.seconds
                            )
                            results.setdefault((source, engine[0], contender.name), []).append(run)
                            print(
                                f"rep {rep + 1} {source:6} {engine[0]:6} {contender.name:12}"
                                f" {_summary([run])}",
                                flush=True,
                            )
        finally:
            server.stop()
    print(f"\nmedian (min-max) IOPS of {args.reps} runs, {args.seconds} s each, {size // MIB} MiB")
    for (source, engine_name, name), runs in results.items():
        print(f"{source:6} {engine_name:6} {name:12} {_summary(runs)}")


if __name__ == "__main__":
    main()

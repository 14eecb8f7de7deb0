"""`python -m bench.probes.fuse_floor`: the CPU of one FUSE lookup through pyfuse3 and trio alone.

Every request the kernel sends pffs goes through pyfuse3's session loop on trio before pffs's
own code runs. This measures that floor with a minimal pyfuse3 file system (not pffs): a
directory of `--files` names whose lookup is one dict lookup, mounted in a child process. The
kernel's dentries are dropped (as root), then every name is stat'ed in turn, so that each stat
is one FUSE LOOKUP; the child's CPU (utime + stime from /proc/PID/stat: its Python, pyfuse3
and the kernel work done on its behalf) is divided by the stats. Then the same on `pffs mount`
of a `file://` tree of the same names (defaults but `--cache-dir none`), listed once first so
that its lookups are answered from its listing, as after `ls -l`.

    python -m bench.probes.fuse_floor --files 10000 --reps 3

With `--read-mib N`, the floor of a sequential read instead: the minimal file system serves one
file of N MiB from one bytes object in memory (its READ returns a memoryview slice, as pffs's
does), mounted with pffs's FUSE options (pyfuse3's defaults, its task bounds, the kernel's
readahead raised as pffs raises it), so the kernel sends the READs it sends pffs. The page
cache is dropped before each read; the file is read whole by one thread in 1 MiB reads, then
by 4 threads at 4 offsets (a quarter each), then as 4 files of a quarter each, one thread
each (as the Parquet scan's 4 readers). Per read: the
serving process's CPU-s per GiB (utime + stime of all its threads), MB/s, and the READs' sizes
the kernel sent. Then the same reads on `pffs mount` of an object of N random MiB in s3rver at
0 ms (and its quarters) with `--cache-dir none` (its memory tier only; a disk tier would take
the passed blocks out of memory): a cold read, and a warm one from its memory tier after the
page cache is dropped, with the share of each pffs served from each tier; and on s3fs
(`--systems`), cold, then warm from its own cache file.

`--gets` puts a counting proxy before s3rver and prints each read's GETs; `--perf PREFIX`
splits each system's first cold read of each kind by stage (bench/probes/_perfstages.py, whose
"Python" lines are a C++ daemon's own code for s3fs).

    python -m bench.probes.fuse_floor --read-mib 256 --reps 3 --systems floor,pffs,s3fs
    python -m bench.probes.fuse_floor --read-mib 256 --reps 1 --systems pffs --gets --perf /tmp/f
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from bench.counting import CountingProxy
from bench.data import client
from bench.leftovers import stopped_cleanly, unmount
from bench.probes import _perfstages as perfstages
from bench.probes._floorfs import FILE_NAME, PART_NAMES, SCAN_READERS, file_spans, serve, serve_file
from bench.scenarios import drop_caches
from bench.servers import Launcher
from bench.systems import Pffs as PffsSystem
from bench.systems import S3fs, System, cpu_seconds, mount_system
from pffs.cli.stats_view import read_snapshot, series, total
from pffs.config import FuseConfig
from pffs.mounting.kernel import find_mount, set_kernel_readahead

MIB = 1 << 20
GIB = 1 << 30
READ_SIZE = MIB  # each reader's read(2)
# How a read is made: one thread; 4 threads at 4 offsets of one file; 4 threads on 4 files.
MODES = ("1 reader", "4 offsets", "4 files")


def lookups(mountpoint: str, pid: int, files: int, reps: int) -> list[float]:
    """CPU microseconds of the serving process per stat that became a LOOKUP, per repetition."""
    paths = [os.path.join(mountpoint, "wide", f"f{i:07d}") for i in range(files)]
    figures = []
    for _ in range(reps):
        if not drop_caches("2"):  # dentries and inodes: every stat below asks the file system
            raise SystemExit("fuse_floor: the dentries cannot be dropped (run as root)")
        before = cpu_seconds(pid)
        for path in paths:
            os.stat(path)
        after = cpu_seconds(pid)
        if before is None or after is None:
            raise SystemExit(f"fuse_floor: process {pid} is gone")
        figures.append((after - before) / files * 1e6)
    return figures


# --- the read floor (--read-mib) ----------------------------------------------------------


def reader_spans(size: int, readers: int) -> list[tuple[int, int]]:
    """(offset, length) of each reader's share of a file of `size` bytes: `readers` contiguous
    spans, each a whole number of reads but the last, which takes what is left."""
    share = -(-size // readers)
    share = -(-share // READ_SIZE) * READ_SIZE
    spans = []
    for offset in range(0, size, share):
        spans.append((offset, min(share, size - offset)))
    return spans


def read_jobs(mountpoint: str, mode: str, size: int) -> list[tuple[str, int, int]]:
    """(path, offset, length) of each thread's share of a read of `size` bytes in `mode`."""
    whole = os.path.join(mountpoint, FILE_NAME)
    if mode == "1 reader":
        return [(whole, 0, size)]
    if mode == "4 offsets":
        return [(whole, offset, length) for offset, length in reader_spans(size, SCAN_READERS)]
    quarter = size // SCAN_READERS
    return [(os.path.join(mountpoint, name), 0, quarter) for name in PART_NAMES]


def read_spans(jobs: list[tuple[str, int, int]]) -> None:
    """Read each (path, offset, length) in READ_SIZE reads, one thread each, into a buffer of
    its own."""

    def read_span(path: str, offset: int, length: int) -> None:
        buffer = bytearray(READ_SIZE)
        fd = os.open(path, os.O_RDONLY)
        try:
            end = offset + length
            while offset < end:
                got = os.preadv(fd, [memoryview(buffer)[: min(READ_SIZE, end - offset)]], offset)
                if got <= 0:
                    raise SystemExit(f"fuse_floor: {path} ended at {offset}, before {end}")
                offset += got
        finally:
            os.close(fd)

    threads = [threading.Thread(target=read_span, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def timed_read(mountpoint: str, mode: str, pid: int, size: int) -> tuple[float, float]:
    """(serving CPU-s per GiB, MB/s) of one read of `size` bytes in `mode` from a dropped page
    cache."""
    if not drop_caches("1"):  # the page cache: every byte below is asked of the file system
        raise SystemExit("fuse_floor: the page cache cannot be dropped (run as root)")
    time.sleep(0.2)
    before, started = cpu_seconds(pid), time.perf_counter()
    read_spans(read_jobs(mountpoint, mode, size))
    seconds, after = time.perf_counter() - started, cpu_seconds(pid)
    if before is None or after is None:
        raise SystemExit(f"fuse_floor: process {pid} is gone")
    return (after - before) / (size / GIB), size / seconds / 1e6


def spread(values: list[float], digits: int = 2) -> str:
    """`values` as the repetitions, then their median and range."""
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{each} (median {median:.{digits}f}, {ordered[0]:.{digits}f}-{ordered[-1]:.{digits}f})"


def sizes_text(counts: dict[int, int]) -> str:
    """READs counted by size, largest count first: `1024 KiB x256, 128 KiB x2`."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], -item[0]))
    return ", ".join(f"{size // 1024} KiB x{n}" for size, n in ordered)


def kernel_readahead_kib(mountpoint: str) -> str:
    """The kernel's readahead for a mount (its backing device's read_ahead_kb)."""
    entry = find_mount(mountpoint)
    try:
        with open(f"/sys/class/bdi/{entry.device}/read_ahead_kb") as f:  # type: ignore[union-attr]
            return f.read().strip()
    except (OSError, AttributeError):
        return "?"


class Rows:
    """Each read's figures, repetitions pooled, printed as a table at the end."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = collections.defaultdict(list)
        self.rate: dict[str, list[float]] = collections.defaultdict(list)

    def add(self, label: str, figures: tuple[float, float]) -> None:
        self.cpu[label].append(figures[0])
        self.rate[label].append(figures[1])
        print(f"  {label}: {figures[0]:.2f} CPU-s/GiB, {figures[1]:.0f} MB/s", flush=True)

    def print(self) -> None:
        print("\nserving process, CPU-s per GiB read | MB/s")
        for label, cpu in self.cpu.items():
            print(f"  {label:34} {spread(cpu)} | {spread(self.rate[label], 0)}")


def floor_reads(work: str, mib: int, reps: int, rows: Rows, perf: str | None) -> None:
    """The minimal file system's reads in each of MODES, `reps` each."""
    mountpoint, counts = os.path.join(work, "floor"), os.path.join(work, "counts.json")
    os.mkdir(mountpoint)
    argv = [sys.executable, "-m", "bench.probes.fuse_floor", "--serve", mountpoint]
    child = subprocess.Popen([*argv, "--read-mib", str(mib), "--counts", counts])
    try:
        _wait_mounted(mountpoint, child)
        set_kernel_readahead(mountpoint, FuseConfig.kernel_readahead)  # as pffs at its init
        print(f"floor: kernel readahead {kernel_readahead_kib(mountpoint)} KiB", flush=True)
        for mode in MODES:
            for rep in range(reps):
                split = _split_by_stage(perf if rep == 0 else None, child.pid, f"floor-{mode}")
                figures = timed_read(mountpoint, mode, child.pid, mib * MIB)
                rows.add(f"floor, {mode}", figures)
                print(f"    READs: {sizes_text(_counts(child, counts))}")
                split(figures[0])
    finally:
        subprocess.run(["fusermount3", "-u", mountpoint], check=False)
        child.wait(timeout=10)


def _counts(child: subprocess.Popen[bytes], path: str) -> dict[int, int]:
    """The READ sizes the floor counted since the last call."""
    if os.path.exists(path):
        os.unlink(path)
    child.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.01)
    with open(path, encoding="utf-8") as f:
        return {int(size): n for size, n in json.load(f).items()}


def _wait_mounted(mountpoint: str, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline or child.poll() is not None:
            raise SystemExit("fuse_floor: the minimal file system did not mount")
        time.sleep(0.05)


def store_reads(
    work: str,
    mib: int,
    reps: int,
    systems: list[str],
    rows: Rows,
    count_gets: bool,
    perf: str | None,
    pffs_options: list[str],
) -> None:
    """pffs (memory tier only, and `pffs_options`) and s3fs over s3rver at 0 ms: a cold read
    then a warm one, on a fresh mount each repetition; with `count_gets`, through a counting
    proxy (its own process) whose GETs each read prints; with `perf`, each system's first cold
    read of each kind split by stage from perf's samples (bench/probes/_perfstages.py) into
    PERF-<system>-<mode>.data."""
    store = Launcher(work).s3rver()
    proxy = CountingProxy(store) if count_gets else None
    server = store if proxy is None else proxy.server
    try:
        s3 = client(store)
        s3.create_bucket(Bucket="floor")
        content = memoryview(os.urandom(mib * MIB))
        for name, (offset, length) in file_spans(mib * MIB).items():
            s3.upload_fileobj(io.BytesIO(content[offset : offset + length]), "floor", name)
        del content
        chosen: dict[str, Callable[[], System]] = {
            "pffs": lambda: PffsSystem(["--cache-dir", "none", *pffs_options]),
            "s3fs": S3fs,
        }
        for name in systems:
            print(f"{name} (load {os.getloadavg()[0]:.1f})", flush=True)
            for mode in MODES:
                for rep in range(reps):
                    base = tempfile.mkdtemp(prefix=f"{name}-{rep}-", dir=work)
                    mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
                    os.mkdir(mountpoint)
                    os.mkdir(cache)
                    pid = mount_system(chosen[name](), server, "floor", mountpoint, cache)
                    if pid is None:
                        raise SystemExit(f"fuse_floor: no process found serving {name}")
                    try:
                        label = f"{name}, {mode}"
                        _gets_text(proxy)  # the mount's own requests (listing, HEAD)
                        split = _split_by_stage(perf if rep == 0 else None, pid, f"{name}-{mode}")
                        served = _served(mountpoint) if name == "pffs" else None
                        cold = timed_read(mountpoint, mode, pid, mib * MIB)
                        rows.add(f"{label}, cold", cold)
                        print(_gets_text(proxy), end="")
                        split(cold[0])
                        if served is not None:
                            served = _served_text(mountpoint, served, mib * MIB)
                        rows.add(f"{label}, warm", timed_read(mountpoint, mode, pid, mib * MIB))
                        print(_gets_text(proxy), end="")
                        if served is not None:
                            _served_text(mountpoint, served, mib * MIB)
                        if rep == 0 and mode == MODES[0]:
                            print(f"    kernel readahead {kernel_readahead_kib(mountpoint)} KiB")
                    finally:
                        unmount(mountpoint)
                        _wait_gone(pid)
    finally:
        if proxy is not None:
            proxy.stop()
        store.stop()


def _split_by_stage(perf: str | None, pid: int, label: str) -> Callable[[float], None]:
    """With `perf`, start perf's samples of `pid` into PERF-<label>.data; the function returned
    ends them and prints the read's CPU-s/GiB (its argument) split by stage. Without, nothing."""
    if perf is None:
        return lambda _cpu_per_gib: None
    data = f"{perf}-{label.replace(' ', '-')}.data"
    sampler = perfstages.record(pid, data)

    def split(cpu_per_gib: float) -> None:
        perfstages.stop(sampler)
        print(f"    by stage ({data}):")
        print(perfstages.table(data, cpu_per_gib))

    return split


def _gets_text(proxy: CountingProxy | None) -> str:
    """The GETs since the last call and the bytes they brought, a line, or nothing."""
    if proxy is None:
        return ""
    gets = proxy.restart_count().get("GET", 0)
    mib = proxy.store_bytes / MIB
    return f"    GETs: {gets}, {mib:.0f} MiB, {mib / max(gets, 1):.1f} MiB each\n"


def _served(mountpoint: str) -> dict[str, float]:
    """pffs's bytes served to READs so far, by the tier that held them."""
    values = series(read_snapshot(mountpoint))
    return {
        tier: total(values, "pffs_cache_served_bytes_total", tier=tier)
        for tier in ("memory", "disk", "store")
    }


def _served_text(mountpoint: str, before: dict[str, float], size: int) -> dict[str, float]:
    """Print the shares of a read's `size` bytes pffs served from each tier since `before` (the
    rest came some other way: a region's streamed spans, pffs.fs.regions); the counts now."""
    now = _served(mountpoint)
    shares = ", ".join(f"{tier} {(now[tier] - before[tier]) / size:.2f}" for tier in now)
    print(f"    pffs served, by tier: {shares}")
    return now


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)


def read_floor(
    mib: int,
    reps: int,
    systems: list[str],
    count_gets: bool,
    perf: str | None,
    pffs_options: list[str],
) -> None:
    print(f"one file of {mib} MiB, {reps} reps, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = Rows()
    with (
        stopped_cleanly(),
        tempfile.TemporaryDirectory(prefix="pffs-read-floor-", dir="/var/tmp") as work,
    ):
        if "floor" in systems:
            floor_reads(work, mib, reps, rows, perf)
        if stores := [s for s in systems if s != "floor"]:
            store_reads(work, mib, reps, stores, rows, count_gets, perf, pffs_options)
    rows.print()
    print(f"load at the end {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--read-mib",
        type=int,
        metavar="N",
        help="measure a sequential read of a file of N MiB instead of lookups",
    )
    parser.add_argument(
        "--systems",
        default="floor,pffs,s3fs",
        help="with --read-mib: which of floor, pffs, s3fs read it (all three)",
    )
    parser.add_argument(
        "--gets",
        action="store_true",
        help="with --read-mib: pffs and s3fs through a counting proxy, each read's GETs printed",
    )
    parser.add_argument(
        "--perf",
        metavar="PREFIX",
        help="with --read-mib: perf's samples of each system's first (cold) read of each kind "
        "(PREFIX-<system>-<mode>.data), its CPU per GiB split by stage",
    )
    parser.add_argument(
        "--pffs-options",
        default="",
        help="with --read-mib: more `pffs mount` options, quoted (after --cache-dir none)",
    )
    parser.add_argument("--serve", metavar="MOUNTPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)  # the read floor's READ sizes
    args = parser.parse_args()
    if args.serve and args.read_mib:
        serve_file(args.serve, args.read_mib, args.counts)
        return
    if args.serve:
        serve(args.serve, args.files)
        return
    if args.read_mib:
        systems = args.systems.split(",")
        if unknown := set(systems) - {"floor", "pffs", "s3fs"}:
            parser.error(f"unknown system {sorted(unknown)[0]!r}")
        read_floor(
            args.read_mib, args.reps, systems, args.gets, args.perf, args.pffs_options.split()
        )
        return
    with tempfile.TemporaryDirectory(prefix="pffs-fuse-floor-") as work:
        mountpoint = os.path.join(work, "mnt")
        os.mkdir(mountpoint)
        argv = [sys.executable, "-m", "bench.probes.fuse_floor", "--serve", mountpoint]
        child = subprocess.Popen([*argv, "--files", str(args.files)])
        try:
            deadline = time.monotonic() + 10
            while not os.path.ismount(mountpoint):
                if time.monotonic() > deadline or child.poll() is not None:
                    raise SystemExit("fuse_floor: the minimal file system did not mount")
                time.sleep(0.05)
            floor = lookups(mountpoint, child.pid, args.files, args.reps)
        finally:
            subprocess.run(["fusermount3", "-u", mountpoint], check=False)
            child.wait(timeout=10)
        print(f"pyfuse3 + trio alone: {_figures(floor)} us CPU a lookup")
        tree = os.path.join(work, "tree", "wide")
        os.makedirs(tree)
        for i in range(args.files):
            os.mknod(os.path.join(tree, f"f{i:07d}"))
        mounted = subprocess.run(
            [
                sys.executable,
                "-m",
                "pffs",
                "mount",
                f"file://{os.path.dirname(tree)}",
                mountpoint,
                "--cache-dir",
                "none",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(mounted.stdout.split("(pid ", 1)[1].split(",", 1)[0])
        try:
            os.listdir(os.path.join(mountpoint, "wide"))  # pffs lists it once
            ours = lookups(mountpoint, pid, args.files, args.reps)
        finally:
            subprocess.run([sys.executable, "-m", "pffs", "umount", mountpoint], check=False)
        print(f"pffs:                 {_figures(ours)} us CPU a lookup")


def _figures(values: list[float]) -> str:
    return " ".join(f"{value:.0f}" for value in values)


if __name__ == "__main__":
    main()

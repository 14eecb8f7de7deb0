"""The scenarios, run against one mount, and the ceilings measured outside any mount.

fio runs the I/O patterns (jobs in bench/jobs/*.fio); Python timers measure what fio does not
fit (time to first byte, small files, metadata, write then verify). The page cache is dropped
before each scenario where this process may (root).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.clients import PATTERNS, fetched_key, seconds_key
from bench.data import MIB, SMALL_SIZE, TTFB_SAMPLES, Dataset, client, ttfb_directories
from bench.epoch import read_epoch
from bench.largeobjects import CHECKPOINT_KEY, checkpoint_load, read_shards, shard_keys
from bench.lazyload import KEY as LAZY_KEY
from bench.lazyload import TENSOR_SIZE, fetched_bytes, lazy_load, picked
from bench.metadata import TREE_DIRS, list_long, ls_recursive, stat_after_listing, stat_all
from bench.servers import Server
from bench.systems import cpu_seconds, peak_rss_mib, reset_peak_rss

JOBS = os.path.join(os.path.dirname(__file__), "jobs")


LARGER_THAN_CACHE = "epoch2_larger_cached_pct"
LAZY = "checkpoint_lazy_s"
LAZY_FETCHED = "checkpoint_lazy_fetched_x"


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool


METRICS = [
    Metric("epoch1_files_per_s", "training epoch 1, cold (8 readers)", "files/s", True),
    Metric("epoch2_files_per_s", "training epoch 2 (page cache dropped)", "files/s", True),
    Metric("epoch2_remount_files_per_s", "training epoch 2 after a remount", "files/s", True),
    Metric("epoch2_remount_requests", "store requests during it", "requests", False),
    Metric("epoch_peak_rss_mib", "peak RSS of the mount during the epochs", "MiB", False),
    Metric(LARGER_THAN_CACHE, "dataset twice the cache: epoch 2 from cache", "%", True),
    Metric("ttfb_ms", f"time to first byte, cold file (median of {TTFB_SAMPLES})", "ms", False),
    Metric("seq_cold_mbs", "sequential read, cold", "MB/s", True),
    Metric("seq_cold_cpu_s_per_gib", "mount CPU over the cold read", "CPU-s/GiB", False),
    Metric("seq_cold_store_cpu_s_per_gib", "store CPU over it", "CPU-s/GiB", False),
    Metric("seq_warm_mbs", "sequential read, warm (page cache dropped)", "MB/s", True),
    Metric("rand_psync_iops", "random 4 KiB reads, psync", "IOPS", True),
    Metric("rand_libaio_iops", "random 4 KiB reads, libaio depth 16", "IOPS", True),
    Metric("small_files_per_s", "small files (64 KiB), cold", "files/s", True),
    Metric("ls_wide_s", "ls -l of the wide directory, cold", "s", False),
    Metric("stat_wide_per_s", "stat of every file in it", "stats/s", True),
    Metric("stat_listed_per_s", "stat of every file right after ls -l", "stats/s", True),
    Metric("stat_expired_per_s", "stat of every file after ls -l, TTL passed", "stats/s", True),
    Metric("lsr_100k_s", "ls -lR of the tree (100 directories), cold", "s", False),
    Metric("lsr_rss_bytes_per_entry", "mount RSS growth over it, per entry", "bytes", False),
    Metric("parallel_mbs", "4 parallel readers, cold", "MB/s", True),
    Metric("checkpoint_mbs", "checkpoint load: one large file, 8 MiB reads, cold", "MB/s", True),
    Metric("checkpoint_cpu_s_per_gib", "mount CPU over the checkpoint load", "CPU-s/GiB", False),
    Metric("checkpoint_store_cpu_s_per_gib", "store CPU over it", "CPU-s/GiB", False),
    Metric(LAZY, "checkpoint, lazy: safe_open + 6 tensors (mmap), cold", "s", False),
    Metric(LAZY_FETCHED, "bytes fetched over the tensors' bytes in it", "x", False),
    Metric("shards_mbs", "shards read whole, 4 readers, shuffled, cold", "MB/s", True),
    Metric("shards_cpu_s_per_gib", "mount CPU over the shards", "CPU-s/GiB", False),
    Metric("shards_store_cpu_s_per_gib", "store CPU over them", "CPU-s/GiB", False),
    Metric("write_mbs", "sequential write + close, verified", "MB/s", True),
    *(
        metric
        for pattern, label in (
            ("parquet_columns", "pyarrow Parquet: 2 of 20 columns, 4 files at a time"),
            ("parquet_scan", "pyarrow Parquet: files read whole, 4 at a time"),
            ("safetensors_lazy", "safetensors: safe_open + 6 tensors (mmap)"),
            ("safetensors_full", "safetensors: every tensor (load_file's way, mmap)"),
            ("arrow_batches", "Arrow file by mmap, random row batches (datasets' way)"),
            ("tar", "tar shards through tarfile, 4 readers (WebDataset's way)"),
        )
        for metric in (
            Metric(seconds_key(pattern), f"{label}, cold", "s", False),
            Metric(fetched_key(pattern), "bytes fetched over bytes the client read", "x", False),
        )
    ),
    Metric("peak_rss_mib", "peak RSS of the mount process", "MiB", False),
    Metric("session_peak_rss_mib", "peak RSS of the whole session (no reset)", "MiB", False),
]
# Figures only pffs's own counters give: the peers show "n/a" (bench.larger_than_cache,
# bench.lazyload).
PFFS_ONLY = {LARGER_THAN_CACHE, LAZY_FETCHED}
# The clients scenario (bench.clients): a mount of its own per system; `--only clients` names
# all its figures.
CLIENTS = "clients"
CLIENT_KEYS = [key for pattern in PATTERNS for key in (seconds_key(pattern), fetched_key(pattern))]
# Figures taken while another scenario runs, measured when that one is.
TAKEN_WITH = {
    **{fetched_key(pattern): seconds_key(pattern) for pattern in PATTERNS},
    "seq_cold_cpu_s_per_gib": "seq_cold_mbs",
    "seq_cold_store_cpu_s_per_gib": "seq_cold_mbs",
    "checkpoint_cpu_s_per_gib": "checkpoint_mbs",
    "checkpoint_store_cpu_s_per_gib": "checkpoint_mbs",
    "shards_cpu_s_per_gib": "shards_mbs",
    "shards_store_cpu_s_per_gib": "shards_mbs",
    LAZY_FETCHED: LAZY,
    "epoch_peak_rss_mib": "epoch1_files_per_s",
    "epoch2_remount_requests": "epoch2_remount_files_per_s",
    "lsr_rss_bytes_per_entry": "lsr_100k_s",
}
# Past this kernel TTL, stat_expired_per_s drops the kernel's dentries and inodes instead of
# waiting for them to expire (a mount that trusts its metadata indefinitely); --quick waits
# for none longer than a peer's (pffs's 60 s would be a quarter of its run).
LONGEST_TTL_WAITED = 60.0
LONGEST_TTL_WAITED_QUICK = 2.0


def drop_caches(what: str = "3") -> bool:
    """Drop the page cache and the dentries and inodes ("3"), or only the latter two ("2")."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(what)
        return True
    except OSError:
        return False


def fio(job: str, **variables: str) -> dict[str, Any]:
    env = {**os.environ, **variables}
    result = subprocess.run(
        ["fio", "--readonly", "--output-format=json", os.path.join(JOBS, job)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"fio {job}: {result.stderr.strip()[-200:] or result.stdout[-200:]}")
    report: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{") :])
    read: dict[str, Any] = report["jobs"][0]["read"]
    return read


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


FIRST_BYTE_STEPS = ("directory", "file", "open", "read")


def first_byte_steps(mountpoint: str, directory: str, offset: int | None = None) -> list[float]:
    """Milliseconds of each step of a first byte of `directory`/f.bin, cold: the directory's
    lookup, the file's, its open and the first `read(1)` of a buffered reader (Python's, whose
    buffer is the file's st_blksize), or with `offset` a 4 KiB pread there (a lazy loader's
    first touch of a checkpoint, as mmap makes it)."""
    folder = os.path.join(mountpoint, directory)
    path = os.path.join(folder, "f.bin")
    steps = [_timed(lambda: os.stat(folder)), _timed(lambda: os.stat(path))]
    started = time.perf_counter()
    with open(path, "rb") as handle:
        steps.append(time.perf_counter() - started)
        started = time.perf_counter()
        data = handle.read(1) if offset is None else os.pread(handle.fileno(), 4096, offset)
        if not data:
            raise RuntimeError(f"{path}: empty read")
        steps.append(time.perf_counter() - started)
    return [step * 1000 for step in steps]


class Scenarios:
    """Every scenario against one mountpoint, in an order that keeps "cold" cold."""

    def __init__(
        self,
        mountpoint: str,
        dataset: Dataset,
        server: Server,
        quick: bool,
        only: set[str] | None = None,
        pid: int | None = None,
        kernel_ttl: float = 1.0,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.only = only  # metric keys to measure; None: all of them
        self.pid = pid  # the mount process, for its CPU time and RSS
        self.kernel_ttl = kernel_ttl  # the system's entry/attribute timeout, for stat_expired
        self.longest_ttl_waited = LONGEST_TTL_WAITED_QUICK if quick else LONGEST_TTL_WAITED
        self.progress = progress  # told of each scenario as it starts: key, n, of how many
        self.peak_rss_before_reset: float | None = None  # VmHWM before epoch 1 reset it
        self.mnt = mountpoint
        self.data = dataset
        self.server = server
        self.runtime = "1" if quick else "10"  # seconds of each random-read run

    def path(self, key: str) -> str:
        return os.path.join(self.mnt, key)

    def run_all(self, system: str) -> dict[str, float | str]:
        results: dict[str, float | str] = {}
        # The epochs come first: epoch 1 is the mount's first work, as a training job's is.
        steps: list[tuple[str, Callable[[], float]]] = [
            ("epoch1_files_per_s", lambda: self.epoch(1, results)),
            ("epoch2_files_per_s", lambda: self.epoch(2, results)),
            ("ttfb_ms", self.ttfb),
            ("seq_cold_mbs", lambda: self.seq_cold(results)),
            ("seq_warm_mbs", self.seq_read),
            ("rand_psync_iops", lambda: self.randread("psync", "1")),
            ("rand_libaio_iops", lambda: self.randread("libaio", "16")),
            ("small_files_per_s", self.small_files),
            ("ls_wide_s", self.ls_wide),
            ("stat_wide_per_s", self.stat_wide),
            ("stat_listed_per_s", self.stat_listed),
            ("stat_expired_per_s", self.stat_expired),
            ("lsr_100k_s", lambda: self.ls_tree(results)),
            ("parallel_mbs", self.parallel),
            ("checkpoint_mbs", lambda: self.checkpoint(results)),
            (LAZY, lambda: self.checkpoint_lazy(results)),
            ("shards_mbs", lambda: self.shards(results)),
            ("write_mbs", lambda: self.write_verify(system)),
        ]
        steps = [(key, step) for key, step in steps if self.only is None or key in self.only]
        for index, (key, step) in enumerate(steps, 1):
            if self.progress is not None:
                self.progress(key, index, len(steps))
            drop_caches()
            try:
                results[key] = round(step(), 3)
            except Exception as exc:  # reported per scenario; the others still run
                results[key] = f"error: {str(exc).splitlines()[0][:160]}"
        results["verified"] = "yes" if self.verify_large() else "NO: bytes differ"
        return results

    def epoch(self, number: int, results: dict[str, float | str]) -> float:
        """One pass over the training set, in an order of its own; epoch 1 also resets the
        mount's peak RSS first, and epoch 2 reads it after, so the peak is the epochs' own."""
        if number == 1:
            self.peak_rss_before_reset = peak_rss_mib(self.pid)
            reset_peak_rss(self.pid)
        files_per_s = read_epoch(
            self.mnt, self.data.epoch_keys, self.data.sizes.epoch_size, seed=number
        )
        if number == 2 and (rss := peak_rss_mib(self.pid)) is not None:
            results["epoch_peak_rss_mib"] = round(rss, 1)
        return files_per_s

    def seq_cold(self, results: dict[str, float | str]) -> float:
        """The cold sequential read, and the mount's CPU-seconds per GiB over it."""
        return self._with_cpu(results, "seq_cold", self.data.sizes.large, self.seq_read)

    def checkpoint(self, results: dict[str, float | str]) -> float:
        """The checkpoint load, and the mount's CPU-seconds per GiB over it."""
        sizes = self.data.sizes
        path, digest = self.path(CHECKPOINT_KEY), self.data.checkpoint_sha256
        return self._with_cpu(
            results,
            "checkpoint",
            sizes.checkpoint,
            lambda: checkpoint_load(path, sizes.checkpoint, digest),
        )

    def checkpoint_lazy(self, results: dict[str, float | str]) -> float:
        """`safe_open` and a few tensors of the safetensors checkpoint (bench.lazyload); on
        pffs, the bytes it fetched meanwhile over the tensors' bytes."""
        before = fetched_bytes(self.mnt)
        seconds = lazy_load(self.path(LAZY_KEY), self.data.lazy_sha256)
        after = fetched_bytes(self.mnt)
        if before is None or after is None:
            results[LAZY_FETCHED] = "n/a: pffs's counters only"
        else:
            read = len(picked(len(self.data.lazy_sha256))) * TENSOR_SIZE
            results[LAZY_FETCHED] = round((after - before) / read, 2)
        return seconds

    def shards(self, results: dict[str, float | str]) -> float:
        """The shards, read whole by four readers, and the mount's CPU-seconds per GiB."""
        sizes = self.data.sizes
        paths = [self.path(key) for key in shard_keys(sizes.shard_files)]
        return self._with_cpu(
            results,
            "shards",
            sizes.shard_files * sizes.shard_size,
            lambda: read_shards(paths, self.data.shard_sha256, seed=1),
        )

    def _with_cpu(
        self, results: dict[str, float | str], name: str, size: int, read: Callable[[], float]
    ) -> float:
        """`read()`'s figure; the CPU-seconds per GiB over it (/proc/PID/stat: every thread) of
        the mount into results[name + "_cpu_s_per_gib"] and of the store's own processes
        (server.store_pids) into results[name + "_store_cpu_s_per_gib"]."""
        sides = {"": (self.pid,), "_store": self.server.store_pids}
        before = {side: _cpu_of(pids) for side, pids in sides.items()}
        figure = read()
        for side, pids in sides.items():
            start, end = before[side], _cpu_of(pids)
            if start is not None and end is not None:
                per_gib = (end - start) / (size / (1 << 30))
                results[f"{name}{side}_cpu_s_per_gib"] = round(per_gib, 3)
        return figure

    def ttfb(self) -> float:
        """The median first byte of the cold samples (one sample is too few on this machine)."""
        totals = []
        for directory in ttfb_directories():
            drop_caches()
            totals.append(sum(first_byte_steps(self.mnt, directory)))
        return statistics.median(totals)

    def seq_read(self) -> float:
        report = fio("seqread.fio", FILE=self.path("large.bin"), SIZE=str(self.data.sizes.large))
        return float(report["bw_bytes"]) / 1e6

    def randread(self, engine: str, depth: str) -> float:
        report = fio(
            "randread.fio",
            FILE=self.path("large.bin"),
            SIZE=str(self.data.sizes.large),
            RUNTIME=self.runtime,
            IOENGINE=engine,
            IODEPTH=depth,
        )
        return float(report["iops"])

    def small_files(self) -> float:
        def read_all() -> None:
            for key in self.data.small_keys:
                with open(self.path(key), "rb") as f:
                    if len(f.read()) != SMALL_SIZE:
                        raise RuntimeError(f"{key}: short read")

        return len(self.data.small_keys) / _timed(read_all)

    def ls_wide(self) -> float:
        return _timed(lambda: list_long(self.path("wide"), len(self.data.wide_keys)))

    def stat_wide(self) -> float:
        return stat_all([self.path(key) for key in self.data.wide_keys])

    def stat_listed(self) -> float:
        """`ls -l` of the wide directory, then stat of each file at once."""
        paths = [self.path(key) for key in self.data.wide_keys]
        return stat_after_listing(self.path("wide"), paths, wait=0)

    def stat_expired(self) -> float:
        """`ls -l`, then stat of each file once the kernel's TTL has passed: the listing's
        entries and attributes are stale in the kernel, only the system's own caches hold."""
        paths = [self.path(key) for key in self.data.wide_keys]
        if self.kernel_ttl <= self.longest_ttl_waited:
            return stat_after_listing(self.path("wide"), paths, wait=self.kernel_ttl + 1)
        return stat_after_listing(self.path("wide"), paths, 0, forget=lambda: drop_caches("2"))

    def ls_tree(self, results: dict[str, float | str]) -> float:
        """`ls -lR` of the tree, cold, and the mount's RSS growth per entry over it."""
        files = self.data.sizes.tree_files + 1  # and TREE_MARKER
        seconds, per_entry = ls_recursive(self.path("tree"), files, TREE_DIRS, self.pid)
        if per_entry is not None:
            results["lsr_rss_bytes_per_entry"] = round(per_entry, 1)
        return seconds

    def parallel(self) -> float:
        quarter = self.data.sizes.parallel // 4
        report = fio("parallel.fio", FILE=self.path("parallel.bin"), QUARTER=str(quarter))
        return float(report["bw_bytes"]) / 1e6

    def write_verify(self, system: str) -> float:
        key = f"written/{system}.bin"
        size = self.data.sizes.write
        block = os.urandom(MIB)
        digest = hashlib.sha256()

        def write() -> None:
            os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
            with open(self.path(key), "wb") as f:
                for _ in range(size // MIB):
                    f.write(block)
                    digest.update(block)

        started = time.perf_counter()
        write()
        closed = time.perf_counter() - started
        # Some systems upload after close returns (rclone's write-back): the figure is the
        # throughput until the bytes are verifiably in the store, and how long close took.
        while not self._stored_matches(key, digest.hexdigest()):
            if time.perf_counter() - started > closed + 120:
                raise RuntimeError("the store never held what was written")
            time.sleep(0.5)
        return size / (time.perf_counter() - started) / 1e6

    def _stored_matches(self, key: str, expected: str) -> bool:
        s3 = client(self.server)
        try:
            body = s3.get_object(Bucket=self.data.bucket, Key=key)["Body"]
        except s3.exceptions.NoSuchKey:
            return False
        stored = hashlib.sha256()
        while chunk := body.read(8 * MIB):
            stored.update(chunk)
        return stored.hexdigest() == expected

    def verify_large(self) -> bool:
        digest = hashlib.sha256()
        with open(self.path("large.bin"), "rb") as f:
            while chunk := f.read(8 * MIB):
                digest.update(chunk)
        return digest.hexdigest() == self.data.large_sha256


def _cpu_of(pids: tuple[int | None, ...]) -> float | None:
    """The CPU-seconds of these processes together; None when there are none or one is gone."""
    seconds = [cpu_seconds(pid) for pid in pids]
    if not seconds or None in seconds:
        return None
    return sum(s for s in seconds if s is not None)


def server_ceiling(
    server: Server, dataset: Dataset, parallel: int = 8, key: str = "large.bin", size: int = 0
) -> float:
    """The store's own throughput over the dataset's large file by default, else its `key` of
    `size` bytes (`object_ceiling`)."""
    return object_ceiling(server, dataset.bucket, key, size or dataset.sizes.large, parallel)


def object_ceiling(server: Server, bucket: str, key: str, size: int, parallel: int = 8) -> float:
    """Parallel ranged GETs of one object of `size` bytes with curl, in MB/s.

    The page cache is dropped first, as before the cold read it is compared with: a server
    on this machine then reads the object from disk in both.
    """
    url = client(server).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600
    )
    step = -(-size // parallel)

    def get(index: int) -> None:
        start, end = index * step, min(size, (index + 1) * step) - 1
        subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "-r", f"{start}-{end}", url],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "CURL_CA_BUNDLE"},
        )

    drop_caches()
    with ThreadPoolExecutor(parallel) as pool:
        elapsed = _timed(lambda: list(pool.map(get, range(parallel))))
    return size / elapsed / 1e6


def local_disk_ceiling(dataset: Dataset) -> float:
    """A sequential read of the same bytes from local disk (page cache dropped), in MB/s."""
    drop_caches()
    report = fio("seqread.fio", FILE=dataset.local_large, SIZE=str(dataset.sizes.large))
    return float(report["bw_bytes"]) / 1e6

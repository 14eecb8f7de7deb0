"""Four `pffs mount` processes on 127.0.0.2-5 for the cache group scenario (bench.group).

Each has its own cache directory and log; in a group they share a file:// member list and a
secret, each serving its peers on its own address. They are mounted at once (each `pffs mount`
returns once its mount answers), recorded with bench.leftovers so nothing outlives a stopped
bench, and unmounted on leaving, a SIGKILLed one included. `read_everything` reads the training
set through each at once, as the scenario's readers do, checking every file's bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.leftovers import track_mount, unmount
from bench.servers import Server
from pffs.testing.servers import free_port

MEMBERS = 4
READERS = 8  # threads per mount, a data loader's workers (bench.epoch.WORKERS)
SECRET = "bench-group-secret-0123456789"
_READ_CHUNK = 1 << 20


@dataclass
class Group:
    """The members' names, mountpoints and addresses under `root`."""

    root: Path
    names: list[str] = field(default_factory=lambda: [f"node{n}" for n in range(MEMBERS)])

    def __post_init__(self) -> None:
        self.addresses = {
            name: (f"127.0.0.{n + 2}", free_port()) for n, name in enumerate(self.names)
        }
        self.member_file = self.root / "members"
        self.member_file.write_text(
            "".join(f"{name} http://{h}:{p}\n" for name, (h, p) in self.addresses.items())
        )
        self.secret = self.root / "secret"
        self.secret.write_text(SECRET)

    def argv(
        self, name: str, bucket: str, server: Server, grouped: bool, extra: list[str]
    ) -> list[str]:
        mnt = self.root / name
        argv = [sys.executable, "-m", "pffs", "mount", f"s3://{bucket}", str(mnt)]
        argv += ["--endpoint-url", server.endpoint_url, "--cache-dir", str(self.root / f"c-{name}")]
        argv += ["--log-file", str(self.root / f"{name}.log")]
        if grouped:
            host, port = self.addresses[name]
            argv += ["--group-members", f"file://{self.member_file}"]
            argv += ["--group-listen", f"{host}:{port}", "--group-self", name]
            argv += ["--group-secret-file", str(self.secret)]
        return argv + extra


@contextmanager
def mounts(
    group: Group, bucket: str, server: Server, grouped: bool, extra: list[str] | None = None
) -> Iterator[dict[str, Path]]:
    """The members' mounts of `bucket` (in one group when `grouped`; `extra` options on each),
    by name; all unmounted on leaving."""
    points = {name: group.root / name for name in group.names}
    failures: list[str] = []

    def mount(name: str) -> None:
        points[name].mkdir()
        track_mount(str(points[name]))
        argv = group.argv(name, bucket, server, grouped, extra or [])
        done = subprocess.run(argv, env=server.env(), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            failures.append(f"{name}: {done.stderr.strip()[-300:]}")

    try:
        with ThreadPoolExecutor(len(points)) as pool:
            list(pool.map(mount, points))
        if failures:
            raise RuntimeError(f"pffs mount failed: {'; '.join(failures)}")
        yield points
    finally:  # at once: each unmount waits out its own retries, and the caches are not reused
        with ThreadPoolExecutor(len(points)) as pool:
            list(pool.map(unmount, map(str, points.values())))


def stats_of(mnt: Path) -> dict[str, float]:
    """The mount's metrics (.pffs/stats), each sample by name{labels}, an unlabelled
    histogram's as name_count, name_sum and name_bucket{le=...}; "pid" its process."""
    snapshot = json.loads((mnt / ".pffs" / "stats").read_text())
    out: dict[str, float] = {"pid": float(snapshot["pid"])}
    for name, family in snapshot["metrics"].items():
        for sample in family.get("samples", ()):
            label = ",".join(f"{k}={v}" for k, v in sorted(sample["labels"].items()))
            if "value" in sample:
                key = f"{name}{{{label}}}" if label else name
                out[key] = out.get(key, 0.0) + float(sample["value"])
            elif not label:  # a histogram: its count, sum and cumulative buckets
                out[f"{name}_count"] = float(sample["count"])
                out[f"{name}_sum"] = float(sample["sum"])
                for le, count in sample["buckets"]:
                    out[f"{name}_bucket{{le={le}}}"] = float(count)
    return out


@dataclass
class Reading:
    """What one mount's readers did: files/s, and each failure (an error or wrong bytes)."""

    files_per_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    wrong_bytes: int = 0


def read_everything(
    mounted: dict[str, Path],
    digests: dict[str, str],
    after_each: Callable[[str], None] = lambda name: None,
) -> tuple[dict[str, Reading], float]:
    """Every mount reads every file of `digests` whole, each in its own shuffled order with
    `READERS` threads, all at once, each file's SHA-256 checked; a failure is recorded, never
    raised, and the readers go on. `after_each(name)` runs after each file a mount read.
    Each mount's Reading, and the seconds until the last finished."""
    readings = {name: Reading() for name in mounted}
    lock = threading.Lock()

    def read_one(name: str, path: Path, key: str) -> None:
        digest = hashlib.sha256()
        try:
            with open(path / key, "rb", buffering=0) as f:
                while chunk := f.read(_READ_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            with lock:
                readings[name].errors.append(f"{name}/{key}: {exc.strerror or exc}")
            return
        if digest.hexdigest() != digests[key]:
            with lock:
                readings[name].wrong_bytes += 1
                readings[name].errors.append(f"{name}/{key}: wrong bytes")
        after_each(name)

    def read_mount(seed: int, name: str) -> None:
        order = sorted(digests)
        random.Random(seed).shuffle(order)
        started = time.perf_counter()
        with ThreadPoolExecutor(READERS) as pool:
            list(pool.map(lambda key: read_one(name, mounted[name], key), order))
        readings[name].files_per_s = len(order) / (time.perf_counter() - started)

    started = time.perf_counter()
    threads = [
        threading.Thread(target=read_mount, args=(seed, name))
        for seed, name in enumerate(mounted, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return readings, time.perf_counter() - started

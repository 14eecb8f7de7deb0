"""The cache group scenario: 4 mounts on one machine, one dataset, each block from the store once?

Part of `python -m bench` (once per server, after its systems' runs; `--only group`), and a
command of its own over s3rver: `python -m bench.group`. A training set of its own (a bucket
of its own) is put in the store near and read once straight from it (bench.data.prime), then
the store is put 20 ms away (a delay proxy) behind a counting proxy (bench.counting), which
counts the GETs and the bytes the store sends. Four
`pffs mount` processes on 127.0.0.2-5 (bench.groupmounts), each with its own cache directory,
read the whole training set at once, each in its own shuffled order with 8 threads, every
file's bytes checked:

- `group`: in one group (a file:// member list);
- `alone`: the same over fresh caches with the group off; `group` and `alone` run in
  `pairs` (3 in the full run), their order swapped each pair, and each is reported by its
  median run, with every run's wall time beside it (on two shared cores one pair's wall times
  differ by up to a fifth either way);
- `kill`: in a group again, fresh caches, and one member SIGKILLed once the others have read a
  third of their files: its peers' readers must see no error and exact bytes, and the store
  must send at most (1 + 1/N)x the dataset;
- `shared` (the full run only): not grouped, each over a shared tier (--shared-cache on a
  bucket of the same server, near: 0 ms);
- `latency`: on the group's mounts, 4 MiB blocks the group holds asked of their owners with the
  group's own client (pffs.group.client), and the same ranges of the store with boto3, one at a
  time: p50 and p99 of each.

Store bytes and GETs are multiples of the dataset's bytes and files. Run it under
`flock /tmp/pffs-bench.lock`: it is a timing run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.counting import CountingProxy
from bench.data import client, prime
from bench.groupmounts import MEMBERS, SECRET, Group, mounts, read_everything, stats_of
from bench.leftovers import run_trio
from bench.servers import Launcher, Server, Unavailable, far
from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.credentials import Credentials
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.placement import owner
from pffs.group.protocol import BlockRequest

MIB = 1 << 20
BUCKET = "pffs-group-bench"
SHARED_BUCKET = "pffs-shared-tier"
BLOCK = 4 * MIB
RTT_MS = 20.0  # the store's distance in every run of the scenario
KILL_AFTER = 1 / 3  # of the survivors' files read, when the victim is killed
VICTIM = "node3"


@dataclass(frozen=True)
class GroupSizes:
    files: int  # training files
    size: int  # bytes each
    big: int  # 4 MiB objects for the latencies
    rounds: int  # latency rounds over them
    shared: bool  # run the shared tier too
    pairs: int  # runs of `group` and of `alone`, interleaved

    @staticmethod
    def full() -> GroupSizes:
        return GroupSizes(files=400, size=256 * 1024, big=16, rounds=2, shared=True, pairs=3)

    @staticmethod
    def quick() -> GroupSizes:
        return GroupSizes(files=64, size=256 * 1024, big=4, rounds=2, shared=False, pairs=1)


@dataclass
class Dataset:
    keys: list[str]
    digests: dict[str, str]  # by key: the SHA-256 of each training file
    bigs: list[str]
    size: int

    @property
    def total(self) -> int:
        return len(self.keys) * self.size


def put_dataset(server: Server, sizes: GroupSizes) -> Dataset:
    s3 = client(server)
    s3.create_bucket(Bucket=BUCKET)
    digests = {}
    for n in range(sizes.files):
        key, body = f"train/{n:05d}.bin", os.urandom(sizes.size)
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        digests[key] = hashlib.sha256(body).hexdigest()
    bigs = [f"big/{n:03d}.bin" for n in range(sizes.big)]
    for key in bigs:
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(BLOCK))
    # The first run (a group run) was the slowest of six on both servers: it read each object
    # first after the upload. Read once here, no run pays that alone.
    prime(server, BUCKET, sorted(digests) + bigs)
    return Dataset(sorted(digests), digests, bigs, sizes.size)


def run(
    server: Server,
    root: Path,
    data: Dataset,
    grouped: bool,
    kill: bool = False,
    shared: Server | None = None,
    latency_rounds: int = 0,
) -> dict[str, Any]:
    """The four mounts read the training set at once through a counting proxy; the store's
    side, each mount's pace and its readers' failures. With `kill`, VICTIM is SIGKILLed
    mid-read; with `latency_rounds`, the peer hit and store GET latencies follow."""
    proxy = CountingProxy(server)
    extra = []
    if shared is not None:
        extra = ["--shared-cache", f"s3://{SHARED_BUCKET}/blocks"]
        extra += ["--shared-cache-endpoint", shared.endpoint_url]
    group = Group(root)
    if shared is not None:  # the tier's MAC key: the group's secret file serves as well
        extra += ["--shared-cache-secret-file", str(group.secret)]
    out: dict[str, Any] = {}
    try:
        with mounts(group, BUCKET, proxy.server, grouped, extra) as mounted:
            proxy.restart_count()  # the mounts' own checks at start are not the epoch's
            killer = Killer(mounted, len(data.keys)) if kill else None
            readings, seconds = read_everything(
                mounted, data.digests, killer.read if killer else lambda name: None
            )
            counts = proxy.restart_count()
            store_bytes = proxy.store_bytes
            alive = {n: m for n, m in mounted.items() if killer is None or n != VICTIM}
            stats = [stats_of(mnt) for mnt in alive.values()]
            if latency_rounds:
                out["latency"] = latencies(
                    server, proxy.server, group, mounted, data, latency_rounds
                )
    finally:
        proxy.stop()
    survivors = {n: r for n, r in readings.items() if killer is None or n != VICTIM}
    out.update({
        "store_bytes_x": round(store_bytes / data.total, 3),
        "store_gets_x": round(counts.get("GET", 0) / len(data.keys), 3),
        "peer_bytes_x": round(
            sum(s.get("pffs_group_peer_bytes_total{way=received}", 0.0) for s in stats)
            / data.total,
            3,
        ),
        "files_per_s": {n: round(r.files_per_s, 1) for n, r in sorted(survivors.items())},
        "seconds": round(seconds, 2),
        "reader_errors": sum(len(r.errors) for r in survivors.values()),
        "wrong_bytes": sum(r.wrong_bytes for r in survivors.values()),
        "first_errors": [e for r in survivors.values() for e in r.errors][:3],
    })  # fmt: skip
    if shared is not None:
        out["tier"] = tier_counts(stats)
    if killer is not None:
        out["killed"] = VICTIM
        out["killed_after_files"] = killer.killed_after
        out["bound_x"] = round(1 + 1 / MEMBERS, 3)
    return out


# The shared tier's counters (pffs.group.stats), summed over the mounts: its origin fetches by
# reason, its claims by outcome, its writes by outcome; then its waiters' waits and polls.
TIER_COUNTERS = {
    "origin": "pffs_group_tier_origin_total",
    "claims": "pffs_group_claims_total",
    "writes": "pffs_group_tier_writes_total",
}


def tier_counts(stats: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for short, metric in TIER_COUNTERS.items():
        counts: dict[str, int] = {}
        for mount in stats:
            for key, value in mount.items():
                if key.startswith(metric + "{"):
                    label = key[len(metric) + 1 : -1].split("=", 1)[1]
                    counts[label] = counts.get(label, 0) + int(value)
        out[short] = dict(sorted(counts.items()))
    out["waits"] = histogram(stats, "pffs_group_tier_wait_seconds")
    out["waits"]["polls"] = int(sum(m.get("pffs_group_tier_polls_total", 0.0) for m in stats))
    out["claim_lives"] = histogram(stats, "pffs_group_claim_seconds")
    return out


def histogram(stats: list[dict[str, float]], metric: str) -> dict[str, Any]:
    """A histogram summed over the mounts: count, mean, and how many within each bound."""
    count = sum(m.get(f"{metric}_count", 0.0) for m in stats)
    total = sum(m.get(f"{metric}_sum", 0.0) for m in stats)
    return {
        "count": int(count),
        "mean_ms": round(1000 * total / count, 1) if count else 0.0,
        "within_ms": {
            str(int(float(le) * 1000)): int(
                sum(m.get(f"{metric}_bucket{{le={le}}}", 0.0) for m in stats)
            )
            for le in ("0.05", "0.1", "0.25", "0.5", "1.0", "5.0")
        },
    }


class Killer:
    """SIGKILLs VICTIM's mount once the other mounts have read KILL_AFTER of their files."""

    def __init__(self, mounted: dict[str, Path], files: int) -> None:
        self.pid = int(stats_of(mounted[VICTIM])["pid"])
        self.threshold = int(KILL_AFTER * files * (len(mounted) - 1))
        self.count = 0
        self.killed_after: int | None = None
        self._lock = threading.Lock()

    def read(self, name: str) -> None:
        if name == VICTIM:
            return
        with self._lock:
            self.count += 1
            if self.killed_after is None and self.count >= self.threshold:
                os.kill(self.pid, signal.SIGKILL)
                self.killed_after = self.count


def latencies(
    server: Server,
    mounts_server: Server,
    group: Group,
    mounted: dict[str, Path],
    data: Dataset,
    rounds: int,
) -> dict[str, float]:
    """p50/p99 (ms) of a 4 MiB peer hit and of a 4 MiB store GET (at `server`), one at a time."""
    first = next(iter(mounted.values()))
    for key in data.bigs:  # every block now held by its owner
        (first / key).read_bytes()
    source = f"s3://{BUCKET}@{mounts_server.endpoint_url}"
    members = [Member(name, f"http://{h}:{p}") for name, (h, p) in group.addresses.items()]
    s3 = client(server)
    # Who the mounts read as (the server's keys): a member serves only that principal.
    keys = Credentials(server.access_key, server.secret_key)
    reader = SourceConfig(
        url=f"s3://{BUCKET}", endpoint_url=mounts_server.endpoint_url, credentials=keys
    )
    backend = open_backend(reader)
    principal = backend.principal
    # With the mounts' keys, the bench proves their principal as a member does.
    peer = PeerClient(SECRET.encode(), "bench", proof_key=lambda _: backend.principal_key)
    etags = {key: s3.head_object(Bucket=BUCKET, Key=key)["ETag"] for key in data.bigs}
    peer_ms: list[float] = []
    store_ms: list[float] = []

    async def measure() -> None:  # the peer client is a trio coroutine; boto3 blocks: alone here
        for _ in range(rounds):
            for key in random.sample(data.bigs, len(data.bigs)):
                blocks = ObjectBlocks(source, principal, key, etags[key], BLOCK, BLOCK)
                member = owner(members, blocks.key(0))
                assert member is not None
                started = time.perf_counter()
                got = await peer.get(member, BlockRequest(blocks, 0))
                peer_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                response = s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes=0-{BLOCK - 1}")
                body = response["Body"].read()
                store_ms.append((time.perf_counter() - started) * 1000)
                if got != body:
                    raise RuntimeError(f"{key}: the peer's block differs from the store's")

    try:
        run_trio(measure)
    finally:
        peer.close()
    return {
        "peer_hit_p50_ms": round(quantile(peer_ms, 0.5), 1),
        "peer_hit_p99_ms": round(quantile(peer_ms, 0.99), 1),
        "store_get_p50_ms": round(quantile(store_ms, 0.5), 1),
        "store_get_p99_ms": round(quantile(store_ms, 0.99), 1),
        "samples": len(peer_ms),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time, with every run's wall time (`runs_seconds`) and the most
    any of them took from the store (`max_store_bytes_x`)."""
    ordered = sorted(runs, key=lambda figures: figures["seconds"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["runs_seconds"] = [figures["seconds"] for figures in runs]
    median["max_store_bytes_x"] = max(figures["store_bytes_x"] for figures in runs)
    return median


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_plan(sizes: GroupSizes, near: Server) -> list[tuple[str, dict[str, Any]]]:
    """The scenario's runs in order, each a name and `run`'s options: `pairs` of `group` and
    `alone`, swapped each pair (neither always reads first), the first group run with the
    latencies; then `kill`, and `shared` over `near` when the sizes ask for it."""
    runs: list[tuple[str, dict[str, Any]]] = []
    for pair in range(sizes.pairs):
        both: list[tuple[str, dict[str, Any]]] = [
            ("group", {"grouped": True, "latency_rounds": sizes.rounds if pair == 0 else 0}),
            ("alone", {"grouped": False}),
        ]
        runs += both if pair % 2 == 0 else both[::-1]
    runs.append(("kill", {"grouped": True, "kill": True}))
    if sizes.shared:
        runs.append(("shared", {"grouped": False, "shared": near}))
    return runs


def scenario(near: Server, sizes: GroupSizes, workdir: str) -> dict[str, Any]:
    """Every run of the scenario against `near` (put RTT_MS away here); one dict of figures.
    A run that fails is its error ("error: ..."), and the others still run."""
    data = put_dataset(near, sizes)
    result: dict[str, Any] = {
        "server": near.name.split(",")[0],
        "latency_ms": RTT_MS,
        "members": MEMBERS,
        "files": len(data.keys),
        "size": data.size,
    }
    with ExitStack() as stack:
        server = far(near, RTT_MS, os.path.join(workdir, "group-delay.log"))
        stack.callback(server.stop)
        if sizes.shared:  # the tier: a bucket of the same server, near (0 ms)
            client(near).create_bucket(Bucket=SHARED_BUCKET)
        repeated: dict[str, list[dict[str, Any]]] = {"group": [], "alone": []}
        for name, options in run_plan(sizes, near):
            root = Path(tempfile.mkdtemp(prefix=f"group-{name}-", dir=workdir))
            try:
                figures = run(server, root, data, **options)
            except (Unavailable, RuntimeError, OSError) as exc:
                result[name] = f"error: {str(exc).splitlines()[0][:200]}"
                continue
            if "latency" in figures:
                result["latency"] = figures.pop("latency")
            if name in repeated:
                repeated[name].append(figures)
            else:
                result[name] = figures
        for name, figures_of_runs in repeated.items():
            if figures_of_runs and not isinstance(result.get(name), str):
                result[name] = median_run(figures_of_runs)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.group", description=__doc__)
    p.add_argument(
        "--quick", action="store_true", help="the small form `python -m bench --quick` runs"
    )
    args = p.parse_args(argv)
    sizes = GroupSizes.quick() if args.quick else GroupSizes.full()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pffs-group-bench-") as work:
        launcher = Launcher(work)
        near = launcher.s3rver()
        stack.callback(near.stop)
        result = scenario(near, sizes, work)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

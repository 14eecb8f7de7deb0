"""The cache group scenario: 4 mounts on one machine, one dataset, each block from the store once?

`python -m bench.group` starts s3rver, puts a training set in it, and puts the store 20 ms
away (a delay proxy) behind a counting proxy (bench.counting). Four `pffs mount` processes on
127.0.0.2-5, each with its own cache directory, read the whole training set at once, each in
its own shuffled order with 8 threads: first in one group (a file:// member list), then again,
over fresh caches, with the group off, then with a shared tier instead (--shared-cache on a
second s3rver, near: 0 ms). It reports, for each run, the GETs at the store and the
bytes the mounts received from the origin as multiples of the dataset, and each mount's files/s.

Then a peer hit against a store GET: blocks of 4 MiB objects the group holds are asked of their
owners with the group's own client (pffs.group.client), and the same ranges of the store (20
ms away) with boto3, one at a time; p50 and p99 of each. One JSON line on stdout, a table on
stderr. Run it under `flock /tmp/pffs-bench.lock`: it is a timing run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.counting import CountingProxy
from bench.data import client
from bench.epoch import read_epoch
from bench.servers import Launcher, Server, far
from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.placement import owner
from pffs.group.protocol import BlockRequest
from pffs.testing.servers import free_port

MIB = 1 << 20
MEMBERS = 4
BUCKET = "pffs-group-bench"
SECRET = "bench-group-secret-0123456789"
BLOCK = 4 * MIB
SHARED_BUCKET = "pffs-shared-tier"


def put_dataset(server: Server, files: int, size: int, big: int) -> tuple[list[str], list[str]]:
    s3 = client(server)
    s3.create_bucket(Bucket=BUCKET)
    train = [f"train/{n:05d}.bin" for n in range(files)]
    bigs = [f"big/{n:03d}.bin" for n in range(big)]
    for key in train:
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(size))
    for key in bigs:
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(BLOCK))
    return train, bigs


@contextmanager
def mounts(
    server: Server, root: Path, grouped: bool, shared: Server | None = None
) -> Iterator[dict[str, Path]]:
    """Four mounts of the bucket (in one group when `grouped`, over the shared tier `shared`
    when given); unmounted on leaving."""
    names = [f"node{n}" for n in range(MEMBERS)]
    addresses = {name: (f"127.0.0.{n + 2}", free_port()) for n, name in enumerate(names)}
    (root / "members").write_text(
        "".join(f"{name} http://{h}:{p}\n" for name, (h, p) in addresses.items())
    )
    (root / "secret").write_text(SECRET)
    mounted: dict[str, Path] = {}
    try:
        for name in names:
            mnt = root / name
            mnt.mkdir()
            argv = [sys.executable, "-m", "pffs", "mount", f"s3://{BUCKET}", str(mnt)]
            argv += ["--endpoint-url", server.endpoint_url, "--cache-dir", str(root / f"c-{name}")]
            argv += ["--log-file", str(root / f"{name}.log")]
            if grouped:
                host, port = addresses[name]
                argv += ["--group-members", f"file://{root / 'members'}"]
                argv += ["--group-listen", f"{host}:{port}", "--group-self", name]
                argv += ["--group-secret-file", str(root / "secret")]
            if shared is not None:
                argv += ["--shared-cache", f"s3://{SHARED_BUCKET}/blocks"]
                argv += ["--shared-cache-endpoint", shared.endpoint_url]
            subprocess.run(argv, env=server.env(), check=True, capture_output=True)
            mounted[name] = mnt
        yield mounted
    finally:
        for mnt in mounted.values():
            subprocess.run([sys.executable, "-m", "pffs", "umount", str(mnt)], check=False)


def stats_of(mnt: Path) -> dict[str, float]:
    snapshot = json.loads((mnt / ".pffs" / "stats").read_text())
    out: dict[str, float] = {}
    for name, family in snapshot["metrics"].items():
        for sample in family.get("samples", ()):
            if "value" in sample:
                label = ",".join(f"{k}={v}" for k, v in sorted(sample["labels"].items()))
                key = f"{name}{{{label}}}" if label else name
                out[key] = out.get(key, 0.0) + float(sample["value"])
    return out


def origin_bytes(stats: dict[str, float]) -> float:
    """Bytes the mount received from the origin (not from a shared tier)."""
    return sum(
        value
        for key, value in stats.items()
        if key.startswith("pffs_backend_received_bytes_total{") and f"source=s3://{BUCKET}@" in key
    )


def epoch_run(
    server: Server,
    root: Path,
    grouped: bool,
    keys: list[str],
    size: int,
    shared: Server | None = None,
) -> dict[str, object]:
    """All four mounts read the training set at once; the store's side and each one's pace."""
    proxy = CountingProxy(server)
    try:
        with mounts(proxy.server, root, grouped, shared) as mounted:
            proxy.restart_count()  # the preflight checks are not the epoch's
            rates: dict[str, float] = {}
            errors: list[str] = []

            def read(name: str, mnt: Path, seed: int) -> None:
                try:
                    rates[name] = read_epoch(str(mnt), keys, size, seed)
                except Exception as exc:
                    errors.append(f"{name}: {exc}")

            threads = [
                threading.Thread(target=read, args=(name, mnt, seed))
                for seed, (name, mnt) in enumerate(mounted.items())
            ]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.perf_counter() - started
            stats = [stats_of(mnt) for mnt in mounted.values()]
            counts = proxy.restart_count()
            if errors:
                raise RuntimeError("; ".join(errors))
    finally:
        proxy.stop()
    dataset = len(keys) * size
    return {
        "store_bytes_x": round(sum(origin_bytes(s) for s in stats) / dataset, 3),
        "store_gets_x": round(counts.get("GET", 0) / len(keys), 3),
        "peer_bytes_x": round(
            sum(s.get("pffs_group_peer_bytes_total{way=received}", 0.0) for s in stats) / dataset, 3
        ),
        "files_per_s": {name: round(rate, 1) for name, rate in sorted(rates.items())},
        "seconds": round(seconds, 2),
    }


def latencies(server: Server, root: Path, bigs: list[str], rounds: int) -> dict[str, float]:
    """p50/p99 (ms) of a 4 MiB peer hit and of a 4 MiB store GET, one at a time."""
    with mounts(server, root, grouped=True) as mounted:
        for key in bigs:  # every block now held by its owner
            (mounted["node0"] / key).read_bytes()
        source = f"s3://{BUCKET}@{server.endpoint_url}"
        members = [
            Member(line.split()[0], line.split()[1])
            for line in (root / "members").read_text().splitlines()
        ]
        peer = PeerClient(SECRET.encode(), "bench")
        s3 = client(server)
        # Who the mounts read as (the same keys as this process): a member serves only them.
        reader = SourceConfig(url=f"s3://{BUCKET}", endpoint_url=server.endpoint_url)
        principal = open_backend(reader).principal
        peer_ms, store_ms = [], []
        for _ in range(rounds):
            for key in random.sample(bigs, len(bigs)):
                blocks = ObjectBlocks(source, principal, key, _etag(s3, key), BLOCK, BLOCK)
                member = owner(members, blocks.key(0))
                assert member is not None
                started = time.perf_counter()
                data = peer.get(member.url, BlockRequest(blocks, 0))
                peer_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                body = s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes=0-{BLOCK - 1}")[
                    "Body"
                ].read()
                store_ms.append((time.perf_counter() - started) * 1000)
                assert data == body
        peer.close()
    return {
        "peer_hit_p50_ms": round(_quantile(peer_ms, 0.5), 1),
        "peer_hit_p99_ms": round(_quantile(peer_ms, 0.99), 1),
        "store_get_p50_ms": round(_quantile(store_ms, 0.5), 1),
        "store_get_p99_ms": round(_quantile(store_ms, 0.99), 1),
        "samples": len(peer_ms),
    }


_etags: dict[str, str] = {}


def _etag(s3: object, key: str) -> str:
    """The version pffs pins a block to: the object's ETag as the store gives it."""
    if key not in _etags:
        _etags[key] = s3.head_object(Bucket=BUCKET, Key=key)["ETag"]  # type: ignore[attr-defined]
    return _etags[key]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.group", description=__doc__)
    p.add_argument("--files", type=int, default=400, help="training files (400)")
    p.add_argument("--size", type=int, default=256 * 1024, help="bytes each (256 KiB)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="store round trip (20)")
    p.add_argument("--big", type=int, default=16, help="4 MiB objects for the latencies (16)")
    p.add_argument("--rounds", type=int, default=2, help="latency rounds over them (2)")
    args = p.parse_args(argv)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pffs-group-bench-") as work:
        launcher = Launcher(work)
        near = launcher.s3rver()
        stack.callback(near.stop)
        keys, bigs = put_dataset(near, args.files, args.size, args.big)
        server = far(near, args.latency_ms, os.path.join(work, "delay.log"))
        stack.callback(server.stop)
        results: dict[str, object] = {"files": args.files, "size": args.size}
        for grouped in (True, False):
            root = Path(tempfile.mkdtemp(prefix="grouped-" if grouped else "alone-", dir=work))
            results["group" if grouped else "alone"] = epoch_run(
                server, root, grouped, keys, args.size
            )
        tier = launcher.s3rver()  # the shared tier, near (0 ms)
        stack.callback(tier.stop)
        client(tier).create_bucket(Bucket=SHARED_BUCKET)
        root = Path(tempfile.mkdtemp(prefix="shared-", dir=work))
        results["shared"] = epoch_run(server, root, False, keys, args.size, shared=tier)
        root = Path(tempfile.mkdtemp(prefix="latency-", dir=work))
        results["latency"] = latencies(server, root, bigs, args.rounds)
    print(json.dumps(results))
    for name in ("group", "alone", "shared"):
        run = results[name]
        print(f"{name}: {run}", file=sys.stderr)
    print(f"latency: {results['latency']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A reader's latency behind a store that throttles, with dataset preload on and off.

`python -m bench.probes.throttling [--samples N] [--limit N]` starts moto on 127.0.0.1 behind a
FaultProxy (pffs.testing.faults) that answers 503 SlowDown to any GET arriving while more than
`--limit` are in flight. Per mode it mounts the bucket afresh (no disk cache), starts a job
that reads the files of a directory one after another (which makes dataset preload load the
directory, up to 64 requests in flight, when it is on), and meanwhile times a second reader's
random 256 KiB reads of another file. It prints each mode's p50 and p99 of those reads and the
503s the proxy gave. The claim it checks (docs/notes/throttling.md): with preload on, the
reader's p99 is at most 1.5 times its p99 with preload off.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import boto3

from bench.servers import Launcher
from pffs.testing.faults import FaultProxy

KIB, MIB = 1024, 1 << 20
FILES, FILE_SIZE, PROBE_SIZE, READ = 300, 256 * KIB, 64 * MIB, 256 * KIB


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.throttling", description=__doc__)
    parser.add_argument("--samples", type=int, default=150, help="timed reads per mode (150)")
    parser.add_argument("--limit", type=int, default=8, help="GETs in flight before 503 (8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pffs-throttling-") as work:
        server = Launcher(work).moto()
        try:
            env = server.env()
            store = boto3.client(
                "s3",
                endpoint_url=server.endpoint_url,
                region_name="us-east-1",
                aws_access_key_id=server.access_key,
                aws_secret_access_key=server.secret_key,
            )
            store.create_bucket(Bucket="bench")
            for n in range(FILES):
                store.put_object(Bucket="bench", Key=f"job/{n:04d}.bin", Body=os.urandom(FILE_SIZE))
            store.put_object(Bucket="bench", Key="probe.bin", Body=os.urandom(PROBE_SIZE))
            port = int(server.endpoint_url.rsplit(":", 1)[1])
            print(f"server: moto at {server.endpoint_url}, 503 SlowDown above {args.limit} GETs")
            results = {}
            for mode in ("off", "on"):
                with FaultProxy(port) as proxy:
                    proxy.throttle_above(args.limit)
                    latencies = run_mode(work, mode, proxy.endpoint_url, env, args.samples)
                    results[mode] = latencies
                    print(
                        f"preload {mode:>3}: p50 {quantile(latencies, 0.5) * 1e3:7.1f} ms  "
                        f"p99 {quantile(latencies, 0.99) * 1e3:7.1f} ms  "
                        f"503s {proxy.injected['throttle']}"
                    )
            ratio = quantile(results["on"], 0.99) / quantile(results["off"], 0.99)
            print(f"p99 on / p99 off: {ratio:.2f} (target <= 1.5)")
        finally:
            server.stop()
    return 0


def run_mode(work: str, mode: str, endpoint: str, env: dict[str, str], samples: int) -> list[float]:
    mnt = os.path.join(work, f"mnt-{mode}")
    os.makedirs(mnt, exist_ok=True)
    argv = [
        *(sys.executable, "-m", "pffs", "mount", "s3://bench", mnt, "--endpoint-url", endpoint),
        *("--cache-dir", "none", "--cache-memory", "32M", "--preload", mode),
        *("--log-file", os.path.join(work, f"mount-{mode}.log")),
    ]
    subprocess.run(argv, env=env, check=True, capture_output=True)
    stop = threading.Event()
    try:
        job = threading.Thread(target=read_job, args=(mnt, stop), daemon=True)
        job.start()
        time.sleep(0.5)  # the job's opens have started dataset preload, when it is on
        rng = random.Random(1)
        latencies = []
        with open(os.path.join(mnt, "probe.bin"), "rb", buffering=0) as f:
            for _ in range(samples):
                offset = rng.randrange(0, PROBE_SIZE - READ)
                started = time.perf_counter()
                os.pread(f.fileno(), READ, offset)
                latencies.append(time.perf_counter() - started)
        stop.set()
        job.join(30)
    finally:
        subprocess.run([sys.executable, "-m", "pffs", "umount", mnt], env=env, check=False)
    return latencies


def read_job(mnt: str, stop: threading.Event) -> None:
    """A training job: the directory's files in order, whole, until told to stop."""
    names = sorted(os.listdir(os.path.join(mnt, "job")))
    while not stop.is_set():
        for name in names:
            if stop.is_set():
                return
            try:
                with open(os.path.join(mnt, "job", name), "rb") as f:
                    f.read()
            except OSError:
                pass  # an error here is the job's; the timed reader is what is measured


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.probes.get_engines`: GET engines side by side against s3rver.

GETs/s and client CPU per GET (100 KiB objects), MB/s and CPU-seconds per GiB (4 MiB ranged
GETs), for boto3, pyarrow, obstore and pffs's lean engine (pffs.backends.s3get): the measure
behind the choice of the lean engine, to take again when the engine or its peers change.

    python -m bench.probes.get_engines [--seconds 4] [--reps 3]

Each run is its own process (the client's CPU is getrusage(RUSAGE_SELF) over the timed
window, every thread of the client included; the server runs apart); runs are interleaved
(rep 1 of every engine, then rep 2, ...). obstore is measured only when it is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import boto3
from botocore.config import Config

from bench.servers import Launcher

SMALL_SIZE = 100 * 1024
SMALL_COUNT = 200
BIG_SIZE = 256 << 20
BIG_RANGE = 4 << 20
BUCKET = "getbench"
KEYS = "S3RVER"


def make_client(endpoint: str, pool: int = 32) -> Any:
    return boto3.session.Session(
        aws_access_key_id=KEYS, aws_secret_access_key=KEYS, region_name="us-east-1"
    ).client(
        "s3",
        endpoint_url=endpoint,
        config=Config(
            retries={"total_max_attempts": 1},
            max_pool_connections=pool,
            s3={"addressing_style": "path"},
        ),
    )


def reader(engine: str, endpoint: str, threads: int) -> Any:
    """A function (key, start, length) -> bytes for the engine."""
    if engine == "boto3":
        client = make_client(endpoint, threads + 4)

        def boto3_get(key: str, start: int, length: int) -> bytes:
            answer = client.get_object(
                Bucket=BUCKET, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            data: bytes = answer["Body"].read()
            return data

        return boto3_get
    if engine == "lean":
        from pffs.backends.s3get import LeanGetEngine

        session = boto3.session.Session(
            aws_access_key_id=KEYS, aws_secret_access_key=KEYS, region_name="us-east-1"
        )
        client = session.client(
            "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"})
        )
        lean = LeanGetEngine(client, session.get_credentials(), BUCKET, True, threads + 4)

        def lean_get(key: str, start: int, length: int) -> bytes:
            with lean.get(key, start, length, None) as body:
                return body.read(length)

        return lean_get
    if engine == "pyarrow":
        import pyarrow.fs as pafs

        host = endpoint.split("://", 1)[1]
        fs = pafs.S3FileSystem(
            access_key=KEYS,
            secret_key=KEYS,
            endpoint_override=host,
            scheme="http",
            region="us-east-1",
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )

        def arrow_get(key: str, start: int, length: int) -> bytes:
            # Python's API cannot hand over a known size: each open costs a HEAD too.
            with fs.open_input_file(f"{BUCKET}/{key}") as f:
                data: bytes = f.read_at(length, start)
                return data

        return arrow_get
    if engine == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            BUCKET,
            endpoint=endpoint,
            access_key_id=KEYS,
            secret_access_key=KEYS,
            region="us-east-1",
            virtual_hosted_style_request=False,
            client_options={"allow_http": True},
            retry_config={
                "max_retries": 0,
                "retry_timeout": __import__("datetime").timedelta(seconds=30),
            },
        )

        def obstore_get(key: str, start: int, length: int) -> bytes:
            return bytes(obstore.get_range(store, key, start=start, length=length))

        return obstore_get
    raise SystemExit(f"unknown engine {engine!r}")


def run_one(
    engine: str, endpoint: str, scenario: str, seconds: float, threads: int
) -> dict[str, Any]:
    """Runs in a child process: one engine, one scenario, timed."""
    get = reader(engine, endpoint, threads)
    if scenario == "small":
        keys = [f"small/{i}" for i in range(SMALL_COUNT)]

        def one(rng: random.Random) -> int:
            return len(get(rng.choice(keys), 0, SMALL_SIZE))
    else:
        blocks = BIG_SIZE // BIG_RANGE

        def one(rng: random.Random) -> int:
            return len(get("big", rng.randrange(blocks) * BIG_RANGE, BIG_RANGE))

    for i in range(threads):  # warm the pool and any lazy set-up outside the window
        one(random.Random(i))
    stop = threading.Event()
    counts = [0] * threads
    nbytes = [0] * threads

    def work(index: int) -> None:
        rng = random.Random(index)
        while not stop.is_set():
            nbytes[index] += one(rng)
            counts[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    gets, total = sum(counts), sum(nbytes)
    return {
        "gets_per_s": gets / wall,
        "cpu_ms_per_get": cpu * 1000 / gets,
        "mb_per_s": total / wall / 1e6,
        "cpu_s_per_gib": cpu / (total / (1 << 30)),
    }


def setup_store(endpoint: str) -> None:
    client = make_client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    small = os.urandom(SMALL_SIZE)
    for i in range(SMALL_COUNT):
        client.put_object(Bucket=BUCKET, Key=f"small/{i}", Body=small)
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(BIG_SIZE))
        f.seek(0)
        client.upload_fileobj(f, BUCKET, "big")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engines", default="boto3,pyarrow,obstore,lean")
    parser.add_argument("--child", nargs=4, metavar=("ENGINE", "ENDPOINT", "SCENARIO", "THREADS"))
    args = parser.parse_args()
    if args.child:
        engine, endpoint, scenario, threads = args.child
        print(json.dumps(run_one(engine, endpoint, scenario, args.seconds, int(threads))))
        return

    engines = args.engines.split(",")
    try:
        import obstore  # noqa: F401
    except ImportError:
        engines = [e for e in engines if e != "obstore"]
    workdir = tempfile.mkdtemp(prefix="getbench-")
    launcher = Launcher(workdir, os.path.expanduser("~/.cache/pffs-bench"))
    server = launcher.s3rver()
    try:
        setup_store(server.endpoint_url)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _rep in range(args.reps):
            for scenario, threads in (("small", 16), ("big", 8)):
                for engine in engines:
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "bench.probes.get_engines",
                            "--seconds",
                            str(args.seconds),
                            "--child",
                            engine,
                            server.endpoint_url,
                            scenario,
                            str(threads),
                        ],
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    if out.returncode != 0:
                        raise SystemExit(f"{engine} {scenario} failed: {out.stderr[-2000:]}")
                    results.setdefault((engine, scenario), []).append(json.loads(out.stdout))
        for (engine, scenario), runs in results.items():
            if scenario == "small":
                figures = ("gets_per_s", "cpu_ms_per_get")
            else:
                figures = ("mb_per_s", "cpu_s_per_gib")
            text = "  ".join(
                f"{name} {statistics.median(r[name] for r in runs):.3g} "
                f"[{min(r[name] for r in runs):.3g}-{max(r[name] for r in runs):.3g}]"
                for name in figures
            )
            print(f"{scenario:5} {engine:8} {text}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

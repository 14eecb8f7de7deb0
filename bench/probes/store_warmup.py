"""Does RGW serve an object's first read after its upload at a higher cost than later ones?

Not part of the bench suite: no mount. A fresh one-node Ceph and its gateway (memstore,
pffs.testing.rgw); each of `--objects` objects of `--size` random bytes is uploaded as the
bench uploads its large file (64 MiB parts, 4 at once), then all are read, object by object,
`--reads` times each straight from the gateway with curl: one stream of the whole object, or
with `--parallel N` N ranged GETs at once (as the bench's server ceiling), or with `--range`
ranged GETs of that size, `--parallel` at once (as a mount reads ahead). Per read: MB/s and
the gateway's and OSD's CPU per GiB from /proc.

    python -m bench.probes.store_warmup --reads 3
    python -m bench.probes.store_warmup --objects 2 --first-parallel 8
    python -m bench.probes.store_warmup --range 16M --parallel 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from boto3.s3.transfer import TransferConfig

from bench.data import client
from bench.servers import Launcher, Server
from bench.systems import cpu_seconds
from pffs.sizes import parse_size

MIB = 1 << 20


def _store_cpu(server: Server) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in server.store_pids)


def _read(server: Server, key: str, size: int, parallel: int, length: int) -> str:
    """One read of the object with curl (ranged GETs of `length` bytes or 1/`parallel` of it,
    `parallel` at once): its figures."""
    url = client(server).generate_presigned_url(
        "get_object", Params={"Bucket": "warmup", "Key": key}, ExpiresIn=3600
    )
    step = length or -(-size // parallel)
    count = -(-size // step)
    env = {k: v for k, v in os.environ.items() if k != "CURL_CA_BUNDLE"}

    def get(index: int) -> None:
        start, end = index * step, min(size, (index + 1) * step) - 1
        argv = ["curl", "-sf", "-o", "/dev/null", "-r", f"{start}-{end}", url]
        subprocess.run(argv, check=True, env=env)

    cpu = _store_cpu(server)
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(get, range(count)))
    elapsed = time.perf_counter() - started
    cpu = _store_cpu(server) - cpu
    gib = size / (1 << 30)
    rate = f"{size / elapsed / 1e6:6.0f} MB/s  store {cpu / gib:4.2f} CPU-s/GiB"
    return f"{rate}  ({count} GETs, {parallel} at once)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="each object's size (1G)")
    parser.add_argument("--objects", type=int, default=1, help="objects uploaded (1)")
    parser.add_argument("--reads", type=int, default=3, help="reads of each object (3)")
    parser.add_argument("--parallel", type=int, default=1, help="ranged GETs per read (1)")
    parser.add_argument(
        "--first-parallel", type=int, help="ranged GETs of each object's first read (--parallel)"
    )
    parser.add_argument("--range", default="0", help="bytes per ranged GET (0: 1/--parallel)")
    args = parser.parse_args()
    size, length = parse_size(args.size), parse_size(args.range)
    if args.objects < 1 or args.reads < 1 or args.parallel < 1:
        sys.exit("store_warmup: --objects, --reads and --parallel must be 1 or more")
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-store-warmup-") as root:
        server = Launcher(root).rgw()
        try:
            s3 = client(server)
            s3.create_bucket(Bucket="warmup")
            keys = [f"object{n}.bin" for n in range(args.objects)]
            transfer = TransferConfig(multipart_chunksize=64 * MIB, max_concurrency=4)
            with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
                for at in range(0, size, 64 * MIB):
                    f.write(os.urandom(min(64 * MIB, size - at)))
                f.flush()
                for key in keys:
                    s3.upload_file(f.name, "warmup", key, Config=transfer)
            for key in keys:
                for n in range(args.reads):
                    parallel = args.first_parallel if n == 0 and args.first_parallel else None
                    figures = _read(server, key, size, parallel or args.parallel, length)
                    load = os.getloadavg()[0]
                    print(f"{key} read {n + 1}: {figures}  load {load:.1f}", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()

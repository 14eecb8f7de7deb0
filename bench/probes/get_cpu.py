"""`python -m bench.probes.get_cpu`: the client CPU of one 100 KiB GET through S3Backend.read_range.

Not part of the bench suite: s3rver on loopback holds 50 objects of `--size` bytes; one thread
reads them in turn through the backend a mount uses (the lean GET engine, retries, metrics),
`--gets` times after a warm-up, and prints this process's CPU per GET, user and system
(getrusage: the server runs apart). Run it under another tree's code to compare two commits:

    python -m bench.probes.get_cpu --gets 2000
    cd /tmp && PYTHONPATH=/tmp/base /work/wt/python -m bench.probes.get_cpu  # /tmp/base as
    # bench.probes.epoch_cpu's --baseline builds it, with bench/ copied in too
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile

from bench.data import client
from bench.servers import Launcher
from pffs.backends import open_backend
from pffs.config import SourceConfig

BUCKET = "getcpu"
OBJECTS = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100 * 1024)
    args = parser.parse_args()
    if args.gets <= 0 or args.size <= 0:
        parser.error("--gets and --size must be above 0")
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-get-cpu-") as root:
        server = Launcher(root).s3rver()
        try:
            s3 = client(server)
            s3.create_bucket(Bucket=BUCKET)
            body = os.urandom(args.size)
            names = [f"k{n}" for n in range(OBJECTS)]
            for name in names:
                s3.put_object(Bucket=BUCKET, Key=name, Body=body)
            os.environ.update(server.env())
            backend = open_backend(SourceConfig(f"s3://{BUCKET}", endpoint_url=server.endpoint_url))
            versions = [backend.stat(name).version for name in names]

            def read(count: int) -> None:
                for n in range(count):
                    backend.read_range(names[n % OBJECTS], 0, args.size, versions[n % OBJECTS])

            read(100)  # connections open, code warm
            before = resource.getrusage(resource.RUSAGE_SELF)
            read(args.gets)
            after = resource.getrusage(resource.RUSAGE_SELF)
            user = (after.ru_utime - before.ru_utime) / args.gets * 1e6
            system = (after.ru_stime - before.ru_stime) / args.gets * 1e6
            print(
                f"{user + system:.0f} us of CPU per GET of {args.size} bytes"
                f" (user {user:.0f}, system {system:.0f})"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()

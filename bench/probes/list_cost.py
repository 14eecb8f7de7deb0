"""`python -m bench.probes.list_cost`: the client CPU of listing a prefix through S3Backend.list.

Starts s3rver (as the bench does) on 127.0.0.1, puts `--keys` empty objects under one prefix,
then lists the prefix `--reps` times through pffs's S3 backend and reports the CPU of this
process (`time.process_time`: the parsing of the store's pages, not the server's work) per
1,000 listed entries. Short by design: the listing, not the store, is what is measured.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import boto3

from bench.servers import Launcher
from pffs.backends import open_backend
from pffs.config import SourceConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pffs-list-cost-") as workdir:
        server = Launcher(workdir).s3rver()
        try:
            os.environ.update(server.env())
            s3 = boto3.client("s3", endpoint_url=server.endpoint_url)
            s3.create_bucket(Bucket="listing")
            with ThreadPoolExecutor(16) as workers:
                keys = (f"dir/{i:07d}" for i in range(args.keys))
                list(workers.map(lambda k: s3.put_object(Bucket="listing", Key=k, Body=b""), keys))
            backend = open_backend(
                SourceConfig(url="s3://listing", endpoint_url=server.endpoint_url)
            )
            per_thousand = []
            for _ in range(args.reps):
                started = time.process_time()
                listed = sum(1 for _ in backend.list("dir"))
                if listed != args.keys:
                    raise SystemExit(f"list_cost: listed {listed} of {args.keys}")
                per_thousand.append((time.process_time() - started) / listed * 1e6)
            figures = " ".join(f"{ms:.0f}" for ms in per_thousand)
            print(f"{args.keys} keys: {figures} ms of CPU per 1,000 listed entries")
        finally:
            server.stop()


if __name__ == "__main__":
    main()

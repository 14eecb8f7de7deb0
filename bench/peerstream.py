"""A peer miss's first byte: how soon an asker gets the bytes of a block its owner is fetching.

`python -m bench.peerstream` starts s3rver 20 ms away (a delay proxy), puts 4 MiB objects in
it, and mounts a group of two (127.0.0.2-3, default 4 MiB blocks). For each object, a signed
request (pffs.group.signing) asks block 0's owner for it while the owner does not hold it (a
miss: the owner fetches it from the store, once, for every asker), then again (a hit). It
reports the p50 and p99 of the time to the reply's first body byte and to its last, for misses
and for hits. The owner streams a block as its store sends it, so a miss's first byte comes
about one store round trip after the request, not after the whole block. One JSON line on
stdout. Run it under `flock /tmp/pffs-bench.lock`: it is a timing run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import urllib3

from bench.data import client
from bench.group import BLOCK, BUCKET, SECRET, _etag, _quantile, mounts
from bench.servers import Launcher, far
from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import signing
from pffs.group.members import Member
from pffs.group.placement import owner
from pffs.group.protocol import BlockRequest


def timed_get(pool: urllib3.PoolManager, url: str, target: str) -> tuple[float, float, int]:
    """(ms to the first body byte, ms to the last, bytes) of one signed block request."""
    started = time.perf_counter()
    response = pool.request(
        "GET", url + target, headers=signing.sign(SECRET.encode(), "GET", target),
        preload_content=False,
    )  # fmt: skip
    size = len(response.read(1))
    first = time.perf_counter()
    while piece := response.read(256 * 1024):
        size += len(piece)
    last = time.perf_counter()
    response.release_conn()
    assert response.status == 200, response.status
    return (first - started) * 1000, (last - started) * 1000, size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peerstream", description=__doc__)
    p.add_argument("--objects", type=int, default=24, help="4 MiB objects (24)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="store round trip (20)")
    args = p.parse_args(argv)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pffs-peerstream-") as work:
        launcher = Launcher(work)
        near = launcher.s3rver()
        stack.callback(near.stop)
        s3 = client(near)
        s3.create_bucket(Bucket=BUCKET)
        keys = [f"big/{n:03d}.bin" for n in range(args.objects)]
        for key in keys:
            s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(BLOCK))
        server = far(near, args.latency_ms, os.path.join(work, "delay.log"))
        stack.callback(server.stop)
        root = Path(work) / "group"
        root.mkdir()
        times: dict[str, list[float]] = {
            "miss_first": [],
            "miss_last": [],
            "hit_first": [],
            "hit_last": [],
        }
        os.environ.update(server.env())  # this process reads as the mounts do: one principal
        with mounts(server, root, grouped=True) as _mounted:
            members = [
                Member(line.split()[0], line.split()[1])
                for line in (root / "members").read_text().splitlines()
            ]
            source = f"s3://{BUCKET}@{server.endpoint_url}"
            reader = SourceConfig(url=f"s3://{BUCKET}", endpoint_url=server.endpoint_url)
            principal = open_backend(reader).principal
            pool = urllib3.PoolManager()
            for key in keys:
                blocks = ObjectBlocks(
                    source, principal, key, _etag(client(server), key), BLOCK, BLOCK
                )
                member = owner(members, blocks.key(0))
                assert member is not None
                target = BlockRequest(blocks, 0).target()
                for kind in ("miss", "hit"):
                    first, last, size = timed_get(pool, member.url, target)
                    assert size >= BLOCK
                    times[f"{kind}_first"].append(first)
                    times[f"{kind}_last"].append(last)
    result = {
        f"{name}_{q}_ms": round(_quantile(values, quantile), 1)
        for name, values in times.items()
        for q, quantile in (("p50", 0.5), ("p99", 0.99))
    }
    result["samples"] = args.objects
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

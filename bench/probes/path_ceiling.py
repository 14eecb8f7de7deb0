"""The far store's path ceiling: curl's parallel ranged GETs of one object through the delay
proxy, from s3rver and from the lean store over the same objects (bench.probes.lean_store).

What a pattern's floor is measured against (bench.clientfloor takes the bench's own ceiling,
from s3rver or RGW on the machine's two cores); with the lean store the store's CPU is out of
the figure, and what is left is the path's: the delay proxy and the loopback.

    python -m bench.probes.path_ceiling --latency 20 --size 512M --parallel 8,16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from bench.data import client
from bench.leftovers import stopped_cleanly
from bench.probes import lean_store
from bench.scenarios import object_ceiling
from bench.servers import Launcher, far
from pffs.sizes import parse_size

BUCKET = "ceiling"
KEY = "object.bin"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.path_ceiling", description=__doc__)
    p.add_argument("--latency", type=float, default=20.0, help="ms of round trip (20)")
    p.add_argument("--size", default="512M", help="the object's size (512M)")
    p.add_argument("--parallel", default="8,16", help="GETs at once, a list (8,16)")
    p.add_argument("--rounds", type=int, default=3, help="measures of each (3)")
    args = p.parse_args(argv)
    size = parse_size(args.size)
    parallels = [int(n) for n in args.parallel.split(",")]
    with stopped_cleanly():
        work = tempfile.mkdtemp(prefix="path-ceiling-", dir="/var/tmp")
        s3rver = Launcher(work).s3rver()
        stop = s3rver.stop
        try:
            s3 = client(s3rver)
            s3.create_bucket(Bucket=BUCKET)
            s3.put_object(Bucket=BUCKET, Key=KEY, Body=os.urandom(size))
            lean = lean_store.launch(work, s3rver)
            stop = lean.stop  # the lean store, then s3rver
            for name, server in (("s3rver", s3rver), ("lean store", lean)):
                path = far(server, args.latency, os.path.join(work, "delay.log"))
                try:
                    for parallel in parallels:
                        figures = [
                            object_ceiling(path, BUCKET, KEY, size, parallel)
                            for _ in range(args.rounds)
                        ]
                        shown = ", ".join(f"{mbs:,.0f}" for mbs in figures)
                        print(f"{name}, {args.latency:g} ms, {parallel} GETs: {shown} MB/s")
                finally:
                    path.stop()
        finally:
            stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The shared-tier form of the cache group scenario alone (bench.group's own parts).

s3rver 20 ms away (the delay proxy) as the origin, 400 training files of 256 KiB, and four
mounts over a second s3rver at 0 ms as their shared tier (`--shared-cache`), reading the whole
set at once, each in its own shuffled order with 8 threads: bench.group's `epoch_run` with
`shared=tier`, without its group and alone runs. One JSON line on stdout (the origin's bytes and
GETs as multiples of the dataset, files/s per mount, seconds), then the mounts' shared-cache log
lines on stderr. Run it under `flock /tmp/pffs-bench.lock`: it is a timing run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.data import client
from bench.group import SHARED_BUCKET, epoch_run, put_dataset
from bench.servers import Launcher, far


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.shared_claims", description=__doc__)
    p.add_argument("--files", type=int, default=400, help="training files (400)")
    p.add_argument("--size", type=int, default=256 * 1024, help="bytes each (256 KiB)")
    args = p.parse_args(argv)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pffs-shared-") as work:
        launcher = Launcher(work)
        near = launcher.s3rver()
        stack.callback(near.stop)
        keys, _ = put_dataset(near, args.files, args.size, 0)
        server = far(near, 20.0, os.path.join(work, "delay.log"))
        stack.callback(server.stop)
        tier = launcher.s3rver()
        stack.callback(tier.stop)
        client(tier).create_bucket(Bucket=SHARED_BUCKET)
        root = Path(tempfile.mkdtemp(prefix="shared-", dir=work))
        print(json.dumps(epoch_run(server, root, False, keys, args.size, shared=tier)))
        for log in sorted(root.glob("*.log")):
            lines = [line for line in log.read_text().splitlines() if "shared cache" in line]
            print(log.name, len(lines), *lines[:3], sep="\n  ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

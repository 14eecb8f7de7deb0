"""`python -m bench.probes.first_byte`: the first byte of a cold file, several samples per system.

The suite's "time to first byte" is the median of three samples, taken on one system after the
other. Here the samples interleave the systems, and more can be taken. s3rver, or Ceph's gateway
with `--server rgw` (behind the delay proxy with `--latency`), holds `--samples` objects of
`--size` (1 MiB), each in a directory of its own; pffs, s3fs and rclone are mounted at their
defaults, and each sample opens one object on every system in turn (the order alternating), with
the page cache and dentries dropped before each. Samples start 11 s apart, so that pffs's
dataset preload (3 files of a directory tree opened within 10 s) never starts and every file is
cold. For each system it prints the median, the spread, and each sample's steps
(`bench.scenarios.first_byte_steps`): the directory's lookup, the file's lookup, open, and the
first `read(1)` of a buffered reader, or with `--random` a 4 KiB pread at a random offset (the
same offset on every system).

    python -m bench.probes.first_byte --samples 8 --latency 20 --size 64M --random
    python -m bench.probes.first_byte --server rgw --samples 6 --latency 20
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

from bench.data import client
from bench.scenarios import FIRST_BYTE_STEPS, drop_caches, first_byte_steps
from bench.servers import Launcher, Unavailable, far
from bench.systems import Pffs, Rclone, S3fs, System, unmount
from pffs.sizes import parse_size

SPACING = 11.0  # seconds between samples: longer than dataset preload's 10 s window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.0, help="round trip to add, ms")
    parser.add_argument("--size", default="1M", help="size of each object (1M)")
    parser.add_argument("--random", action="store_true", help="4 KiB at a random offset")
    parser.add_argument("--server", choices=("s3rver", "rgw"), default="s3rver")
    args = parser.parse_args()
    size = parse_size(args.size)
    offsets = random.Random(31).choices(range(0, max(1, size - 4096), 4096), k=args.samples)
    root = tempfile.mkdtemp(dir="/var/tmp", prefix="pffs-first-byte-")
    launcher = Launcher(root)
    near = launcher.rgw() if args.server == "rgw" else launcher.s3rver()
    server = far(near, args.latency, os.path.join(root, "delay.log")) if args.latency else near
    systems: dict[str, System] = {"pffs": Pffs([]), "s3fs": S3fs(), "rclone": Rclone()}
    mounts: dict[str, str] = {}
    try:
        s3 = client(near)
        s3.create_bucket(Bucket="first-byte")
        for n in range(args.samples):
            s3.put_object(Bucket="first-byte", Key=f"d{n:02d}/f.bin", Body=os.urandom(size))
        for name, system in systems.items():
            base = tempfile.mkdtemp(dir=root)
            mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
            os.makedirs(mountpoint)
            os.makedirs(cache)
            try:
                system.mount(server, "first-byte", mountpoint, cache)
            except Unavailable as exc:
                print(f"{name}: not measured ({exc})")
                continue
            mounts[name] = mountpoint
            os.listdir(mountpoint)  # every system starts with its root listed
        results: dict[str, list[list[float]]] = {name: [] for name in mounts}
        for n in range(args.samples):
            started = time.monotonic()
            names = list(mounts) if n % 2 == 0 else list(mounts)[::-1]
            for name in names:
                drop_caches()
                offset = offsets[n] if args.random else None
                results[name].append(first_byte_steps(mounts[name], f"d{n:02d}", offset))
            time.sleep(max(0.0, SPACING - (time.monotonic() - started)))
        for name, samples in results.items():
            totals = [sum(steps) for steps in samples]
            print(
                f"{name:7s} median {statistics.median(totals):6.1f} ms"
                f"  min {min(totals):6.1f}  max {max(totals):6.1f}"
            )
            for steps in samples:
                parts = "  ".join(
                    f"{step} {ms:5.1f}" for step, ms in zip(FIRST_BYTE_STEPS, steps, strict=True)
                )
                print(f"    {parts}  total {sum(steps):5.1f}")
    finally:
        for mountpoint in mounts.values():
            unmount(mountpoint)
        server.stop()
        near.stop()


if __name__ == "__main__":
    main()

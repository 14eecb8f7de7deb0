"""`python -m bench.probes.first_byte`: the first byte of a cold file, several samples per system.

The suite's "time to first byte" is the median of three samples, taken on one system after
the other. Here the samples interleave the systems, and more can be taken. s3rver (0 ms, no
proxy) holds `--samples` objects of 1 MiB, each in a directory of its own; pffs, s3fs and
rclone are mounted at their defaults, and each sample opens one object on every system in
turn (the order alternating), with the page cache and dentries dropped before each. Samples
start 11 s apart, so that pffs's dataset preload (3 files of a directory tree opened within
10 s) never starts and every file is cold. For each system it prints the median, the spread,
and each sample's steps (`bench.scenarios.first_byte_steps`): the directory's lookup, the
file's lookup, open, and the first `read(1)` of a buffered reader.

    python -m bench.probes.first_byte --samples 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from bench.data import client
from bench.scenarios import FIRST_BYTE_STEPS, drop_caches, first_byte_steps
from bench.servers import Launcher, Unavailable
from bench.systems import Pffs, Rclone, S3fs, System, unmount

MIB = 1 << 20
SPACING = 11.0  # seconds between samples: longer than dataset preload's 10 s window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir="/var/tmp", prefix="pffs-first-byte-")
    server = Launcher(root).s3rver()
    systems: dict[str, System] = {"pffs": Pffs([]), "s3fs": S3fs(), "rclone": Rclone()}
    mounts: dict[str, str] = {}
    try:
        s3 = client(server)
        s3.create_bucket(Bucket="first-byte")
        for n in range(args.samples):
            s3.put_object(Bucket="first-byte", Key=f"d{n:02d}/f.bin", Body=os.urandom(MIB))
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
                results[name].append(first_byte_steps(mounts[name], f"d{n:02d}"))
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


if __name__ == "__main__":
    main()

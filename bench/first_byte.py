"""`python -m bench.first_byte`: the first byte of a cold file, several samples per system.

The suite's "time to first byte" is one sample of one file per run, too few on this noisy
machine to rank systems whose figures differ by a few milliseconds. Here s3rver (0 ms, no
proxy) holds `--samples` objects of 1 MiB, each in a directory of its own; pffs, s3fs and
rclone are mounted at their defaults, and each sample opens one object on every system in
turn (the order alternating), with the page cache and dentries dropped before each. Samples
start 11 s apart, so that pffs's dataset prefetch (3 files of a directory tree opened within
10 s) never starts and every file is cold. For each system it prints the median, the spread,
and each sample's steps: the directory's lookup, the file's lookup, open, and the first
`read(1)` of a buffered reader (Python's, whose buffer is the file's st_blksize).

    .venv/bin/python -m bench.first_byte --samples 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from bench.dataset import client
from bench.scenarios import drop_caches
from bench.servers import Launcher, Unavailable
from bench.systems import Pffs, Rclone, S3fs, System, unmount

MIB = 1 << 20
SPACING = 11.0  # seconds between samples: longer than dataset prefetch's 10 s window
STEPS = ("directory", "file", "open", "read")


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def sample(mountpoint: str, directory: str) -> list[float]:
    """Milliseconds of each step of a first byte of `directory`/f.bin, cold."""
    folder = os.path.join(mountpoint, directory)
    path = os.path.join(folder, "f.bin")
    steps = [_timed(lambda: os.stat(folder)), _timed(lambda: os.stat(path))]
    started = time.perf_counter()
    with open(path, "rb") as handle:
        steps.append((time.perf_counter() - started) * 1000)
        steps.append(_timed(lambda: handle.read(1)))
    return steps


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
                results[name].append(sample(mounts[name], f"d{n:02d}"))
            time.sleep(max(0.0, SPACING - (time.monotonic() - started)))
        for name, samples in results.items():
            totals = [sum(steps) for steps in samples]
            print(
                f"{name:7s} median {statistics.median(totals):6.1f} ms"
                f"  min {min(totals):6.1f}  max {max(totals):6.1f}"
            )
            for steps in samples:
                parts = "  ".join(
                    f"{step} {ms:5.1f}" for step, ms in zip(STEPS, steps, strict=True)
                )
                print(f"    {parts}  total {sum(steps):5.1f}")
    finally:
        for mountpoint in mounts.values():
            unmount(mountpoint)
        server.stop()


if __name__ == "__main__":
    main()

"""A micro-benchmark of the disk tier alone: random 4 KiB reads through DiskTier.get_range.

Not part of the bench suite (no mount, no peers, no store): it fills a fresh disk tier with
entries of 4 MiB (random bytes, stored uncompressed; or compressible text, stored with lz4),
reads every entry once (so the page cache holds them, as it does in a warm epoch), then reads
4 KiB at random offsets of random entries for a few seconds and prints reads/s and CPU per
read, at two levels:

- tier: DiskTier.get_range called from one thread and from several;
- diskio: DiskIO.get_range awaited by trio tasks, as the block cache calls it for a FUSE read
  (worker threads under the disk limiter, or none when the read can be served without one);
- blocks (compressed entries only): BlockCache.read_part from trio tasks, a memory tier large
  enough for the entries (a compressed block read in part is decompressed once and kept there).

`--profile` prints where one thread's time goes at the tier level (cProfile).

    .venv/bin/python -m bench.disk_reads --entries 256 --seconds 3
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import trio

from pffs.cache.background import Background
from pffs.cache.blocks import BlockCache
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats
from pffs.config import CacheConfig

MIB = 1024 * 1024
READ = 4096


def _fill(tier: DiskTier, entries: int, compressible: bool) -> list[str]:
    """Store `entries` blocks of 4 MiB; their keys."""
    keys = []
    rng = random.Random(0)
    line = b"image_000123.jpg,label_17,0.25,0.75\n"
    text = (line * (4 * MIB // len(line) + 1))[: 4 * MIB]
    for index in range(entries):
        key = entry_key("bench", "text" if compressible else "noise", "v1", 4 * MIB, index)
        data = text if compressible else rng.randbytes(4 * MIB)
        if not tier.put(key, data, "bench"):
            sys.exit(f"disk_reads: could not store entry {index} (disk full?)")
        keys.append(key)
    return keys


def _reader(tier: DiskTier, keys: list[str], seed: int, stop: Callable[[], bool]) -> int:
    """Random 4 KiB reads until `stop`; how many (every one must hit)."""
    rng = random.Random(seed)
    count = 0
    while not stop():
        for _ in range(64):  # check the clock once per 64 reads
            key = keys[rng.randrange(len(keys))]
            start = rng.randrange(4 * MIB // READ) * READ
            data = tier.get_range(key, start, READ)[0]
            if data is not None and len(data) > READ:  # a compressed entry comes whole
                data = data[start : start + READ]
            if data is None or len(data) != READ:
                sys.exit(f"disk_reads: a read of {key} at {start} missed")
            count += 1
    return count


def _run(tier: DiskTier, keys: list[str], threads: int, seconds: float) -> tuple[float, float]:
    """(reads/s, CPU microseconds per read) of `threads` readers over `seconds`.

    The CPU cost (user + system, from getrusage) is the steadier figure on a shared machine:
    reads/s drops when other processes take the cores, CPU per read much less.
    """
    stop = _until(time.monotonic() + seconds)
    counts = [0] * threads

    def work(n: int) -> None:
        counts[n] = _reader(tier, keys, n, stop)

    started, cpu = time.monotonic(), _cpu_seconds()
    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    reads = sum(counts)
    return reads / (time.monotonic() - started), (_cpu_seconds() - cpu) / reads * 1e6


def _run_diskio(tier: DiskTier, count: int, tasks: int, seconds: float) -> tuple[float, float]:
    """(reads/s, CPU microseconds per read) of `tasks` trio tasks reading through DiskIO."""
    disk = DiskIO(tier, 4 * MIB, threads=8, stats=CacheStats(), background=Background())
    counts = [0] * tasks
    stop = _until(time.monotonic() + seconds)

    async def reader(n: int) -> None:
        rng = random.Random(n)
        while not stop():
            key = BlockKey("bench", "noise", "v1", rng.randrange(count))
            start = rng.randrange(4 * MIB // READ) * READ
            data = await disk.get_range(key, start, READ)
            if data is None or len(data) != READ:
                sys.exit(f"disk_reads: a read of {key} at {start} missed")
            counts[n] += 1

    async def readers() -> None:
        async with trio.open_nursery() as nursery:
            for n in range(tasks):
                nursery.start_soon(reader, n)

    started, cpu = time.monotonic(), _cpu_seconds()
    trio.run(readers)
    reads = sum(counts)
    return reads / (time.monotonic() - started), (_cpu_seconds() - cpu) / reads * 1e6


def _run_blocks(root: str, count: int, tasks: int, seconds: float) -> tuple[float, float]:
    """(reads/s, CPU us per read) of trio tasks reading compressed entries via BlockCache."""
    config = CacheConfig(block_size=4 * MIB, memory_bytes=2 * count * 4 * MIB, disk_dir=root)
    cache = BlockCache(config)
    counts = [0] * tasks
    stop = _until(time.monotonic() + seconds)

    async def no_store() -> bytes:
        sys.exit("disk_reads: the store was asked")

    async def reader(n: int) -> None:
        rng = random.Random(n)
        while not stop():
            key = BlockKey("bench", "text", "v1", rng.randrange(count))
            start = rng.randrange(4 * MIB // READ) * READ
            if len(await cache.read_part(key, start, READ, no_store)) != READ:
                sys.exit(f"disk_reads: a read of {key} at {start} was short")
            counts[n] += 1
            await trio.lowlevel.checkpoint()  # a memory hit never yields; let the others run

    async def readers() -> None:
        async with trio.open_nursery() as nursery:
            for n in range(tasks):
                nursery.start_soon(reader, n)

    started, cpu = time.monotonic(), _cpu_seconds()
    trio.run(readers)
    reads = sum(counts)
    if cache.disk is not None:
        cache.disk.close()
    return reads / (time.monotonic() - started), (_cpu_seconds() - cpu) / reads * 1e6


def _until(deadline: float) -> Callable[[], bool]:
    return lambda: time.monotonic() >= deadline


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _report(label: str, entries: int, readers: str, rate: float, cpu: float) -> None:
    print(
        f"{label:19} {entries:4} entries  {readers}: {rate:10,.0f} reads/s  {cpu:6.1f} us CPU/read"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=256, help="4 MiB entries (uncompressed)")
    parser.add_argument("--compressed-entries", type=int, default=32, help="4 MiB lz4 entries")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--profile", action="store_true", help="cProfile one thread's reads")
    parser.add_argument("--dir", default=None, help="where to make the tier (default: /var/tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="pffs-disk-") as root:
        tier = DiskTier(root, capacity=1 << 40, free_ratio=0.0, compress=True)
        for label, count, compressible in (
            ("uncompressed", args.entries, False),
            ("compressed", args.compressed_entries, True),
        ):
            if count <= 0:
                continue
            keys = _fill(tier, count, compressible)
            for key in keys:  # into the page cache, as a warm epoch finds them
                tier.get(key)
            for threads in args.threads:
                rate, cpu = _run(tier, keys, threads, args.seconds)
                _report(f"tier   {label}", count, f"{threads} thread(s)", rate, cpu)
            for tasks in args.threads:
                if compressible:  # read in part, a compressed block goes to the memory tier
                    rate, cpu = _run_blocks(root, count, tasks, args.seconds)
                    _report(f"blocks {label}", count, f"{tasks} task(s)  ", rate, cpu)
                else:
                    rate, cpu = _run_diskio(tier, count, tasks, args.seconds)
                    _report(f"diskio {label}", count, f"{tasks} task(s)  ", rate, cpu)
            if args.profile:
                profile = cProfile.Profile()  # in this thread: cProfile sees only its own
                profile.runcall(_reader, tier, keys, 0, _until(time.monotonic() + args.seconds))
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
        tier.close()


if __name__ == "__main__":
    main()

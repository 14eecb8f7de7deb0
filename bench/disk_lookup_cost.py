"""`python -m bench.disk_lookup_cost`: the CPU of asking the disk tier about a block it lacks.

Every block of a cold epoch is looked up in the disk tier before it is fetched. The lookup
either asks the tier's SQLite index in a worker thread, or is answered by the tier's key
filter (pffs.cache.diskkeys) in the trio thread. Both are timed here on a real tier in a
temporary directory, `--lookups` cold keys each, as the process's CPU time per lookup (the
worker thread's share included), alternating `--rounds` times.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import trio

from pffs.cache.background import Background
from pffs.cache.disk import DiskTier
from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats


def cpu_per_lookup(lookups: int, filtered: bool) -> float:
    """Microseconds of CPU per lookup of a key the tier lacks, with or without the filter."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-lookup-") as directory:
        tier = DiskTier(directory, 1 << 30, free_ratio=0.0, compress=False)
        tier.put_batch([(f"cached-{n}", b"x" * 100, "src") for n in range(100)])
        disk = DiskIO(tier, 4096, threads=4, stats=CacheStats(), background=Background())
        spent: list[float] = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                disk._background.attach(nursery)
                await disk.present([BlockKey("src", "first", "v", 0)])  # loads the filter
                while disk._keys_reading:
                    await trio.sleep(0)
                if not filtered:  # a filter never read is never trusted: every lookup hops
                    disk._keys_read_at, disk._keys_reading = -math.inf, True
                started = time.process_time()
                for n in range(lookups):
                    await disk.present([BlockKey("src", f"train/{n}", "v", 0)])
                spent.append(time.process_time() - started)

        trio.run(main)
        tier.close()
    return spent[0] / lookups * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        hop = cpu_per_lookup(args.lookups, filtered=False)
        known = cpu_per_lookup(args.lookups, filtered=True)
        print(f"index in a worker thread {hop:6.1f} us   key filter {known:5.1f} us", flush=True)


if __name__ == "__main__":
    main()

"""Simulation: epoch 2's share served from the cache when a dataset is twice the cache.

`python -m bench.probes.subset_sim` replays shuffled epochs over a dataset of equal files (one block
each) through a model of pffs's two tiers: a memory tier (LRU) in front of a disk tier, each
bounded in files. It compares how the disk tier admits and evicts:

- `today`: every fetched block is written; the oldest stored is evicted (least recently
  stored, diskcache's policy in the disk tier);
- `lru`: the same with least recently used eviction (what most caches do);
- `first come`: CoorDL's rule: once the tier is full, new blocks of the dataset are not
  admitted (they are served from the store), so nothing of it is evicted by itself;
- `hash subset`: pffs's rule (pffs.cache.datasetroom): a file is admitted when a hash of its
  name falls below a threshold placed so the files below it fill `--keep-share` of the tier,
  so the subset is the same in every epoch, mount and process.

It prints epoch 2's share of bytes from the cache (memory or disk), the mean over seeds. The
figures are in docs/notes/dataset-larger-than-cache.md.
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict
from collections.abc import Callable

from pffs.cache.datasetroom import KEEP_SHARE, subset_point

POLICIES = ("today", "lru", "first come", "hash subset")


def epoch_shares(
    policy: str, files: int, disk: int, memory: int, epochs: int, seed: int, keep: float
) -> list[float]:
    """The share of each epoch's reads served from the cache, for one seed."""
    memory_tier: OrderedDict[int, None] = OrderedDict()
    disk_tier: OrderedDict[int, None] = OrderedDict()
    # The threshold pffs places: the files below it fill the room (all files are one size).
    points = [subset_point(f"seed {seed}", f"f{f}") for f in range(files)]
    room = int(keep * disk)
    threshold = 1.0 if room >= files else sorted(points)[room]
    admitted: Callable[[int], bool] = {
        "today": lambda _f: True,
        "lru": lambda _f: True,
        "first come": lambda _f: len(disk_tier) < disk,
        "hash subset": lambda f: points[f] < threshold,
    }[policy]
    shares = []
    for epoch in range(epochs):
        order = list(range(files))
        random.Random(seed * 1000 + epoch).shuffle(order)
        hits = 0
        for name in order:
            if name in memory_tier:
                memory_tier.move_to_end(name)
                hits += 1
            elif name in disk_tier:
                hits += 1
                if policy == "lru":
                    disk_tier.move_to_end(name)
            elif admitted(name):
                disk_tier[name] = None
                while len(disk_tier) > disk:
                    disk_tier.popitem(last=False)
            memory_tier[name] = None
            while len(memory_tier) > memory:
                memory_tier.popitem(last=False)
        shares.append(hits / files)
    return shares


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.subset_sim", description=__doc__)
    p.add_argument("--files", type=int, default=1000, help="files in the dataset (1000)")
    p.add_argument("--disk", type=int, default=512, help="files the disk tier holds (512)")
    p.add_argument("--memory", type=int, default=64, help="files the memory tier holds (64)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (3)")
    p.add_argument("--seeds", type=int, default=20, help="seeds averaged (20)")
    p.add_argument(
        "--keep-share", type=float, default=KEEP_SHARE, help=f"hash subset's share ({KEEP_SHARE})"
    )
    args = p.parse_args(argv)
    print(f"{args.files} files, disk {args.disk}, memory {args.memory}: share from the cache")
    for policy in POLICIES:
        runs = [
            epoch_shares(
                policy, args.files, args.disk, args.memory, args.epochs, seed, args.keep_share
            )
            for seed in range(args.seeds)
        ]
        means = [sum(run[e] for run in runs) / len(runs) for e in range(args.epochs)]
        print(f"  {policy:12} " + "  ".join(f"epoch {e + 1} {m:6.1%}" for e, m in enumerate(means)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

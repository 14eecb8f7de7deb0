"""`pffs cache info|clear`: the disk tier's usage per source, or emptied."""

from __future__ import annotations

import os

from pffs.cache.disk import DiskTier
from pffs.cli.progress import size_text


def cache_admin(cache_dir: str, action: str, source: str | None = None) -> int:
    """`pffs cache info|clear`: show the disk tier's usage per source, or empty it (and remove
    the files a crashed writer left that no entry names)."""
    directory = os.path.abspath(cache_dir)
    if not os.path.isdir(directory):
        print(f"no cache at {directory}")
        return 0
    tier = DiskTier(directory, capacity=1 << 62, free_ratio=0.0, compress=False)
    try:
        if action == "clear":
            removed = tier.clear(source)
            what = f"{source}'s blocks" if source else "blocks"
            print(f"removed {removed} {what} from {directory}")
            orphans = tier.sweep()  # files a crashed writer left unindexed (pffs.cache.orphans)
            if orphans.files:
                print(f"removed {orphans.files} orphaned files ({size_text(orphans.bytes)})")
            return 0
        usage = list(tier.usage_by_source())
        blocks = sum(u.blocks for u in usage)
        print(f"cache {directory}: {size_text(tier.volume())} on disk, {blocks} blocks")
        for u in usage:
            print(f"  {u.source}: {u.blocks} blocks, {size_text(u.bytes)}")
        return 0
    finally:
        tier.close()

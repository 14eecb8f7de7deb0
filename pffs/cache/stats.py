"""Counters of the block cache: what was served from where, and what it cost.

Plain integers bumped from trio tasks; the observability layer reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0  # blocks fetched from the store for a reader or loaded ahead
    bytes_from_store: int = 0
    memory_evictions: int = 0
    disk_writes: int = 0
    disk_write_skips: int = 0  # not written: disk full, below the free-space floor, or an error
    # Not written: outside the stable subset of a dataset larger than the cache (datasetroom.py).
    disk_writes_declined: int = 0
    disk_corrupt: int = 0  # entries dropped for a bad checksum, length or header
    single_flight_waits: int = 0  # readers that joined a fetch already in flight
    readahead_issued: int = 0
    readahead_used: int = 0
    readahead_skipped_budget: int = 0
    # For pffs.metrics: lookups a tier could not answer, bytes handed to readers per tier, and
    # blocks loaded ahead evicted before any reader asked for them.
    memory_misses: int = 0
    disk_misses: int = 0
    disk_misses_known: int = 0  # of those lookups, answered by the key filter without the index
    memory_bytes_served: int = 0
    disk_bytes_served: int = 0
    store_bytes_served: int = 0
    readahead_wasted: int = 0
    # Cached bytes pushed into the kernel's page cache around random reads (pffs.fs.pagecache):
    # windows stored, their bytes, windows not stored (the version changed, the bytes were gone,
    # the kernel refused) and windows dropped because the pusher's queue was full.
    page_pushes: int = 0
    page_pushed_bytes: int = 0
    page_push_skipped: int = 0
    page_push_dropped: int = 0

    def count_fetched(self, data: bytes) -> None:
        """A block came from the store (for a reader, readahead, preload or warmup)."""
        self.misses += 1
        self.bytes_from_store += len(data)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

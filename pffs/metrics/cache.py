"""The block cache's metrics and the datasets' it watches: plain integers read at scrape time.

The cache keeps plain integers (CacheStats: no lock, no label lookup per block) and the preload
engine its own (PreloadStats); a mount hands a reader of them to `watch` (pffs.mounting.observe)
and the collector here turns them into metrics each time the registry is read. The datasets
being consumed (pffs.cache.datasetroom) are one sample each, labelled by dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pffs.metrics.registry import REGISTRY

# --- the block cache -------------------------------------------------------------------------
# CacheStats field -> (metric, labels). The cache keeps plain integers (no lock, no label
# lookup per block); this collector turns them into metrics when they are read.

_CACHE_COUNTERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "memory_hits": ("pffs_cache_hits", "Blocks served from a cache tier", {"tier": "memory"}),
    "disk_hits": ("pffs_cache_hits", "", {"tier": "disk"}),
    "memory_misses": (
        "pffs_cache_misses",
        "Block lookups a cache tier could not answer (a disk miss is a store fetch)",
        {"tier": "memory"},
    ),
    "disk_misses": ("pffs_cache_misses", "", {"tier": "disk"}),
    "disk_misses_known": (
        "pffs_cache_disk_filter_misses",
        "Disk tier lookups its key filter answered (absent) without asking the index",
        {},
    ),
    "memory_bytes_served": (
        "pffs_cache_served_bytes",
        "Bytes handed to readers, by the tier that held them (store: fetched for the reader)",
        {"tier": "memory"},
    ),
    "disk_bytes_served": ("pffs_cache_served_bytes", "", {"tier": "disk"}),
    "store_bytes_served": ("pffs_cache_served_bytes", "", {"tier": "store"}),
    "misses": (
        "pffs_cache_store_fetches",
        "Blocks fetched from the store (reads, readahead, preload)",
        {},
    ),
    "bytes_from_store": (
        "pffs_cache_store_fetched_bytes",
        "Bytes of blocks fetched from the store (reads, readahead, preload, warmup)",
        {},
    ),
    "memory_evictions": (
        "pffs_cache_evictions",
        "Blocks evicted from a cache tier to make room",
        {"tier": "memory"},
    ),
    "disk_writes": ("pffs_cache_disk_writes", "Blocks written to the disk tier", {}),
    "disk_write_skips": (
        "pffs_cache_disk_write_skips",
        "Blocks not written to the disk tier (full, below the free-space floor, error)",
        {},
    ),
    "disk_writes_declined": (
        "pffs_cache_disk_writes_declined",
        "Blocks not written to the disk tier: outside the stable subset of a dataset larger "
        "than the cache",
        {},
    ),
    "disk_corrupt": (
        "pffs_cache_disk_corrupt",
        "Disk tier entries dropped for a bad checksum, length or header",
        {},
    ),
    "single_flight_waits": (
        "pffs_cache_single_flight_waits",
        "Readers that joined a block fetch already in flight",
        {},
    ),
    "readahead_issued": (
        "pffs_readahead_issued",
        "Blocks of readahead windows loaded ahead of their readers",
        {},
    ),
    "readahead_used": (
        "pffs_readahead_used",
        "Blocks of readahead windows a reader then asked for",
        {},
    ),
    "readahead_wasted": (
        "pffs_readahead_wasted",
        "Blocks of readahead windows evicted from memory before any reader asked for them",
        {},
    ),
    "readahead_skipped_budget": (
        "pffs_readahead_skipped",
        "Readahead blocks not loaded because the budget of bytes loaded ahead was spent",
        {},
    ),
    "page_pushes": (
        "pffs_page_cache_pushes",
        "Windows of cached bytes pushed into the kernel's page cache around random reads",
        {},
    ),
    "page_pushed_bytes": (
        "pffs_page_cache_pushed_bytes",
        "Bytes pushed into the kernel's page cache around random reads",
        {},
    ),
    "page_push_skipped": (
        "pffs_page_cache_push_skipped",
        "Pushes not made: the version changed, the bytes were gone, or the kernel refused",
        {},
    ),
    "page_push_dropped": (
        "pffs_page_cache_push_dropped",
        "Pushes dropped because the pusher's queue was full",
        {},
    ),
    # Preload (pffs.cache.preload, through pffs.fs.datasets): whole files loaded ahead.
    "preload_files_queued": (
        "pffs_preload_files_queued",
        "Files of detected datasets and order lists taken up for loading ahead",
        {},
    ),
    "preload_files_fetched": (
        "pffs_preload_files_fetched",
        "Files loaded ahead from the store",
        {},
    ),
    "preload_files_cached": (
        "pffs_preload_files_cached",
        "Files taken up for loading ahead that were already cached",
        {},
    ),
    "preload_files_failed": (
        "pffs_preload_files_failed",
        "Files whose loading ahead failed (their readers fetch them themselves)",
        {},
    ),
    "preload_bytes_fetched": (
        "pffs_preload_files_fetched_bytes",
        "Bytes of files loaded ahead from the store",
        {},
    ),
    "preload_files_used": (
        "pffs_preload_files_used",
        "Files loaded ahead that a reader then opened",
        {},
    ),
    "preload_files_wasted": (
        "pffs_preload_files_wasted",
        "Files loaded ahead whose dataset ended before a reader opened them",
        {},
    ),
}
_CACHE_GAUGES: dict[str, tuple[str, str]] = {
    "memory_used_bytes": ("pffs_cache_memory_used_bytes", "Bytes held by the memory tier"),
    "memory_capacity_bytes": ("pffs_cache_memory_capacity_bytes", "Bound of the memory tier"),
    "memory_blocks": ("pffs_cache_memory_blocks", "Blocks held by the memory tier"),
    "ahead_in_flight_bytes": (
        "pffs_ahead_in_flight_bytes",
        "Bytes being loaded ahead now (readahead and preload)",
    ),
    "staged_files": ("pffs_staged_files", "Files open for writing (staged locally)"),
    "preload_files_in_flight": (
        "pffs_preload_files_in_flight",
        "Files being loaded ahead now",
    ),
    "preload_bytes_in_flight": (
        "pffs_preload_files_in_flight_bytes",
        "Bytes of files being loaded ahead now",
    ),
}

CacheReader = Callable[[], Mapping[str, int]]


class _CacheCollector(Collector):
    """Reads the block cache's integers at collection time (see pffs.mounting.observe)."""

    def __init__(self) -> None:
        self.readers: list[CacheReader] = []

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, int] = {}
        for reader in list(self.readers):
            try:
                values = reader()
            except RuntimeError:  # a dict resized under us by the trio thread: skip this once
                continue
            for name, value in values.items():
                totals[name] = totals.get(name, 0) + int(value)
        families: dict[str, CounterMetricFamily] = {}
        for field, (name, doc, labels) in _CACHE_COUNTERS.items():
            family = families.get(name)
            if family is None:
                family = CounterMetricFamily(name, doc, labels=list(labels))
                families[name] = family
            family.add_metric(list(labels.values()), totals.get(field, 0))
        yield from families.values()
        for field, (name, doc) in _CACHE_GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=totals.get(field, 0))

    def describe(self) -> Iterator[Metric]:
        return self.collect()


_CACHE = _CacheCollector()
REGISTRY.register(_CACHE)


def watch(reader: CacheReader) -> None:
    """Report the counters `reader()` returns (CacheStats fields and the gauges above)."""
    _CACHE.readers.append(reader)


def unwatch(reader: CacheReader) -> None:
    if reader in _CACHE.readers:
        _CACHE.readers.remove(reader)


# --- datasets being consumed ----------------------------------------------------------------
# A field of pffs.cache.datasetroom's `describe` -> (gauge, help), one sample per dataset.

_DATASET_GAUGES: dict[str, tuple[str, str]] = {
    "size": ("pffs_dataset_size_bytes", "Bytes of a dataset being consumed (as far as listed)"),
    "files": ("pffs_dataset_files", "Files of a dataset being consumed (as far as listed)"),
    "cached": ("pffs_dataset_cached_bytes", "Bytes of a dataset the disk tier holds"),
    "room": ("pffs_dataset_room_bytes", "Bytes of the disk tier a dataset may keep"),
    "fits": (
        "pffs_dataset_fits",
        "1 when a dataset fits its room; 0 when the cache keeps a stable subset of it",
    ),
}

DatasetReader = Callable[[], list[dict[str, Any]]]


class _DatasetCollector(Collector):
    """Reads the datasets a mount's cache watches at collection time, one sample each."""

    def __init__(self) -> None:
        self.readers: list[DatasetReader] = []

    def collect(self) -> Iterator[Metric]:
        watched = []
        for reader in list(self.readers):
            try:
                watched += reader()
            except RuntimeError:  # a dict resized under us by the trio thread: skip this once
                continue
        for field, (name, doc) in _DATASET_GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["dataset"])
            for dataset in watched:
                family.add_metric([str(dataset["dataset"])], float(dataset[field]))
            yield family

    def describe(self) -> Iterator[Metric]:
        return self.collect()


_DATASETS = _DatasetCollector()
REGISTRY.register(_DATASETS)


def watch_datasets(reader: DatasetReader) -> None:
    """Report the datasets `reader()` describes (pffs.cache.datasetroom's `describe`)."""
    _DATASETS.readers.append(reader)


def unwatch_datasets(reader: DatasetReader) -> None:
    if reader in _DATASETS.readers:
        _DATASETS.readers.remove(reader)

"""The metrics registry every layer reports to, and the snapshot the stats file and CLI show.

This module sits below every other pffs layer: it imports only the standard library,
prometheus-client and pffs.errors, so the cache, the VFS, the backends and the kernel edge can
all count into it without breaking the import rules of docs/ARCHITECTURE.md.

Names follow Prometheus conventions: a `pffs_` prefix, counters end in `_total`, units as
suffixes (`_bytes_total`, `_seconds`). The hot path stays cheap: FUSE requests (`FuseOp`) and
the block cache (CacheStats) keep plain numbers that a collector reads only when someone
scrapes or opens the stats file.

Three readers share one registry (REGISTRY): the Prometheus HTTP endpoint (`--metrics ADDR`),
the hidden `.pffs/stats` file (`snapshot()`, JSON) and `pffs stats` (which reads that file).
"""

from __future__ import annotations

import bisect
import errno as errno_names
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pffs.errors import UsageError

log = logging.getLogger("pffs.metrics")

# The `_created` series double every counter for little use; Prometheus has its own resets.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
REGISTRY = CollectorRegistry(auto_describe=True)
# Memory and CPU of the mount process: "memory growth until OOM" is the top complaint of peers.
ProcessCollector(namespace="pffs", registry=REGISTRY)

# Latencies from a page-cache-speed FUSE reply (tens of microseconds) to a stalled store (a minute).
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# --- the kernel edge -------------------------------------------------------------------------

# Counts and latencies of FUSE requests are kept by FuseOp in plain numbers and reported by
# _FuseCollector below: a prometheus_client counter and histogram take their locks on every
# request, a sizable share of pffs's own CPU for a cached lookup.
FUSE_ERRORS = Counter(
    "pffs_fuse_errors_total",
    "FUSE requests answered with an error, by operation and errno name",
    ["op", "errno"],
    registry=REGISTRY,
)
OPEN_FILES = Gauge("pffs_open_files", "Files open through the mount", registry=REGISTRY)
SOURCE_UP = Gauge(
    "pffs_source_up", "1 while a source answers, 0 while it is down", ["source"], registry=REGISTRY
)

# --- the store -------------------------------------------------------------------------------

BACKEND_REQUESTS = Counter(
    "pffs_backend_requests_total",
    "Requests to a store (one per call, retries included), by source and request type",
    ["source", "request"],
    registry=REGISTRY,
)
BACKEND_ERRORS = Counter(
    "pffs_backend_errors_total",
    "Store requests that failed after their retries, by source, request type and error",
    ["source", "request", "error"],
    registry=REGISTRY,
)
BACKEND_RETRIES = Counter(
    "pffs_backend_retries_total",
    "Transient store failures retried, by source and request type",
    ["source", "request"],
    registry=REGISTRY,
)
BACKEND_BYTES = Counter(
    "pffs_backend_received_bytes_total",
    "Bytes of object data received from a store, by source and request type",
    ["source", "request"],
    registry=REGISTRY,
)
BACKEND_SECONDS = Histogram(
    "pffs_backend_request_seconds",
    "Time of a store request including its retries, by source and request type",
    ["source", "request"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
BACKEND_SLOW = Counter(
    "pffs_backend_slow_requests_total",
    "Store requests slower than the --slow-request threshold (each one is logged)",
    ["source", "request"],
    registry=REGISTRY,
)

# --- writes ----------------------------------------------------------------------------------

STAGED_BYTES = Counter(
    "pffs_staged_bytes_total",
    "Bytes written into local staging files by writers",
    registry=REGISTRY,
)
UPLOADED_BYTES = Counter(
    "pffs_uploaded_bytes_total",
    "Bytes of staged files uploaded to a store, by source",
    ["source"],
    registry=REGISTRY,
)
UPLOADS = Counter(
    "pffs_uploads_total",
    "Staged files uploaded to a store, by source",
    ["source"],
    registry=REGISTRY,
)
UPLOAD_FAILURES = Counter(
    "pffs_upload_failures_total",
    "Uploads of staged files that failed (the data stays in the staging area), by source",
    ["source"],
    registry=REGISTRY,
)


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
        "Blocks loaded ahead that a reader then asked for",
        {},
    ),
    "readahead_wasted": (
        "pffs_readahead_wasted",
        "Blocks loaded ahead evicted from memory before any reader asked for them",
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
    "preload_throttled": (
        "pffs_preload_throttled",
        "Store errors (503 SlowDown, timeouts) that halved the preload concurrency",
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
    "preload_concurrency": (
        "pffs_preload_concurrency",
        "Files preload may load at once now (Little's law, halved on throttling)",
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


def watch_cache(reader: CacheReader) -> None:
    """Report the counters `reader()` returns (CacheStats fields and the gauges above)."""
    _CACHE.readers.append(reader)


def unwatch_cache(reader: CacheReader) -> None:
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


# --- hooks used by the layers ----------------------------------------------------------------


class FuseOp:
    """The count and latency histogram of one FUSE operation, in plain numbers.

    Only the trio thread serving the kernel calls `done`; a scrape reads the numbers from
    another thread, which under the GIL sees each one whole (at worst one request behind).
    """

    def __init__(self, op: str) -> None:
        self.op = op
        self.seconds = 0.0
        # One count per latency bucket (`le` bounds), and one past the last (+Inf).
        self.buckets = [0] * (len(_LATENCY_BUCKETS) + 1)

    def done(self, started: float, error: int | None = None) -> None:
        took = time.perf_counter() - started
        self.seconds += took
        self.buckets[bisect.bisect_left(_LATENCY_BUCKETS, took)] += 1
        if error is not None:
            FUSE_ERRORS.labels(self.op, errno_name(error)).inc()


def fuse_op(op: str) -> FuseOp:
    """The metrics of FUSE operation `op`, reported from now on (one per name)."""
    return _FUSE.ops.setdefault(op, FuseOp(op))


# The `le` labels of the latency buckets, as prometheus_client writes them.
_BUCKET_LABELS = [*(str(bound) for bound in _LATENCY_BUCKETS), "+Inf"]


class _FuseCollector(Collector):
    """pffs_fuse_operations_total and pffs_fuse_operation_seconds, read from the FuseOps."""

    def __init__(self) -> None:
        self.ops: dict[str, FuseOp] = {}

    def collect(self) -> Iterator[Metric]:
        served = CounterMetricFamily(
            "pffs_fuse_operations", "FUSE requests served, by operation", labels=["op"]
        )
        seconds = HistogramMetricFamily(
            "pffs_fuse_operation_seconds",
            "Time to answer a FUSE request, by operation",
            labels=["op"],
        )
        for op, fuse in list(self.ops.items()):
            cumulative = list(itertools.accumulate(list(fuse.buckets)))
            served.add_metric([op], cumulative[-1])
            seconds.add_metric(
                [op],
                buckets=list(zip(_BUCKET_LABELS, cumulative, strict=True)),
                sum_value=fuse.seconds,
            )
        yield served
        yield seconds

    def describe(self) -> Iterator[Metric]:
        return self.collect()


_FUSE = _FuseCollector()
REGISTRY.register(_FUSE)


def errno_name(number: int) -> str:
    return errno_names.errorcode.get(number, str(number))


class _Settings:
    # A store request slower than this is logged at WARNING (--slow-request). 5 s: well above
    # a healthy GET of a 4 MiB block, well below the minute a reader waits before EIO.
    slow_request = 5.0


SETTINGS = _Settings()


def request_type(what: str) -> str:
    """The request type of a backend's description: 'UploadPart 3' -> 'UploadPart'."""
    return what.split(" ", 1)[0] or "request"


def count_backend_bytes(source: str, what: str, count: int) -> None:
    """Count object bytes received by a request that streams them (not one bytes result)."""
    BACKEND_BYTES.labels(source, request_type(what)).inc(count)


class BackendRequest:
    """Times and counts one store request (with its retries); a context manager.

    Backends use it inside `_call`: `with BackendRequest(source, what, path) as request:
    return request.received(call_with_retry(..., on_retry=request.retried))`. A request slower
    than SETTINGS.slow_request is logged at WARNING with its timing, type, path and source.
    """

    __slots__ = ("_extra_retry", "path", "request", "source", "started")

    def __init__(
        self,
        source: str,
        what: str,
        path: str = "",
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.source = source
        self.request = request_type(what)
        self.path = path
        self._extra_retry = on_retry
        self.started = 0.0

    def __enter__(self) -> BackendRequest:
        self.started = time.perf_counter()
        return self

    def retried(self, exc: BaseException) -> None:
        BACKEND_RETRIES.labels(self.source, self.request).inc()
        if self._extra_retry is not None:
            self._extra_retry(exc)

    def received(self, result: Any) -> Any:
        """Pass a result through, counting its bytes when it is object data."""
        if isinstance(result, (bytes, bytearray, memoryview)):
            BACKEND_BYTES.labels(self.source, self.request).inc(len(result))
        return result

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self.started
        BACKEND_REQUESTS.labels(self.source, self.request).inc()
        BACKEND_SECONDS.labels(self.source, self.request).observe(elapsed)
        if exc is not None:
            BACKEND_ERRORS.labels(self.source, self.request, error_label(exc)).inc()
        if elapsed >= SETTINGS.slow_request:
            BACKEND_SLOW.labels(self.source, self.request).inc()
            outcome = f"failed: {error_label(exc)}" if exc is not None else "ok"
            log.warning(
                "slow store request: %s took %.3fs (threshold %gs) path=/%s source=%s (%s)",
                self.request,
                elapsed,
                SETTINGS.slow_request,
                self.path,
                self.source,
                outcome,
            )


def error_label(exc: BaseException) -> str:
    """A short, low-cardinality name for a failure: an S3 error code, else the class name."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    return type(exc).__name__


# --- reading it all --------------------------------------------------------------------------

_INFO: dict[str, Any] = {"pid": os.getpid(), "start_time": time.time()}
_INFO_LOCK = threading.Lock()


def set_info(**info: Any) -> None:
    """Facts about this mount shown at the top of the stats snapshot (mountpoint, sources)."""
    with _INFO_LOCK:
        _INFO.update(info)


STATS_FORMAT = 1


def snapshot() -> dict[str, Any]:
    """Every metric now, as JSON-ready data (the `.pffs/stats` file, `pffs stats --json`).

    {"format": 1, "time": ..., "pid": ..., "mountpoint": ..., "sources": [...],
     "metrics": {name: {"type": ..., "help": ..., "samples": [{"labels": {...}, "value": v}]}}}
    Counters are named as Prometheus shows them (with `_total`); a histogram sample carries
    "count", "sum" and cumulative "buckets" [[le, count], ...] instead of "value".
    """
    with _INFO_LOCK:
        data: dict[str, Any] = dict(_INFO)
    data = {"format": STATS_FORMAT, "time": time.time(), **data}
    metrics: dict[str, Any] = {}
    for family in REGISTRY.collect():
        if family.type == "histogram":
            metrics[family.name] = _histogram(family)
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        samples = [
            {"labels": dict(s.labels), "value": s.value}
            for s in family.samples
            if s.name == name or (family.type != "counter" and s.name == family.name)
        ]
        metrics[name] = {"type": family.type, "help": family.documentation, "samples": samples}
    data["metrics"] = metrics
    return data


def _histogram(family: Metric) -> dict[str, Any]:
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        key = tuple(sorted(labels.items()))
        entry = series.setdefault(key, {"labels": labels, "count": 0, "sum": 0.0, "buckets": []})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append([sample.labels["le"], sample.value])
        elif sample.name.endswith("_count"):
            entry["count"] = sample.value
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
    return {"type": "histogram", "help": family.documentation, "samples": list(series.values())}


def metric_names() -> set[str]:
    """Every series name the registry can expose, with or without samples yet (dashboards)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("_count", "_sum", ""),
    }
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def serve_http(address: str) -> tuple[Any, threading.Thread]:
    """Serve the Prometheus endpoint at HOST:PORT from a daemon thread; (server, thread)."""
    from prometheus_client import start_http_server

    host, port = parse_address(address)
    return start_http_server(port, addr=host, registry=REGISTRY)


def parse_address(address: str) -> tuple[str, int]:
    """'127.0.0.1:9567', ':9567' (all interfaces) or '[::1]:9567' -> (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--metrics {address!r} is not HOST:PORT (like 127.0.0.1:9567)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)

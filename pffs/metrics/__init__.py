"""The metrics registry every layer reports to, and the snapshot the stats file and CLI show.

This module sits below every other pffs layer: it imports only the standard library,
prometheus-client and pffs.errors, so the cache, the VFS, the backends and the kernel edge can
all count into it without breaking the import rules of docs/ARCHITECTURE.md.

Names follow Prometheus conventions: a `pffs_` prefix, counters end in `_total`, units as
suffixes (`_bytes_total`, `_seconds`). The hot path stays cheap: FUSE requests (`FuseOp`) and
the block cache (CacheStats, read by the collectors of cache.py) keep plain numbers that a
collector reads only when someone scrapes or opens the stats file.

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
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pffs.metrics import cache as cache  # its collectors count from the first import on
from pffs.metrics import paces as paces
from pffs.metrics.registry import REGISTRY as REGISTRY  # the one registry, for every reader
from pffs.optionvalues import host_port

log = logging.getLogger("pffs.metrics")


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

    host, port = host_port(address)  # checked when the option was read
    return start_http_server(port, addr=host, registry=REGISTRY)

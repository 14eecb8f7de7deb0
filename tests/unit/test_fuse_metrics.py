"""FUSE request metrics kept in plain numbers: counts, latency buckets and errors as scraped."""

from __future__ import annotations

import errno
import time

from prometheus_client import generate_latest

from pffs import metrics


def series(name: str, **labels: str) -> float:
    """The value of one exposed sample, as Prometheus would scrape it."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in generate_latest(metrics.REGISTRY).decode().splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} is not exposed")


def test_requests_are_counted_timed_into_buckets_and_errors_labelled() -> None:
    op = metrics.fuse_op("unit_test_op")
    assert metrics.fuse_op("unit_test_op") is op  # one per name
    now = time.perf_counter()
    op.done(now)  # well under 100 us
    op.done(now - 0.003)  # about 3 ms
    op.done(now - 0.003, errno.ENOENT)
    assert series("pffs_fuse_operations_total", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_count", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_bucket", le="0.0025", op="unit_test_op") == 1
    assert series("pffs_fuse_operation_seconds_bucket", le="0.005", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_bucket", le="+Inf", op="unit_test_op") == 3
    assert 0.006 <= series("pffs_fuse_operation_seconds_sum", op="unit_test_op") < 0.1
    assert series("pffs_fuse_errors_total", errno="ENOENT", op="unit_test_op") == 1
    snapshot = metrics.snapshot()["metrics"]["pffs_fuse_operation_seconds"]["samples"]
    (ours,) = [s for s in snapshot if s["labels"] == {"op": "unit_test_op"}]
    assert ours["count"] == 3 and ["+Inf", 3] in ours["buckets"]

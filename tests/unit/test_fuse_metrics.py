"""FUSE request metrics kept in plain numbers: counts, latency buckets and errors as scraped."""

from __future__ import annotations

import errno
import time

import pytest
from prometheus_client import generate_latest

from pffs import metrics


def series(name: str, **labels: str) -> float:
    """The value of one exposed sample, as Prometheus would scrape it."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in generate_latest(metrics.REGISTRY).decode().splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} is not exposed")


def test_requests_are_counted_timed_into_buckets_and_errors_labelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = metrics.fuse_op("unit_test_op")
    assert metrics.fuse_op("unit_test_op") is op  # one per name
    # The clock stands still, so the buckets hold the durations given whatever the machine's
    # load (a thread descheduled between two calls once put "0 s" past 2.5 ms).
    now = time.perf_counter()
    monkeypatch.setattr(time, "perf_counter", lambda: now)
    op.done(now)  # 0 s
    op.done(now - 0.003)  # 3 ms
    op.done(now - 0.003, errno.ENOENT)
    assert series("pffs_fuse_operations_total", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_count", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_bucket", le="0.0025", op="unit_test_op") == 1
    assert series("pffs_fuse_operation_seconds_bucket", le="0.005", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_bucket", le="+Inf", op="unit_test_op") == 3
    assert series("pffs_fuse_operation_seconds_sum", op="unit_test_op") == pytest.approx(0.006)
    assert series("pffs_fuse_errors_total", errno="ENOENT", op="unit_test_op") == 1
    snapshot = metrics.snapshot()["metrics"]["pffs_fuse_operation_seconds"]["samples"]
    (ours,) = [s for s in snapshot if s["labels"] == {"op": "unit_test_op"}]
    assert ours["count"] == 3 and ["+Inf", 3] in ours["buckets"]

"""Observability: metrics through a real mount over moto, the Prometheus endpoint, the hidden
.pffs/stats file, `pffs stats`, the slow-request log line, the dashboard, log redaction."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import urllib.request
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import pffs.group.stats  # noqa: F401  (a mount in a group registers these on joining)
from pffs import metrics
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey
from pffs.cli.stats_view import quantile, render
from pffs.config import CacheConfig
from pffs.errors import MountpointError, UsageError
from pffs.logs import LineFormatter, redact
from pffs.testing.servers import free_port
from tests.conftest import metric_value, run_pffs, stats_snapshot

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "pffs-dashboard.json"


def _drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.mount
@pytest.mark.mount
def test_metrics_move_through_a_real_mount(s3, bucket: str, mount_s3, tmp_path: Path) -> None:
    size = 3 * MIB + 12345
    payload = os.urandom(size)
    s3.put_object(Bucket=bucket, Key="data/blob.bin", Body=payload)
    port = free_port()
    options: tuple[str, ...] = ("--metrics", f"127.0.0.1:{port}", "--slow-request", "0.000001")
    options += ("--block-size", "1M", "--cache-dir", str(tmp_path / "cache"))
    with mount_s3(f"s3://{bucket}", *options) as mnt:
        # Hidden, yet there: readdir does not list it, lookup finds it, it is read-only.
        assert os.listdir(mnt) == ["data"]
        assert os.path.isdir(mnt / ".pffs")
        assert sorted(os.listdir(mnt / ".pffs")) == ["preload", "preload.sock", "stats"]
        with pytest.raises(OSError) as refused:
            open(mnt / ".pffs" / "stats", "w")  # noqa: SIM115
        assert refused.value.errno in (errno.EROFS, errno.EACCES)
        with pytest.raises(OSError) as refused:
            (mnt / ".pffs" / "other").write_bytes(b"x")
        assert refused.value.errno in (errno.EROFS, errno.EACCES)

        before = stats_snapshot(mnt)
        assert before["format"] == 1 and before["mountpoint"] == str(mnt)
        source = f"s3://{bucket}@" + before["sources"][0].split("@", 1)[1]
        assert before["sources"] == [source]

        # A cold read: every block missed both tiers, and its bytes came from the store.
        assert (mnt / "data" / "blob.bin").read_bytes() == payload
        cold = stats_snapshot(mnt)
        got = metric_value(cold, "pffs_backend_received_bytes_total", request="GET", source=source)
        assert got - metric_value(before, "pffs_backend_received_bytes_total") >= size
        assert metric_value(cold, "pffs_cache_misses_total", tier="memory") > 0
        assert metric_value(cold, "pffs_cache_misses_total", tier="disk") >= 4  # 4 blocks of 1 MiB
        assert metric_value(cold, "pffs_cache_store_fetches_total") >= 4
        served = metric_value(cold, "pffs_cache_served_bytes_total")
        assert served - metric_value(before, "pffs_cache_served_bytes_total") == size
        assert metric_value(cold, "pffs_fuse_operations_total", op="read") > 0
        gets = metric_value(cold, "pffs_backend_requests_total", request="GET")
        assert 1 <= gets <= 4  # consecutive blocks read ahead share a GET

        # A warm read of the same file (page cache dropped): memory hits, no store bytes.
        _drop_page_cache(mnt / "data" / "blob.bin")
        assert (mnt / "data" / "blob.bin").read_bytes() == payload
        warm = stats_snapshot(mnt)
        hits = metric_value(warm, "pffs_cache_hits_total", tier="memory")
        assert hits > metric_value(cold, "pffs_cache_hits_total", tier="memory")
        assert metric_value(warm, "pffs_backend_received_bytes_total") == metric_value(
            cold, "pffs_backend_received_bytes_total"
        )
        memory_served = metric_value(warm, "pffs_cache_served_bytes_total", tier="memory")
        assert (
            memory_served - metric_value(cold, "pffs_cache_served_bytes_total", tier="memory")
            == size
        )
        assert metric_value(warm, "pffs_open_files") == 0

        # The Prometheus endpoint parses with prometheus-client's own parser, same numbers.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        hit_samples = {
            s.labels["tier"]: s.value
            for s in families["pffs_cache_hits"].samples
            if s.name == "pffs_cache_hits_total"
        }
        assert hit_samples["memory"] == hits
        assert "pffs_backend_request_seconds" in families
        assert "pffs_fuse_operation_seconds" in families
        assert "pffs_process_resident_memory_bytes" in families

        # `pffs stats --json` is the stats file: same metrics, same label sets, same cache counts.
        result = run_pffs("stats", str(mnt), "--json")
        assert result.returncode == 0, result.stderr
        cli = json.loads(result.stdout)
        stats = stats_snapshot(mnt)
        assert cli.keys() == stats.keys()
        assert cli["metrics"].keys() == stats["metrics"].keys()
        for name, family in stats["metrics"].items():
            labels = sorted(json.dumps(s["labels"], sort_keys=True) for s in family["samples"])
            cli_labels = [
                json.dumps(s["labels"], sort_keys=True) for s in cli["metrics"][name]["samples"]
            ]
            assert labels == sorted(cli_labels), name
        for name in ("pffs_cache_hits_total", "pffs_cache_served_bytes_total"):
            assert cli["metrics"][name] == stats["metrics"][name]

        # The live view: two frames of rates, no terminal needed.
        result = run_pffs("stats", str(mnt), "--count", "2", "--interval", "0.2")
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("pffs stats") == 2
        assert "hit ratio (bytes)" in result.stdout and "GET" in result.stdout

    # Every store request was over the tiny threshold: logged with timing, type, path, source.
    log_text = (tmp_path / "mnt.log").read_text()
    slow = [line for line in log_text.splitlines() if "slow store request: GET" in line]
    assert slow, log_text[-2000:]
    assert re.search(r"WARNING pffs\.metrics: slow store request: GET took [0-9.]+s", slow[0])
    assert "path=/data/blob.bin" in slow[0] and f"source={source}" in slow[0]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in log_text


def test_stats_of_a_directory_that_is_no_mount_is_one_line(tmp_path: Path) -> None:
    result = run_pffs("stats", str(tmp_path), "--json")
    assert result.returncode == MountpointError.exit_code
    assert result.stderr.count("\n") == 1 and "is not a pffs mount" in result.stderr


def test_a_bad_metrics_address_is_refused_before_mounting(tmp_path: Path) -> None:
    result = run_pffs("mount", "s3://bucket", str(tmp_path), "--metrics", "nonsense")
    assert result.returncode == UsageError.exit_code
    assert "HOST:PORT" in result.stderr and result.stderr.count("\n") == 1


def test_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dashboard["panels"]:
        exprs += [target["expr"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            exprs.append(variable["query"]["query"])
    assert len(exprs) > 20
    queried = {name for expr in exprs for name in re.findall(r"\bpffs_[a-z_]+", expr)}
    known = metrics.metric_names()
    assert queried, "the dashboard queries no pffs metric"
    assert queried <= known, sorted(queried - known)
    # And the dashboard covers every family pffs defines (a new metric needs a panel).
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in known}
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in queried}
    missing = {f for f in families - shown if not f.startswith("pffs_process_")}
    missing -= {"pffs_cache_store_fetches", "pffs_cache_store_fetched_bytes"}
    missing -= {"pffs_cache_single_flight_waits", "pffs_cache_memory_blocks"}
    assert not missing, sorted(missing)


def test_blocks_read_ahead_and_never_read_count_as_wasted() -> None:
    block = 64 * 1024
    config = CacheConfig(
        block_size=block, memory_bytes=8 * block, disk_dir=None, ahead_budget=4 * block
    )
    cache = BlockCache(config)

    async def fetch() -> bytes:
        return b"x" * block

    class Source:  # the store as a block source: every block is x's
        async def part(self, offset: int, length: int) -> bytes:
            return await fetch()

        @trio.as_safe_channel
        async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
            for index in range(first, first + count):
                yield index, await fetch()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache.attach(nursery)
            keys = [BlockKey("s", "u", "p", "v", index) for index in range(2)]
            assert cache.read_ahead(keys, [block, block], Source()) == 2  # loaded ahead
            await cache.flush()
            await cache.read(BlockKey("s", "u", "p", "v", 1), Source(), block)  # one is used
            for index in range(10, 20):  # readers push everything older out of memory
                await cache.read(BlockKey("s", "u", "p", "v", index), Source(), block, served=100)

    trio.run(main)
    stats = cache.stats
    assert stats.readahead_issued == 2 and stats.readahead_used == 1
    assert stats.readahead_wasted == 1
    assert stats.memory_misses == 10 and stats.memory_hits == 1
    assert stats.store_bytes_served == 10 * 100 and stats.memory_bytes_served == block


def test_rates_and_percentiles_of_the_live_view() -> None:
    buckets = [(0.001, 0.0), (0.01, 50.0), (0.1, 100.0), (float("inf"), 100.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.01)
    assert quantile(buckets, 0.75) == pytest.approx(0.055)
    assert quantile([(float("inf"), 0.0)], 0.5) is None

    def snap(t: float, hits: float, store: float) -> dict[str, Any]:
        served = [
            {"labels": {"tier": "memory"}, "value": hits},
            {"labels": {"tier": "disk"}, "value": 0},
            {"labels": {"tier": "store"}, "value": store},
        ]
        return {
            "time": t,
            "start_time": 0.0,
            "sources": ["s3://b"],
            "metrics": {
                "pffs_cache_served_bytes_total": {"type": "counter", "samples": served},
            },
        }

    frame = render(snap(10.0, 3e6, 1e6), snap(12.0, 9e6, 1e6), "/mnt")
    assert "last interval" in frame
    memory_line = next(line for line in frame.splitlines() if line.strip().startswith("memory"))
    assert memory_line.split()[3] == "3.0"  # (9-3) MB over 2 s
    assert "hit ratio (bytes): 100.0% now, 90.0% overall" in frame


def test_logs_are_one_line_and_never_hold_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    formatter = LineFormatter()
    record = logging.LogRecord(
        "pffs.test",
        logging.WARNING,
        __file__,
        1,
        "endpoint %s said\n%s",
        (
            "http://minio:hunter2pass@minio:9000",
            "key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY X-Amz-Signature=abc123 password: pw",
        ),
        None,
    )
    line = formatter.format(record)
    assert "\n" not in line
    for secret in ("hunter2pass", "wJalrXUtnFEMI", "abc123", " pw"):
        assert secret not in line
    assert "http://minio:***@minio:9000" in line
    assert redact("no secrets in s3://bucket/path here") == "no secrets in s3://bucket/path here"

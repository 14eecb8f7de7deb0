"""The clients' floors (bench.clientfloor) from a summarized run: the bytes each pattern must
fetch over the run's ceiling, the target from the best peer at each latency, the verdict where
the store allows no system the target, and the table the report prints."""

from __future__ import annotations

from typing import Any

import pytest

from bench.clientfloor import floor_table, floors, verdict
from bench.clients import fetched_key, seconds_key
from bench.report import markdown, summarize

MB = 1_000_000


def _summary(latency_ms: float, ceilings: list[dict[str, float]]) -> dict[str, Any]:
    figures: dict[str, dict[str, float | str]] = {  # two patterns; a peer's error has no time
        "pffs": {"parquet_scan": 2.0, "tar": 1.5},
        "s3fs": {"parquet_scan": 2.5, "tar": "error: timed out"},
        "rclone": {"parquet_scan": 3.0, "tar": 2.0},
    }
    runs = [
        {
            "server": "s",
            "system": system,
            "rep": 0,
            "results": {
                **{seconds_key(pattern): value for pattern, value in mine.items()},
                fetched_key("parquet_scan"): 1.0,
            },
        }
        for system, mine in figures.items()
    ]
    entry = {
        "name": "s",
        "systems": list(figures),
        "latency_ms": latency_ms,
        "ceiling_runs": ceilings,
        # tar's are half the scan's; the lazy load ran for nobody, so it has no row
        "clients_must_fetch_bytes": {
            "parquet_scan": 300 * MB,
            "tar": 150 * MB,
            "safetensors_lazy": 50 * MB,
        },
    }
    return summarize(runs, [entry])


def test_the_floor_is_the_bytes_over_the_median_ceiling_and_the_target_077_of_the_best_peer() -> (
    None
):
    ceilings = [{"server_mbs": 100.0}, {"server_mbs": 150.0}, {"server_mbs": 120.0}]
    [server] = _summary(20, ceilings)["servers"]
    scan, tar = floors(server)
    assert scan.pattern == "parquet_scan" and tar.pattern == "tar"
    assert scan.floor_s == pytest.approx(300 / 120)  # the median ceiling, 120 MB/s
    assert scan.best_peer == "s3fs"
    assert scan.target_s == pytest.approx(2.5 * 0.77)
    # 2.5 s of floor over a 1.925 s target: no system could have met it on this store.
    assert scan.reachable is False and scan.met is False
    assert verdict(scan) == "no: floor 2.50 s > target 1.93 s"
    # The peer whose run failed is no best peer: rclone's 2.0 s is.
    assert tar.best_peer == "rclone"
    assert tar.floor_s == pytest.approx(1.25)
    assert tar.target_s == pytest.approx(1.54)
    assert tar.reachable is True and tar.met is True
    assert verdict(tar) == "yes"


def test_at_0_ms_the_target_is_the_best_peer_and_the_clients_own_ceiling_is_preferred() -> None:
    ceilings = [{"server_mbs": 60.0, "clients_server_mbs": 200.0}]
    [server] = _summary(0, ceilings)["servers"]
    scan, tar = floors(server)
    assert scan.target_s == pytest.approx(2.5)
    assert scan.floor_s == pytest.approx(1.5)
    assert scan.reachable is True and scan.met is True
    assert tar.floor_s == pytest.approx(0.75)


def test_the_report_prints_the_floor_table_only_for_a_run_with_the_clients() -> None:
    summary = _summary(20, [{"server_mbs": 120.0}])
    table = markdown(summary)
    assert "Clients against the store's floor" in table
    assert (
        "| Parquet: files read whole | 2.00 | 2.50 (s3fs) | 1.25x | 2.50 | 1.93 "
        "| no: floor 2.50 s > target 1.93 s | no |"
    ) in table
    assert (
        "| tar shards through tarfile | 1.50 | 2.00 (rclone) | 1.33x | 1.25 | 1.54 | yes | yes |"
    ) in table
    [server] = summary["servers"]
    assert floor_table({**server, "clients_must_fetch_bytes": {}}) == ""
    without_ceiling = floors({**server, "ceilings": {}})
    assert [row.floor_s for row in without_ceiling] == [None, None]
    assert [verdict(row) for row in without_ceiling] == ["-", "-"]

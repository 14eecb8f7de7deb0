"""The report's arithmetic on the new figures: ratios to the best peer, the request line, and
numbers below zero (an RSS that shrank over a scenario)."""

from __future__ import annotations

from bench.report import markdown, ratio_to_best_peer, summarize
from bench.scenarios import METRICS

BY_KEY = {metric.key: metric for metric in METRICS}


def test_lower_is_better_figures_compare_the_right_way() -> None:
    requests = BY_KEY["epoch2_remount_requests"]
    assert ratio_to_best_peer(requests, 10, [2000, 4000]) == 200
    assert ratio_to_best_peer(BY_KEY["lsr_100k_s"], 20, [10, 40]) == 0.5


def test_a_figure_at_or_below_zero_has_no_ratio() -> None:
    growth = BY_KEY["lsr_rss_bytes_per_entry"]
    assert ratio_to_best_peer(growth, 168, [988, -1609]) is None
    assert ratio_to_best_peer(growth, -5, [988]) is None
    assert ratio_to_best_peer(growth, 168, [336]) == 2


def test_the_table_shows_each_system_requests_by_kind() -> None:
    runs = [
        {"server": "s", "system": system, "rep": 0, "results": results}
        for system, results in (
            ("pffs", {"epoch2_remount_requests": 9, "lsr_rss_bytes_per_entry": 150.0,
                      "epoch2_remount_requests_by_kind": "GET 0, HEAD 5, LIST 4, OTHER 0"}),
            ("s3fs", {"epoch2_remount_requests": 812, "lsr_rss_bytes_per_entry": -1609.4,
                      "epoch2_remount_requests_by_kind": "GET 0, HEAD 809, LIST 3, OTHER 0"}),
        )
    ]  # fmt: skip
    summary = summarize(runs, [{"name": "s", "systems": ["pffs", "s3fs"]}])
    table = markdown(summary)
    assert "| store requests during it | requests | 9 | 812 | 90.22x |" in table
    assert "| mount RSS growth over it, per entry | bytes | 150 | -1,609 | - |" in table
    assert (
        "Store requests during epoch 2 after a remount (first rep): "
        "pffs GET 0, HEAD 5, LIST 4, OTHER 0; s3fs GET 0, HEAD 809, LIST 3, OTHER 0."
    ) in table

"""The report's arithmetic on the new figures: ratios to the best peer, the request line, and
numbers below zero (an RSS that shrank over a scenario); the charts and the README headline
drawn from a small results file (data/results-small.json), and the command that writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.charts import draw_charts, ratios_to_best
from bench.headline import END, GAPS_END, GAPS_START, START, gaps_list, headline_table
from bench.report import load_summary, markdown, ratio_to_best_peer, summarize
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


DATA = Path(__file__).parent / "data" / "results-small.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPORT = [sys.executable, "-m", "bench.report"]


def test_the_charts_of_a_small_results_file_are_valid_pngs(tmp_path: Path) -> None:
    from PIL import Image

    written = draw_charts(load_summary(str(DATA)), str(tmp_path))
    assert sorted(Path(p).name for p in written) == ["bench-s3rver.png", "bench-summary.png"]
    for path in written:
        assert Path(path).read_bytes()[:8] == PNG_MAGIC
        with Image.open(path) as image:
            image.load()  # decodes every pixel: a truncated file fails here
            width, height = image.size
        assert width > 600 and height > 300


def test_the_ratios_to_the_best_system_invert_times_and_skip_what_has_none() -> None:
    entry = load_summary(str(DATA))["servers"][1]  # s3rver, 20 ms
    assert ratios_to_best(entry, BY_KEY["epoch1_files_per_s"]) == {
        "pffs": 1.0, "s3fs": 40 / 400, "rclone": 42 / 400,
    }  # fmt: skip
    assert ratios_to_best(entry, BY_KEY["ttfb_ms"]) == {
        "pffs": 1.0, "s3fs": 34 / 52, "rclone": 34 / 61,
    }  # fmt: skip
    # rclone's ls -lR is an error: no ratio; the others against the best of those with one.
    assert ratios_to_best(entry, BY_KEY["lsr_100k_s"]) == {
        "pffs": 1.0, "s3fs": 4 / 27, "rclone": None,
    }  # fmt: skip


HEADLINE_20MS = [
    "| first epoch, cold | files/s | 800 (9.52x) | 400 (9.52x) |",
    "| second epoch | files/s | 5,000 (1.72x) | 2,500 (1.72x) |",
    "| second epoch, remounted | files/s | 2,000 (22.73x) | 1,000 (22.73x) |",
    "| large file, cold read | MB/s | 540 (0.90x) | 270 (0.90x) |",
    "| large file, 4 readers | MB/s | 420 (1.43x) | 210 (1.43x) |",
    "| first byte | ms | 34.0 (1.53x) | 34.0 (1.53x) |",
    "| ls -lR of the tree | s | 4.00 (6.75x) | 4.00 (6.75x) |",
    "| stat, TTL passed | stats/s | 2,700 (0.03x) | 1,350 (0.03x) |",
    "| write, verified | MB/s | 68.0 (1.06x) | 34.0 (1.06x) |",
    # The clients scenario's figures: not in this (older) results file.
    "| pyarrow: 2 of 20 Parquet columns | s | - | - |",
    "| pyarrow: Parquet files whole | s | - | - |",
    "| safetensors: 6 tensors (mmap) | s | - | - |",
    "| safetensors: every tensor | s | - | - |",
    "| Arrow by mmap: random batches | s | - | - |",
    "| tar shards through tarfile | s | - | - |",
    "| memory (peak RSS) | MiB | 340 (0.07x) | 340 (0.07x) |",
]


def test_the_headline_of_a_small_results_file() -> None:
    table = headline_table(load_summary(str(DATA)), "docs/bench/bench-summary.png")
    lines = table.splitlines()
    assert lines[0].startswith(
        "Quick run of 2026-11-25 at abc1234, load average 0.4 at its start, 2 CPUs, "
        "1 repetition: `python -m bench --quick` "
        "(32 MiB file, 200 training files of 100 KiB, a tree of 1,000 objects)."
    )
    assert "pffs against the best of rclone and s3fs" in lines[0]
    assert lines[2:6] == [
        "Servers: s3rver is a Node.js test double.",
        "",
        "| scenario | unit | s3rver, 0 ms | s3rver, 20 ms |",
        "|---|---|---|---|",
    ]
    assert lines[6:22] == HEADLINE_20MS
    # The weak points are counted here and listed in BENCHMARKS (gaps_list), every scenario's.
    assert lines[23] == (
        "pffs is behind the best peer in 3 of this run's scenarios: [docs/BENCHMARKS.md, "
        "where pffs is behind in the latest run]"
        "(docs/BENCHMARKS.md#where-pffs-is-behind-in-the-latest-run)."
    )
    assert gaps_list(load_summary(str(DATA))).splitlines() == [
        "- sequential read, cold: 0.90x (s3rver, 0 ms), 0.90x (s3rver, 20 ms)",
        "- stat of every file after ls -l, TTL passed: 0.03x (s3rver, 0 ms), 0.03x (s3rver, 20 ms)",
        "- peak RSS of the whole session (no reset): 0.07x (s3rver, 0 ms), 0.07x (s3rver, 20 ms)",
    ]
    assert "[docs/BENCHMARKS.md](docs/BENCHMARKS.md)" in table
    assert lines[-1] == (
        "![pffs, s3fs and rclone against the best of the three](docs/bench/bench-summary.png)"
    )


def test_the_command_writes_the_charts_and_replaces_only_the_readme_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# pffs\n\nbefore\n{START}\nan old table\n{END}\nafter\n")
    out = tmp_path / "docs" / "bench"
    command = [*REPORT, str(DATA), "--out", str(out), "--readme", str(readme)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["bench-s3rver.png", "bench-summary.png"]
    text = readme.read_text()
    assert text.startswith(f"# pffs\n\nbefore\n{START}\nQuick run of 2026-11-25")
    assert text.endswith(f"(docs/bench/bench-summary.png)\n{END}\nafter\n")
    assert "an old table" not in text
    for row in HEADLINE_20MS:
        assert row in text
    # Run again: the block is replaced, not repeated.
    subprocess.run(command, capture_output=True, check=True)
    assert readme.read_text() == text


def test_bad_input_gets_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    cases = [
        ([str(tmp_path / "missing.json")], "missing.json: No such file or directory"),
        ([str(garbage)], "garbage.json: not JSON"),
        ([str(DATA), "--out", str(tmp_path), "--readme", str(readme)], "no <!-- bench-headline"),
    ]
    for args, message in cases:
        result = subprocess.run([*REPORT, *args], capture_output=True, text=True, check=False)
        assert result.returncode == 1
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert readme.read_text() == "no markers here\n"


def test_the_command_writes_the_gaps_into_benchmarks(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\n{GAPS_START}\nold gaps\n{GAPS_END}\nafter\n")
    command = [*REPORT, str(DATA), "--out", str(tmp_path / "charts"), "--benchmarks", str(doc)]
    for _ in range(2):  # a second run replaces the list
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
    text = doc.read_text()
    assert "old gaps" not in text and text.count("- sequential read, cold: 0.90x") == 1
    assert text.endswith(f"{GAPS_END}\nafter\n")

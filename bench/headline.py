"""The README's headline: a short table of a bench run's main figures, generated, never typed.

`headline_table` makes it from a bench summary (results.json's "summary"): pffs's figure and,
in brackets, pffs against the best of the other systems, for the first and second epochs, large
files, the first byte, metadata, writes and memory, at every server and latency of the run;
then how many figures of the run are behind the best peer. `gaps_list` lists those figures, every
scenario's, for docs/BENCHMARKS.md, so the weak points are a link away from the strong ones and
the README stays a front page. `replace_block` puts each between its page's two marker comments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bench.data import MIB
from bench.scenarios import METRICS
from bench.servers import KINDS

START = "<!-- bench-headline:start -->"
END = "<!-- bench-headline:end -->"
GAPS_START = "<!-- bench-gaps:start -->"
GAPS_END = "<!-- bench-gaps:end -->"
BENCHMARKS = "docs/BENCHMARKS.md"
# The heading over the gaps' markers in BENCHMARKS (its anchor, by GitHub's rules, is linked).
GAPS_HEADING = "Where pffs is behind in the latest run"
GAPS_ANCHOR = "#" + GAPS_HEADING.lower().replace(" ", "-")


@dataclass(frozen=True)
class Row:
    key: str  # a bench.scenarios metric
    short: str  # its name in the headline table and the summary chart


HEADLINE = [
    Row("epoch1_files_per_s", "first epoch, cold"),
    Row("epoch2_files_per_s", "second epoch"),
    Row("epoch2_remount_files_per_s", "second epoch, remounted"),
    Row("seq_cold_mbs", "large file, cold read"),
    Row("parallel_mbs", "large file, 4 readers"),
    Row("ttfb_ms", "first byte"),
    Row("lsr_100k_s", "ls -lR of the tree"),
    Row("stat_expired_per_s", "stat, TTL passed"),
    Row("write_mbs", "write, verified"),
    Row("clients_parquet_columns_s", "pyarrow: 2 of 20 Parquet columns"),
    Row("clients_parquet_scan_s", "pyarrow: Parquet files whole"),
    Row("clients_safetensors_lazy_s", "safetensors: 6 tensors (mmap)"),
    Row("clients_safetensors_full_s", "safetensors: every tensor"),
    Row("clients_arrow_batches_s", "Arrow by mmap: random batches"),
    Row("clients_tar_s", "tar shards through tarfile"),
    Row("session_peak_rss_mib", "memory (peak RSS)"),
]
BY_KEY = {metric.key: metric for metric in METRICS}


class HeadlineError(Exception):
    """A results file or README the headline cannot be made from, with the reason."""


def _figure(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _cell(entry: dict[str, Any], key: str) -> str:
    value = entry["medians"].get("pffs", {}).get(key)
    if not isinstance(value, int | float):
        return "error" if isinstance(value, str) else "-"
    ratio = entry["ratios"].get(key)
    return f"{_figure(value)} ({ratio:.2f}x)" if ratio else _figure(value)


def behind(summary: dict[str, Any]) -> list[str]:
    """Every scenario, at every server and latency, where pffs is behind the best peer."""
    out = []
    for metric in METRICS:
        where = [
            f"{ratio:.2f}x ({entry['name']})"
            for entry in summary["servers"]
            if (ratio := entry["ratios"].get(metric.key)) is not None and ratio < 1
        ]
        if where:
            out.append(f"{metric.label}: {', '.join(where)}")
    return out


def headline_table(summary: dict[str, Any], chart: str | None = None) -> str:
    """The headline in Markdown; `chart`, a path relative to the README, is shown under it."""
    entries = [entry for entry in summary.get("servers", []) if "pffs" in entry.get("systems", [])]
    if not entries:
        raise HeadlineError("the results hold no server where pffs ran")
    peers = sorted({s for entry in entries for s in entry["systems"] if s != "pffs"})
    kind = "Quick run" if "--quick" in summary.get("command", "") else "Full run"
    reps = {run_reps(entry) for entry in entries}
    made = f"{kind} of {summary.get('date', 'an unknown date')}"
    if summary.get("commit"):
        made += f" at {summary['commit']}"
    machine = summary.get("machine", {})
    if "load_average" in machine:  # other work on the machine slows the systems unevenly
        made += f", load average {machine['load_average']:.1f} at its start"
    lines = [
        f"{made}, {machine.get('cpus', '?')} CPUs, "
        f"{'/'.join(str(r) for r in sorted(reps))} "
        f"{'repetition' if reps == {1} else 'repetitions'}: "
        f"`{summary.get('command', 'python -m bench')}`{sizes_text(summary)}. "
        "Each cell is pffs's median and, in "
        f"brackets, pffs against the best of {' and '.join(peers) or 'no peer'} "
        "(above 1x: pffs ahead; below: behind).",
        "",
        *servers_text(entries),
        "| scenario | unit | " + " | ".join(entry["name"] for entry in entries) + " |",
        "|---|---|" + "---|" * len(entries),
    ]
    for row in HEADLINE:
        metric = BY_KEY[row.key]
        cells = [_cell(entry, row.key) for entry in entries]
        lines.append(f"| {row.short} | {metric.unit} | " + " | ".join(cells) + " |")
    weak = behind(summary)
    if weak:
        lines += [
            "",
            f"pffs is behind the best peer in {len(weak)} of this run's scenarios: "
            f"[{BENCHMARKS}, {GAPS_HEADING.lower()}]({BENCHMARKS}{GAPS_ANCHOR}).",
        ]
    else:
        lines += ["", "pffs is behind the best peer nowhere in this run."]
    lines.append("")
    lines.append(
        f"Every scenario, what it measures and the known gaps: [{BENCHMARKS}]({BENCHMARKS})."
    )
    if chart:
        lines += ["", f"![pffs, s3fs and rclone against the best of the three]({chart})"]
    return "\n".join(lines)


def servers_text(entries: list[dict[str, Any]]) -> list[str]:
    """One line saying what the server of each column is, and a blank line; none if unknown."""
    names = list(dict.fromkeys(entry["name"].split(",")[0] for entry in entries))
    known = [f"{name} is {KINDS[name]}" for name in names if name in KINDS]
    return [f"Servers: {'; '.join(known)}.", ""] if known else []


def sizes_text(summary: dict[str, Any]) -> str:
    """ " (a 32 MiB file, 200 training files of 100 KiB, a tree of 1,000 objects)", or ""."""
    sizes = summary.get("sizes")
    if not isinstance(sizes, dict):
        return ""
    try:
        return (
            f" ({sizes['large'] / MIB:,.0f} MiB file, {sizes['epoch_files']:,} training files "
            f"of {sizes['epoch_size'] / 1024:,.0f} KiB, a tree of {sizes['tree_files']:,} objects)"
        )
    except (KeyError, TypeError):
        return ""


def run_reps(entry: dict[str, Any]) -> int:
    """Repetitions a server entry's medians are of (one ceiling measure per repetition)."""
    return len(entry.get("ceiling_runs", [])) or 1


def gaps_list(summary: dict[str, Any]) -> str:
    """Every figure of the run where pffs is behind the best peer, as a Markdown list."""
    weak = behind(summary)
    if not weak:
        return "pffs is behind the best peer nowhere in this run."
    return "\n".join(f"- {line}" for line in weak)


def replace_block(text: str, block: str, start_mark: str = START, end_mark: str = END) -> str:
    """`text` with what lies between the two markers replaced by `block`."""
    start, end = text.find(start_mark), text.find(end_mark)
    if start < 0 or end < 0 or end < start:
        raise HeadlineError(f"no {start_mark} ... {end_mark} markers, in that order")
    return text[: start + len(start_mark)] + "\n" + block.strip() + "\n" + text[end:]


def update_gaps(benchmarks: str, summary: dict[str, Any]) -> None:
    """Write the run's gaps into `benchmarks` (docs/BENCHMARKS.md) between their markers."""
    try:
        with open(benchmarks, encoding="utf-8") as f:
            text = f.read()
        updated = replace_block(text, gaps_list(summary), GAPS_START, GAPS_END)
    except OSError as exc:
        raise HeadlineError(f"{benchmarks}: {exc.strerror}") from None
    except HeadlineError as exc:
        raise HeadlineError(f"{benchmarks}: {exc}") from None
    with open(benchmarks, "w", encoding="utf-8") as f:
        f.write(updated)


def update_readme(readme: str, summary: dict[str, Any], chart_path: str | None) -> None:
    """Write the headline into `readme` between its markers; `chart_path` as a file path."""
    try:
        with open(readme, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise HeadlineError(f"{readme}: {exc.strerror}") from None
    chart = None
    if chart_path:
        chart = os.path.relpath(chart_path, os.path.dirname(os.path.abspath(readme)))
    try:
        updated = replace_block(text, headline_table(summary, chart))
    except HeadlineError as exc:
        raise HeadlineError(f"{readme}: {exc}") from None
    with open(readme, "w", encoding="utf-8") as f:
        f.write(updated)

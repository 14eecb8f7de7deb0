"""Results: medians, ratios to the best peer, a Markdown table and JSON; the command that
redraws a run's charts and the README's headline from its JSON.

`python -m bench.report results/<time>/results.json --out docs/bench --readme README.md`
writes the charts (bench.charts) into --out and the headline table (bench.headline) into the
README between its marker comments; `--benchmarks docs/BENCHMARKS.md` writes the cache group
scenario's tables (bench.groupreport) into that file between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from bench.charts import draw_charts
from bench.clientfloor import floor_table
from bench.groupreport import group_tables, write_section
from bench.headline import HeadlineError, update_gaps, update_readme
from bench.scenarios import METRICS, Metric

Runs = list[dict[str, Any]]  # one dict per (server, system, repetition)


def medians(runs: Runs, server: str, system: str) -> dict[str, float | str]:
    """Median of each metric over the repetitions; the first error when none produced a number."""
    out: dict[str, float | str] = {}
    mine = [r["results"] for r in runs if r["server"] == server and r["system"] == system]
    for metric in METRICS:
        values = [r[metric.key] for r in mine if isinstance(r.get(metric.key), int | float)]
        errors = [r[metric.key] for r in mine if isinstance(r.get(metric.key), str)]
        if values:
            out[metric.key] = statistics.median(values)
        elif errors:
            out[metric.key] = errors[0]
    return out


def ratio_to_best_peer(metric: Metric, pffs: float, peers: list[float]) -> float | None:
    """How many times better pffs is than the best peer (>1 better, <1 worse)."""
    if not peers:
        return None
    best = max(peers) if metric.higher_is_better else min(peers)
    # A ratio of a figure at or below 0 (an RSS that shrank over a scenario) means nothing.
    if best <= 0 or pffs <= 0:
        return None
    return pffs / best if metric.higher_is_better else best / pffs


def _fmt(value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value if len(value) < 40 else value[:37] + "..."
    if isinstance(value, int):  # counts (requests)
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = []
    for server in summary["servers"]:
        name = server["name"]
        systems = server["systems"]
        lines.append(f"### {name}\n")
        ceilings = server.get("ceilings", {})
        lines.append(
            f"Ceilings: server {_fmt(ceilings.get('server_mbs'))} MB/s (8 parallel ranged GETs, "
            f"curl), store {_fmt(ceilings.get('store_files_per_s'))} files/s (the training "
            f"files, 64 parallel GETs, http.client), local disk "
            f"{_fmt(ceilings.get('local_disk_mbs'))} MB/s.\n"
        )
        header = ["scenario", "unit", *systems, "pffs / best peer"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for metric in METRICS:
            row = [metric.label, metric.unit]
            row += [_fmt(server["medians"].get(system, {}).get(metric.key)) for system in systems]
            ratio = server["ratios"].get(metric.key)
            row.append(f"{ratio:.2f}x" if ratio else "-")
            lines.append("| " + " | ".join(row) + " |")
        floors = floor_table(server)
        if floors:
            lines.append("\n" + floors)
        kinds = server.get("remount_requests", {})
        if kinds:
            listed = "; ".join(f"{system} {text}" for system, text in kinds.items())
            lines.append(f"\nStore requests during epoch 2 after a remount (first rep): {listed}.")
        against_store = epoch_against_store(server)
        if against_store:
            shares = ", ".join(f"{system} {share:.0%}" for system, share in against_store.items())
            lines.append(f"\nEpoch 1 against the store's own files/s: {shares}.")
        for system, reason in server.get("unavailable", {}).items():
            lines.append(f"\n{system}: not run ({reason})")
        lines.append("")
    if summary.get("groups"):
        lines.append(group_tables(summary["groups"]))
    return "\n".join(lines)


def epoch_against_store(server: dict[str, Any]) -> dict[str, float]:
    """Each system's epoch-1 files/s as a fraction of the store's own (the ceiling)."""
    store = server.get("ceilings", {}).get("store_files_per_s")
    if not isinstance(store, int | float) or store <= 0:
        return {}
    out = {}
    for system in server["systems"]:
        epoch1 = server["medians"].get(system, {}).get("epoch1_files_per_s")
        if isinstance(epoch1, int | float):
            out[system] = epoch1 / store
    return out


def summarize(runs: Runs, servers: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for server in servers:
        name = server["name"]
        systems = server["systems"]
        med = {system: medians(runs, name, system) for system in systems}
        ratios: dict[str, float | None] = {}
        if "pffs" in med:
            for metric in METRICS:
                mine = med["pffs"].get(metric.key)
                peers = [
                    v
                    for s, m in med.items()
                    if s != "pffs" and isinstance(v := m.get(metric.key), int | float)
                ]
                if isinstance(mine, int | float):
                    ratios[metric.key] = ratio_to_best_peer(metric, float(mine), peers)
        ceilings = [r for r in server.get("ceiling_runs", [])]
        ceiling_medians = {
            key: statistics.median([c[key] for c in ceilings])
            for key in (ceilings[0] if ceilings else {})
        }
        out.append({
            **server, "medians": med, "ratios": ratios, "ceilings": ceiling_medians,
            "remount_requests": remount_requests(runs, name, systems),
        })  # fmt: skip
    return {"servers": out}


def remount_requests(runs: Runs, server: str, systems: list[str]) -> dict[str, str]:
    """Each system's store requests by kind during its first remounted epoch."""
    out = {}
    for system in systems:
        for run in runs:
            text = run["results"].get("epoch2_remount_requests_by_kind")
            if run["server"] == server and run["system"] == system and isinstance(text, str):
                out[system] = text
                break
    return out


def write_json(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)


def load_summary(path: str) -> dict[str, Any]:
    """The "summary" of a bench results.json."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except OSError as exc:
        raise HeadlineError(f"{path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise HeadlineError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    summary = payload.get("summary") if isinstance(payload, dict) else None
    if not isinstance(summary, dict) or not isinstance(summary.get("servers"), list):
        raise HeadlineError(f"{path}: not a bench results file (no summary.servers)")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="Draw a bench run's charts and write the README's headline from its JSON.",
    )
    p.add_argument("results", help="a results.json written by python -m bench")
    p.add_argument("--out", help="directory of the charts (the results file's own)")
    p.add_argument("--readme", help="README to write the headline into, between its markers")
    p.add_argument(
        "--benchmarks",
        help="docs/BENCHMARKS.md: write the run's gaps (where pffs is behind) and its cache "
        "group tables into it, each between its markers",
    )
    args = p.parse_args(argv)
    charts: list[str] = []
    try:
        summary = load_summary(args.results)
        if args.benchmarks:
            if not summary.get("groups") and not summary["servers"]:
                raise HeadlineError(f"{args.results}: no figures for {args.benchmarks}")
            if summary["servers"]:
                update_gaps(args.benchmarks, summary)
            if summary.get("groups"):
                machine = summary.get("machine", {})
                taken = f"  # {summary.get('commit')}, {summary.get('date')}, "
                taken += f"load average {machine.get('load_average')} at its start"
                command = summary.get("command", "") + taken
                write_section(args.benchmarks, summary["groups"], command)
        if summary["servers"] or not args.benchmarks:
            out = args.out or os.path.dirname(os.path.abspath(args.results))
            charts = draw_charts(summary, out)
            if not charts:
                raise HeadlineError("no charts drawn (matplotlib missing, or no server in the run)")
        if args.readme:
            if not charts:
                raise HeadlineError(f"{args.results}: no server's figures for the headline")
            update_readme(args.readme, summary, charts[-1])  # the summary chart is the last
    except (HeadlineError, ValueError, OSError) as exc:
        print(f"bench.report: {exc}", file=sys.stderr)
        return 1
    for path in charts:
        print(path)
    if args.readme:
        print(f"{args.readme}: headline updated")
    if args.benchmarks:
        print(f"{args.benchmarks}: updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())

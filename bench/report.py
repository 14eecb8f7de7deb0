"""Results: medians, ratios to the best peer, a Markdown table, JSON and PNG charts."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

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


def _number(server: dict[str, Any], system: str, metric: Metric) -> float | None:
    value = server["medians"].get(system, {}).get(metric.key)
    return float(value) if isinstance(value, int | float) else None


def charts(summary: dict[str, Any], directory: str) -> list[str]:
    """One PNG per server: each scenario's median, relative to the best system (1.0 = best)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for server in summary["servers"]:
        systems = server["systems"]
        metrics = [m for m in METRICS if any(_number(server, s, m) is not None for s in systems)]
        if not metrics:
            continue
        fig, ax = plt.subplots(figsize=(11, 5))
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            scores = []
            for metric in metrics:
                values = [v for s in systems if (v := _number(server, s, metric)) is not None]
                mine = _number(server, system, metric)
                best = max(values) if metric.higher_is_better else min(values)
                if mine is None or mine == 0 or best == 0:
                    scores.append(0.0)
                else:
                    scores.append(mine / best if metric.higher_is_better else best / mine)
            ax.bar([x + i * width for x in range(len(metrics))], scores, width, label=system)
        ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(metrics))])
        ax.set_xticklabels([m.label for m in metrics], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("relative to the best system (1.0 = best)")
        ax.set_title(f"pffs bench on {server['name']}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        slug = "".join(c if c.isalnum() else "-" for c in server["name"]).strip("-")
        path = os.path.join(directory, f"bench-{slug}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_json(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)

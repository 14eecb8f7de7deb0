"""The charts of a bench summary: each system's figures as ratios to the best system.

For every scenario the best system's median is 1.0 and the others are what fraction of it they
reach (a time or a memory figure is inverted, so higher is better throughout). One PNG per
server, `bench-<server>.png`, with a panel per latency and every scenario measured; and
`bench-summary.png`, the headline scenarios (bench.headline) of every server and latency, the
one the README shows. matplotlib draws them (the `bench` extra); without it there are none.
"""

from __future__ import annotations

import os
from typing import Any

from bench.headline import HEADLINE
from bench.scenarios import METRICS, Metric

BY_KEY = {metric.key: metric for metric in METRICS}
# One colour per system in every chart.
COLOURS = {"pffs": "#1f77b4", "s3fs": "#ff7f0e", "rclone": "#2ca02c"}
OTHER_COLOUR = "#7f7f7f"


def number(entry: dict[str, Any], system: str, metric: Metric) -> float | None:
    """A system's median of a metric in one server entry, when it is a number."""
    value = entry["medians"].get(system, {}).get(metric.key)
    return float(value) if isinstance(value, int | float) else None


def ratios_to_best(entry: dict[str, Any], metric: Metric) -> dict[str, float | None]:
    """Each system's figure against the best system's (1.0 = best, higher is better); None
    for a system without a figure, or where a ratio means nothing (a figure at or below 0)."""
    values = {system: number(entry, system, metric) for system in entry["systems"]}
    known = [v for v in values.values() if v is not None and v > 0]
    if not known:
        return dict.fromkeys(values)
    best = max(known) if metric.higher_is_better else min(known)
    out: dict[str, float | None] = {}
    for system, value in values.items():
        if value is None or value <= 0:
            out[system] = None
        else:
            out[system] = value / best if metric.higher_is_better else best / value
    return out


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def _panel(ax: Any, entry: dict[str, Any], metrics: list[Metric], labels: list[str]) -> None:
    """Grouped bars: one group per metric, one bar per system; "n/a" where one has none."""
    systems = entry["systems"]
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs = [x + i * width for x in range(len(metrics))]
        scores = [ratios_to_best(entry, metric)[system] for metric in metrics]
        colour = COLOURS.get(system, OTHER_COLOUR)
        ax.bar(xs, [s or 0.0 for s in scores], width, label=system, color=colour)
        for x, score in zip(xs, scores, strict=True):
            if score is None:
                ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(metrics))])
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_ylabel("to the best (1.0 = best)", fontsize=8)
    ax.set_title(entry["name"], fontsize=10)


def _save(fig: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def draw_charts(summary: dict[str, Any], directory: str) -> list[str]:
    """Write the per-server charts and the summary chart into `directory`; their paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    entries = summary["servers"]
    if not entries:
        return []
    os.makedirs(directory, exist_ok=True)
    written = []
    by_server: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_server.setdefault(entry["name"].split(",")[0], []).append(entry)
    for server, panels in by_server.items():
        fig, axes = plt.subplots(len(panels), 1, figsize=(15, 5 * len(panels)), squeeze=False)
        for ax, entry in zip(axes[:, 0], panels, strict=True):
            shown = [
                m for m in METRICS if any(number(entry, s, m) is not None for s in entry["systems"])
            ]
            _panel(ax, entry, shown, [m.label for m in shown])
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(f"pffs bench on {server}: each scenario against the best system")
        written.append(_save(fig, os.path.join(directory, f"bench-{slug(server)}.png")))
        plt.close(fig)
    headline = [BY_KEY[row.key] for row in HEADLINE]
    columns = min(2, len(entries))
    rows = -(-len(entries) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.5 * rows), squeeze=False)
    for ax, entry in zip(axes.flat, entries, strict=False):
        _panel(ax, entry, headline, [row.short for row in HEADLINE])
    for ax in list(axes.flat)[len(entries) :]:
        ax.set_visible(False)
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("pffs, s3fs and rclone against the best of the three (1.0 = best)")
    written.append(_save(fig, os.path.join(directory, "bench-summary.png")))
    plt.close(fig)
    return written

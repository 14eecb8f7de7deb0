"""The cache group scenario (bench.group) end to end at tiny sizes over moto's server: four real
mounts on 127.0.0.2-5 in a group, alone, and with one member SIGKILLed; its tables
(bench.groupreport) in results.md and in docs/BENCHMARKS.md between markers; `--only group`.

Nothing here is timed: the scenario's speeds are the bench's to measure. What is checked is
what must hold however fast the machine is: exact bytes and no reader error on the members that
live, each file fetched by each mount with the group off, fewer store GETs with it on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import group
from bench.cli import parse_args, runs_group, runs_systems
from bench.group import median_run, run_plan
from bench.groupreport import BEGIN, END, group_tables, write_section
from bench.servers import Launcher, Server
from bench.systems import Pffs

pytestmark = [pytest.mark.mount, pytest.mark.slow]
# One pair of `group` and `alone`: how pairs alternate and a median is taken is checked below
# without mounts (each run starts four mounts).
TINY = group.GroupSizes(files=12, size=64 * 1024, big=2, rounds=1, shared=True, pairs=1)


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("group-bench")
    launcher = Launcher(str(work))
    near = launcher.moto()
    try:
        return group.scenario(near, TINY, str(work))
    finally:
        near.stop()


def test_the_group_fetches_less_and_every_reader_gets_exact_bytes(figures: dict[str, Any]) -> None:
    grouped, alone = figures["group"], figures["alone"]
    assert isinstance(grouped, dict) and isinstance(alone, dict), figures
    for run in (grouped, alone):
        assert run["reader_errors"] == 0 and run["wrong_bytes"] == 0, run
        assert sorted(run["files_per_s"]) == ["node0", "node1", "node2", "node3"]
    assert alone["store_gets_x"] >= 4.0 and alone["peer_bytes_x"] == 0  # each mount, each file
    assert alone["store_bytes_x"] >= 4.0
    # Each block from the store about once (a busy owner may let an asker fetch one itself).
    assert grouped["store_gets_x"] < 2.0 < alone["store_gets_x"], (grouped, alone)
    assert grouped["peer_bytes_x"] > 0
    for run in (grouped, alone):  # the median of the pairs' runs, every run's wall time kept
        assert run["runs_seconds"] == [run["seconds"]] * TINY.pairs
    assert grouped["max_store_bytes_x"] >= grouped["store_bytes_x"]
    shared = figures["shared"]  # the tier: no reader error either, and bytes read from it
    assert isinstance(shared, dict) and shared["reader_errors"] == shared["wrong_bytes"] == 0
    latency = figures["latency"]
    assert isinstance(latency, dict) and latency["samples"] == TINY.big * TINY.rounds


def test_a_member_killed_mid_epoch_costs_its_peers_no_error(figures: dict[str, Any]) -> None:
    kill = figures["kill"]
    assert isinstance(kill, dict), kill
    assert kill["killed"] == group.VICTIM and kill["killed_after_files"] is not None
    assert group.VICTIM not in kill["files_per_s"] and len(kill["files_per_s"]) == 3
    assert kill["reader_errors"] == 0 and kill["wrong_bytes"] == 0, kill["first_errors"]
    assert kill["bound_x"] == 1.25


def test_the_tables_and_the_benchmarks_section(figures: dict[str, Any], tmp_path: Path) -> None:
    table = group_tables([figures])
    assert "#### moto: a cache group of 4 mounts, the store 20 ms away" in table
    assert "| group off |" in table and "one member SIGKILLed" in table
    assert "Targets (issue 37):" in table and "peer hit's p50" in table
    assert "with the group off (no later)" in table  # one run each: no median, no spread
    # The same figures as medians of two runs each (the second run a second slower).
    twice = {
        **figures,
        **{
            name: median_run(
                [figures[name], {**figures[name], "seconds": figures[name]["seconds"] + 1}]
            )
            for name in ("group", "alone")
        },
    }
    assert "with the group off (medians of 2 runs), each run " in group_tables([twice])
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\nBefore.\n\n{BEGIN}\nold\n{END}\n\nAfter.\n")
    results = tmp_path / "results.json"
    summary = {"servers": [], "groups": [figures], "command": "python -m bench --only group"}
    results.write_text(json.dumps({"summary": summary, "runs": []}))
    command = [sys.executable, "-m", "bench.report", str(results), "--benchmarks", str(doc)]
    for _ in range(2):  # a second run replaces the section
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nBefore.\n\n") and text.endswith("\n\nAfter.\n")
    assert text.count("| group off |") == 1 and "old" not in text
    assert "python -m bench --only group" in text
    unmarked = tmp_path / "plain.md"
    unmarked.write_text("# nothing\n")
    with pytest.raises(ValueError, match="markers"):
        write_section(str(unmarked), [figures], "")
    bad = subprocess.run(
        [*command[:-1], str(unmarked)], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr


def test_pairs_alternate_and_each_figure_is_the_run_of_median_time() -> None:
    near = Server("nowhere", "http://127.0.0.1:9", "key", "secret")  # never asked: a plan only
    sizes = group.GroupSizes(files=1, size=1, big=1, rounds=2, shared=True, pairs=3)
    plan = run_plan(sizes, near)
    assert [name for name, _ in plan] == [
        *("group", "alone", "alone", "group", "group", "alone"),
        "kill",
        "shared",
    ]
    rounds = [options.get("latency_rounds", 0) for _, options in plan]
    assert rounds == [2, 0, 0, 0, 0, 0, 0, 0]  # the latencies on the first group run only
    assert plan[-1][1] == {"grouped": False, "shared": near}
    assert [name for name, _ in run_plan(TINY, near)] == ["group", "alone", "kill", "shared"]
    runs = [
        {"seconds": 3.0, "store_bytes_x": 1.1},
        {"seconds": 1.0, "store_bytes_x": 1.4},
        {"seconds": 2.0, "store_bytes_x": 1.2},
    ]
    median = median_run(runs)
    assert median["seconds"] == 2.0 and median["store_bytes_x"] == 1.2
    assert median["runs_seconds"] == [3.0, 1.0, 2.0] and median["max_store_bytes_x"] == 1.4
    assert "runs_seconds" not in runs[2]  # the runs themselves are left as they were


def test_only_group_runs_the_group_alone() -> None:
    args = parse_args(["--only", "group", "--servers", "s3rver"])
    assert not runs_systems(args) and runs_group(args, [Pffs([])])
    assert not runs_group(args, [])  # pffs not among the systems
    both = parse_args(["--only", "group,write_mbs"])
    assert runs_systems(both) and runs_group(both, [Pffs([])])
    full = parse_args([])
    assert runs_systems(full) and runs_group(full, [Pffs([])])
    assert not runs_group(parse_args(["--only", "write_mbs"]), [Pffs([])])

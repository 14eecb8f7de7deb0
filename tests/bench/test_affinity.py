"""The data-affinity simulation (bench/affinity.py): the cache model, and a small run end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.affinity import GIB, Node, Params, simulate, workload


def test_node_cache_is_lru_by_dataset() -> None:
    node = Node("n", capacity=100 * GIB, slots=1)
    assert node.read(1, 60 * GIB) == 0
    assert node.read(1, 60 * GIB) == 60 * GIB  # the whole dataset again from disk
    assert node.read(2, 30 * GIB) == 0
    assert node.read(3, 30 * GIB) == 0  # 120 GiB wanted: the oldest (1) loses 20 GiB
    assert dict(node.held) == {1: 40 * GIB, 2: 30 * GIB, 3: 30 * GIB}
    assert node.read(1, 60 * GIB) == 40 * GIB  # part of it was still there
    assert node.read(4, 500 * GIB) == 0  # larger than the cache: a scan LRU cannot keep
    assert node.read(4, 500 * GIB) == 0
    assert dict(node.held) == {4: 100 * GIB}


def test_the_extender_raises_the_hit_ratio() -> None:
    params = Params(nodes=4, slots=2, datasets=8, jobs=300, capacity=300 * GIB, seed=7)
    sizes, jobs = workload(params)
    default, prefer = (simulate(policy, params, sizes, jobs) for policy in ("default", "prefer"))
    measured = len(jobs) - int(params.warmup * len(jobs))
    assert len(default.startup) == len(prefer.startup) == measured
    read = sum(sizes[j.dataset] for j in jobs[int(params.warmup * len(jobs)) :])
    assert default.hit_bytes + default.store_bytes == read == prefer.hit_bytes + prefer.store_bytes
    assert prefer.hit_ratio > default.hit_ratio
    assert prefer.store_bytes < default.store_bytes


def test_command_writes_table_chart_and_section(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nEarlier results.\n")
    chart = tmp_path / "bench" / "affinity.png"
    command = [
        sys.executable, "-m", "bench.affinity", "--nodes", "3", "--datasets", "5",
        "--jobs", "120", "--capacity", "200G", "--sweep", "0.5,1", "--seed", "3",
        "--markdown", str(doc), "--chart", str(chart),
    ]  # fmt: skip
    for _ in range(2):  # a second run replaces its section
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
    assert "| prefer |" in result.stdout and "| 200 GiB |" in result.stdout
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nEarlier results.\n")
    assert text.count("## Data-affinity scheduling (simulation)") == 1
    assert "![affinity](bench/affinity.png)" in text
    assert chart.read_bytes().startswith(b"\x89PNG")
    bad = subprocess.run(
        [sys.executable, "-m", "bench.affinity", "--nodes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "at least 1" in bad.stderr

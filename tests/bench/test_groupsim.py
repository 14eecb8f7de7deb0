"""The cache group simulation (bench/groupsim.py) at small sizes: it runs, and what must hold
whatever the seed does: without churn each block comes from the store exactly once; a change
of membership moves about 1/N of the blocks; members that do not hold the job's volume cost
store reads; the command's table, its section in a file, and its bad input. Nothing is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.groupsim import BEGIN, END, TIB, Params, Simulation, summarize

SMALL = Params(cluster=16, job=8, dataset=TIB, epochs=4, node_mbs=100, sample=800, seed=3)


def test_without_churn_each_block_comes_from_the_store_once() -> None:
    params = Params(**{**SMALL.__dict__, "churn_s": 1e9})
    out = Simulation(params, "job").run()
    assert out.changes == []
    assert out.store == params.sample  # each sampled block exactly once, however many read it
    assert out.reads == params.epochs * params.sample
    figures = summarize(params, out)
    assert figures["store_x"] == pytest.approx(1.0, abs=0.01)
    assert 1 / params.job <= float(figures["busiest_share"]) < 3 / params.job
    assert len(out.served) == params.job  # every member serves, none outside the job


def test_churn_moves_about_one_nth_of_the_blocks() -> None:
    # A loss each epoch, handed over for as long (a handover the length of an epoch).
    params = Params(**{**SMALL.__dict__, "churn_s": SMALL.epoch_s, "handover_s": SMALL.epoch_s})
    out = Simulation(params, "job").run()
    losses = params.epochs - 1
    assert [c.kind for c in out.changes] == ["lost", "joined"] * losses
    for change in out.changes:
        assert params.sample / params.job / 3 < change.reassigned < 3 * params.sample / params.job
        assert change.handed_over + change.refetched <= change.reassigned
    joins = [c for c in out.changes if c.kind == "joined"]
    # Over an epoch's handover: most of a join's blocks come from peers.
    assert sum(c.handed_over for c in joins) > sum(c.refetched for c in joins)
    assert params.sample < out.store < params.sample * (1 + len(out.changes) * 3 / params.job)


def test_a_handover_lasts_its_time() -> None:
    """A handover far shorter than an epoch hands over a few of a join's blocks; none at 0."""
    churn = {"churn_s": SMALL.epoch_s}
    long = Simulation(Params(**{**SMALL.__dict__, **churn, "handover_s": SMALL.epoch_s}), "job")
    short = Simulation(
        Params(**{**SMALL.__dict__, **churn, "handover_s": SMALL.epoch_s / 10}), "job"
    )
    none = Simulation(Params(**{**SMALL.__dict__, **churn, "handover_s": 0.0}), "job")
    handed = [sum(c.handed_over for c in sim.run().changes) for sim in (long, short, none)]
    assert handed[0] > 3 * handed[1] > 0 and handed[2] == 0, handed


def test_members_without_the_volume_are_stood_in_for() -> None:
    params = Params(**{**SMALL.__dict__, "churn_s": 1e9})
    cluster = Simulation(params, "cluster").run()
    assert cluster.store == params.sample  # each block once: its stand-in fetched it
    cluster = Simulation(SMALL, "cluster").run()
    # Only nodes that mount the volume serve.
    assert len(cluster.served) <= SMALL.job + len(cluster.changes)


def test_the_command_writes_its_table_and_refuses_bad_input(tmp_path: Path) -> None:
    doc = tmp_path / "note.md"
    doc.write_text(f"# Note\n\n{BEGIN}\nold\n{END}\n\nAfter.\n")
    command = [
        sys.executable, "-m", "bench.groupsim", "--cluster", "12", "--job", "6",
        "--dataset", "512G", "--epochs", "3", "--sample", "300", "--markdown", str(doc),
    ]  # fmt: skip
    for _ in range(2):  # a second run replaces its section
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    assert "| job |" in done.stdout and "| cluster |" in done.stdout
    text = doc.read_text()
    assert text.count("| job |") == 1 and "old" not in text and text.endswith("\n\nAfter.\n")
    for bad in (["--job", "0"], ["--dataset", "lots"], ["--churn-s", "60", "--cluster", "64"]):
        done = subprocess.run(
            [sys.executable, "-m", "bench.groupsim", *bad],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, (bad, done.stderr)

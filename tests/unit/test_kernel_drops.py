"""tests/kernel_drops.py's `unless_dropped`, against a vmstat file the test writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_drops import kernel_drops, unless_dropped


def write_vmstat(path: Path, pagecache: int, slab: int) -> None:
    path.write_text(f"nr_free_pages 1\ndrop_pagecache {pagecache}\ndrop_slab {slab}\n")


def test_the_counters_are_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    write_vmstat(vmstat, 7, 9)
    assert kernel_drops(str(vmstat)) == (7, 9)


def test_a_failure_with_no_drop_during_it_fails_at_once(tmp_path: Path) -> None:
    vmstat, runs = tmp_path / "vmstat", []
    write_vmstat(vmstat, 1, 1)

    def step() -> None:
        runs.append(1)
        raise AssertionError("the page was not cached")

    with pytest.raises(AssertionError, match="not cached"):
        unless_dropped(step, vmstat=str(vmstat))
    assert len(runs) == 1


@pytest.mark.parametrize("dropped", ["pagecache", "slab"])
def test_a_failure_during_a_drop_runs_the_step_again(tmp_path: Path, dropped: str) -> None:
    vmstat, runs = tmp_path / "vmstat", []
    write_vmstat(vmstat, 1, 1)

    def step() -> str:
        runs.append(1)
        if len(runs) == 1:  # someone drops the caches while the first run looks
            write_vmstat(vmstat, 2 if dropped == "pagecache" else 1, 2 if dropped == "slab" else 1)
            raise AssertionError("the page was not cached")
        return "held"

    assert unless_dropped(step, vmstat=str(vmstat)) == "held"
    assert len(runs) == 2


def test_drops_during_every_attempt_end_with_the_last_failure(tmp_path: Path) -> None:
    vmstat, runs = tmp_path / "vmstat", []
    write_vmstat(vmstat, 0, 0)

    def step() -> None:
        runs.append(1)
        write_vmstat(vmstat, len(runs), 0)
        raise AssertionError(f"attempt {len(runs)}")

    with pytest.raises(AssertionError, match="attempt 3"):
        unless_dropped(step, attempts=3, vmstat=str(vmstat))
    assert len(runs) == 3

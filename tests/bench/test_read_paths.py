"""docs/ARCHITECTURE.md's three trace tables against the code: each table has one row per module
its trace crosses, as bench/probes/read_paths.py finds them running the trace (on a moto server,
no kernel), its "Crossed: N" says how many, and no trace crosses more than 15 (issue #51)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOST_CROSSED = 15
# The probe's trace names, and the headings of their tables.
TRACES = {"cold": "### A cold read", "peer": "### A peer's block", "preload": "### A preload"}


@pytest.fixture(scope="module")
def crossed() -> dict[str, set[str]]:
    """Each trace's crossed modules, as the probe prints them ("fs.vfs", "backends.s3")."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.probes.read_paths"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, set[str]] = {}
    trace = None
    for line in result.stdout.splitlines():
        heading = re.match(r"(\w+): \d+ modules crossed", line)
        if heading:
            trace = heading.group(1)
        elif line.startswith("  crossed:") and trace is not None:
            found[trace] = set(line.removeprefix("  crossed:").split())
    assert set(found) == set(TRACES), result.stdout
    return found


def _table(heading: str) -> tuple[list[set[str]], int]:
    """The modules each row of a trace's table links in its first column, and its count line."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = page[page.index(heading) :]
    section = section[: section.index("\n#", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ["):
            first = line.split(" | ")[0]
            paths = re.findall(r"\]\(\.\./(?:pffs/)?([\w/]+)\.py\)", first)
            rows.append({path.replace("/", ".") for path in paths})
    count = re.search(r"^Crossed: (\d+)", section, flags=re.MULTILINE)
    assert count is not None, f"{heading}: no 'Crossed: N' line"
    return rows, int(count.group(1))


@pytest.mark.parametrize("trace", TRACES)
def test_a_trace_crosses_at_most_15_modules(crossed: dict[str, set[str]], trace: str) -> None:
    assert len(crossed[trace]) <= MOST_CROSSED, sorted(crossed[trace])


@pytest.mark.parametrize("trace", TRACES)
def test_the_table_has_one_row_per_crossed_module(crossed: dict[str, set[str]], trace: str) -> None:
    rows, count = _table(TRACES[trace])
    assert all(len(row) == 1 for row in rows), [sorted(row) for row in rows if len(row) != 1]
    listed = [next(iter(row)) for row in rows]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == crossed[trace]
    assert count == len(crossed[trace])

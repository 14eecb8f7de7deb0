"""The probes in bench/probes still start, and bench/probes/README.md lists each of them.

A probe runs only when someone asks its question again, long after the code it measures has
moved on; this catches the import or option that broke meanwhile (without measuring anything).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROBES_DIR = Path(__file__).resolve().parents[2] / "bench" / "probes"
PROBES = sorted(p.stem for p in PROBES_DIR.glob("*.py") if not p.stem.startswith("_"))


def test_the_readme_lists_every_probe_and_no_other() -> None:
    readme = (PROBES_DIR / "README.md").read_text(encoding="utf-8")
    listed = sorted(re.findall(r"^- `(\w+)`:", readme, flags=re.MULTILINE))
    assert listed == PROBES


@pytest.mark.parametrize("probe", PROBES)
def test_probe_starts_and_explains_its_options(probe: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", f"bench.probes.{probe}", "--help"],
        cwd=PROBES_DIR.parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")

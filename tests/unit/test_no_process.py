"""tests/unit/conftest.py's rule holds: a process started here fails the test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_a_process_started_in_tests_unit_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="tests/unit starts no process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(AssertionError, match="tests/unit starts no process"):
        os.fork()

"""tests/unit starts no process (and so no mount, no server, no tool): a test that calls
subprocess, os.fork or os.posix_spawn here fails at once, saying where the test belongs.
Whatever starts `pffs`, a daemon, helm or pip lives beside tests/mount, tests/deploy or
tests/commands, so that tests/unit stays a minute's run on any machine."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import NoReturn

import pytest


def _no_process(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError(
        "tests/unit starts no process: move this test out of tests/unit (tests/commands for "
        "the pffs command, tests/mount for mounts and daemons, tests/deploy for helm and pip)"
    )


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _no_process)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _no_process)
    yield

"""Fixtures of the real-mount tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.servers import MotoServer


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[MotoServer]:
    """A moto server of this test's own, whose access log counts the requests it served."""
    with MotoServer(access_log=str(tmp_path / "moto-access.log")) as server:
        yield server


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: the cache (and staging) directory of a mount, easy to fill."""
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(disk)], check=True
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)

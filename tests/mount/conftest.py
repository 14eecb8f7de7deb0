"""Fixtures of the real-mount tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.servers import MotoServer


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto server of this module's own, whose access log counts the requests it served:
    each test of a module counts the paths of bucket names no other test there uses."""
    log = tmp_path_factory.mktemp("moto-access") / "moto-access.log"
    with MotoServer(access_log=str(log)) as server:
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

"""Fixtures of the real-mount tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.servers import MotoServer
from tests.conftest import run_pffs
from tests.fusecheck import clear_mount, is_dead


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


@contextlib.contextmanager
def stopped(endpoint_url: str, bucket: str, mnt: Path) -> Iterator[Path]:
    """A live mount of a bucket at `mnt`, then its daemon stopped (SIGSTOP): it holds its
    connection open and reads nothing from it, a daemon that never answers. Killed and cleared
    after."""
    mnt.mkdir(parents=True)
    result = run_pffs("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", endpoint_url)
    assert result.returncode == 0, result.stderr
    match = re.search(r"\(pid (\d+),", result.stdout)
    assert match, result.stdout
    pid = int(match.group(1))
    try:
        assert not is_dead(mnt)
        os.kill(pid, signal.SIGSTOP)
        yield mnt
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed already, by the hang guard
            os.kill(pid, signal.SIGKILL)
        clear_mount(mnt)


@pytest.fixture
def stopped_mount(moto: MotoServer, bucket: str, tmp_path: Path) -> Iterator[Path]:
    """`stopped`: a mount whose daemon never answers, at tmp_path/mnt."""
    with stopped(moto.endpoint_url, bucket, tmp_path / "mnt") as mnt:
        yield mnt

"""The tests' defences against a FUSE hang (tests/fusecheck.py), against a real mount whose
daemon never answers: a pffs daemon stopped with SIGSTOP, which holds its connection open and
reads nothing from it."""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.mounting.kernel import find_mount
from tests.conftest import run_pffs
from tests.fusecheck import HangGuard, MountHung, clear_mount, is_dead, os_errno

pytestmark = pytest.mark.mount


@pytest.fixture
def stopped_mount(moto, bucket: str, tmp_path: Path) -> Iterator[Path]:
    """A live mount of a bucket, then its daemon stopped (SIGSTOP); killed and cleared after."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_pffs("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url)
    assert result.returncode == 0, result.stderr
    match = re.search(r"\(pid (\d+),", result.stdout)
    assert match, result.stdout
    pid = int(match.group(1))
    try:
        assert not is_dead(mnt)
        os.kill(pid, signal.SIGSTOP)
        yield mnt
    finally:
        os.kill(pid, signal.SIGKILL)
        clear_mount(mnt)


def test_a_probe_of_a_mount_that_never_answers_fails_and_aborts_it(stopped_mount: Path) -> None:
    with pytest.raises(MountHung, match=r"statvfs.*unanswered after 1s; its connection aborted"):
        os_errno("statvfs", stopped_mount, timeout=1)
    # Aborted (the daemon is only stopped): every request fails at once from now on.
    assert os_errno("listdir", stopped_mount) == errno.ENOTCONN
    assert is_dead(stopped_mount)


def test_the_hang_guard_frees_a_test_stuck_on_a_mount(stopped_mount: Path, tmp_path: Path) -> None:
    """A call made here, in the test's own thread, that would wait forever: the guard, past its
    limit, clears the mounts under its roots, and the call fails instead."""
    with HangGuard([tmp_path], limit=1, poll=0.1) as guard:
        guard.begin("stuck")
        with pytest.raises(OSError) as failed:
            os.listdir(stopped_mount)
        guard.end()
    assert failed.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    assert find_mount(str(stopped_mount)) is None  # cleared: aborted and detached

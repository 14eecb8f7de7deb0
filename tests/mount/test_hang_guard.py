"""The tests' defences against a FUSE hang (tests/fusecheck.py), against a real mount whose
daemon never answers (the `stopped_mount` fixture: a pffs daemon stopped with SIGSTOP), with
the fusectl file system and on a machine without it (its directory made an empty one)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.mounting.kernel import find_mount
from pffs.testing.servers import MotoServer
from tests import fusecheck
from tests.conftest import SCRATCH, SESSION_MARK
from tests.fusecheck import HangGuard, MountHung, is_dead, os_errno
from tests.mount.conftest import stopped

pytestmark = pytest.mark.mount


@pytest.fixture(params=[pytest.param("fusectl", marks=pytest.mark.fusectl), "no fusectl"])
def connection_end(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """How a hung mount's connection ends here: aborted through fusectl, or, with fusectl's
    directory made an empty one (a machine where it is not mounted), closed by killing its
    daemon."""
    if request.param == "fusectl":
        yield "aborted"
        return
    empty = tmp_path / "no-fusectl"
    empty.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fusecheck, "CONNECTIONS", empty)
        yield "closed, its daemon killed"


def test_a_probe_of_a_mount_that_never_answers_fails_and_ends_its_connection(
    connection_end: str, stopped_mount: Path
) -> None:
    with pytest.raises(
        MountHung, match=rf"statvfs.*unanswered after 1s; its connection {connection_end}"
    ):
        os_errno("statvfs", stopped_mount, timeout=1)
    # Ended: every request fails at once from now on.
    assert os_errno("listdir", stopped_mount) == errno.ENOTCONN
    assert is_dead(stopped_mount)


def test_the_hang_guard_frees_a_test_stuck_on_a_mount(
    connection_end: str, stopped_mount: Path, tmp_path: Path
) -> None:
    """A call made here, in the test's own thread, that would wait forever: the guard, past the
    test's limit, clears the mounts under its roots, and the call fails instead."""
    with HangGuard([tmp_path], poll=0.1, grace=0) as guard:
        guard.begin("stuck", limit=1)
        with pytest.raises(OSError) as failed:
            os.listdir(stopped_mount)
        guard.end()
    assert failed.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    assert find_mount(str(stopped_mount)) is None  # cleared: ended and detached


def test_the_hang_guard_finds_a_stuck_mount_outside_its_roots_by_its_daemons_mark(
    connection_end: str, stopped_mount: Path
) -> None:
    """A mount outside the guard's directories (as the bench's and the CSI driver's are) is
    found by its daemon, which carries the session's mark (tests/conftest.py), through the
    connection its /dev/fuse descriptor names."""
    if not fusecheck.fdinfo_names_connections():
        pytest.skip("this kernel's fdinfo does not name a /dev/fuse descriptor's connection")
    with HangGuard([], poll=0.1, grace=0, mark=SESSION_MARK) as guard:
        guard.begin("stuck", limit=1)
        with pytest.raises(OSError) as failed:
            os.listdir(stopped_mount)
        guard.end()
    assert failed.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    assert find_mount(str(stopped_mount)) is None


def test_a_test_stuck_on_a_mount_without_fusectl_fails_at_its_limit_with_where_it_waited(
    pytester: pytest.Pytester, moto: MotoServer, bucket: str, tmp_path: Path
) -> None:
    """The whole defence, as a run meets it on a fresh machine (no fusectl): a test of a
    session of its own, in this process, waits on a mount that never answers; at its time limit
    pytest-timeout's alarm is due but cannot end a FUSE wait, the session's guard kills the
    daemon, and the test fails with the traceback of where it waited; the session goes on."""
    empty = tmp_path / "no-fusectl"
    empty.mkdir()
    # Under SCRATCH, one of the directories the inner session's guard clears.
    mnt = Path(SCRATCH) / f"stuck-{bucket}" / "mnt"
    with stopped(moto.endpoint_url, bucket, mnt), pytest.MonkeyPatch.context() as patch:
        patch.setattr(fusecheck, "CONNECTIONS", empty)
        patch.setattr(fusecheck, "HANG_GRACE_S", 1.0)  # the inner session's guard, sooner
        pytester.makeconftest('pytest_plugins = ["tests.conftest"]\n')
        pytester.makepyfile(
            test_stuck=f"""
            import os

            import pytest


            @pytest.mark.timeout(2)
            def test_stuck():
                os.listdir({str(mnt)!r})


            def test_next():
                pass
            """
        )
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
        result.assert_outcomes(failed=1, passed=1)
        result.stdout.fnmatch_lines(
            [
                "*Timeout*2.0s*",
                "*test_stuck*ran over its 2s, waiting in:",
                "*test_stuck.py*in test_stuck",
                "*os.listdir(*/mnt*",
                "FUSE mounts cleared: [[]'*/mnt'[]]",
            ]
        )
        assert find_mount(str(mnt)) is None

"""Fixtures: a real moto S3 server on 127.0.0.1, a one-node Ceph with its RADOS Gateway, buckets,
and real pffs mounts."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from pffs.errors import PffsError
from pffs.mounting.kernel import fusermount, wait_unmounted
from pffs.testing.rgw import RgwCluster, RgwUnavailable
from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer
from tests.fusecheck import (
    HangGuard,
    clear_mount,
    fuse_mounts_under,
    fusectl_missing,
    time_limit,
)
from tests.processes import wait_exited

# pytester: a test of the suite's own defences runs a test session inside its own
# (tests/mount/test_hang_guard.py).
pytest_plugins = ["pytester"]

for _key, _value in DUMMY_CREDENTIALS.items():
    os.environ[_key] = _value
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("AWS_ENDPOINT_URL", None)
# Cache blocks, logs and mount records of the tests stay out of the user's own directories
# (and the hang guard clears any FUSE mount left under it).
SCRATCH = tempfile.mkdtemp(prefix="pffs-tests-")
os.environ["XDG_CACHE_HOME"] = os.path.join(SCRATCH, "cache")
os.environ["XDG_STATE_HOME"] = os.path.join(SCRATCH, "state")


def _remove_scratch() -> None:
    """SCRATCH goes with the process (a few hundred MB of cache blocks a session, which piled
    up on a shared machine until the disk tier's free-space floor was reached): once no mount
    is left under it, never into one."""
    if not fuse_mounts_under(SCRATCH):
        shutil.rmtree(SCRATCH, ignore_errors=True)


atexit.register(_remove_scratch)
# The disk tier keeps a share of its disk free (--cache-free-ratio, 0.1): on a shared machine's
# fuller disk it would write nothing, and the tests counting on its writes would fail for want
# of a disk. The tests' mounts and caches keep no floor unless a test sets one (tests of the
# floor do); a machine state the suite does not take (issue 47).
NO_FREE_FLOOR = ("--cache-free-ratio", "0")
# Every process the tests start carries this session's mark (tests/processes.py), so that the
# hang guard finds the mounts its daemons serve wherever they are.
SESSION_MARK = ("PFFS_TEST_SESSION", uuid.uuid4().hex)
os.environ[SESSION_MARK[0]] = SESSION_MARK[1]
# The tests start hundreds of Python processes (pffs's commands and daemons, servers, the
# bench): each would compile pffs's modules again where the environment forbids writing their
# bytecode (PYTHONDONTWRITEBYTECODE); the site-packages' own is there already.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

PFFS = [sys.executable, "-m", "pffs"]


def fuse_available() -> str | None:
    """Why real mounts cannot run here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (apt-get install fuse3)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked `mount` (the one mark of real FUSE mounts) is skipped, with the reason,
    where real mounts cannot run; one marked `fusectl`, where the fusectl file system is not
    mounted."""
    for mark, reason in (("mount", fuse_available()), ("fusectl", fusectl_missing())):
        if reason is None:
            continue
        for item in items:
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def hang_guard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HangGuard]:
    """No FUSE hang outlasts a test's time limit by much, and no mount outlasts the session
    (tests/fusecheck.py)."""
    roots = [tmp_path_factory.getbasetemp(), Path(SCRATCH)]
    with HangGuard(roots, mark=SESSION_MARK) as guard:
        yield guard


@pytest.fixture(autouse=True)
def each_test_guarded(hang_guard: HangGuard, request: pytest.FixtureRequest) -> Iterator[None]:
    hang_guard.begin(request.node.nodeid, time_limit(request.node))
    yield
    hang_guard.end()


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RgwCluster]:
    """One Ceph cluster with a gateway for the whole session (it takes a few seconds to start),
    with a user whose keys are the tests' own (DUMMY_CREDENTIALS), so pffs and boto3 reach it
    as they reach moto; the tests that ask for it skip, with the reason, where Ceph cannot run."""
    try:
        cluster = RgwCluster.start(tmp_path_factory.mktemp("rgw") / "cluster")
    except RgwUnavailable as exc:
        pytest.skip(f"RGW: {exc}")
    with cluster:
        keys = (DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"], DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        cluster.create_user("pffs-test", keys=keys)
        yield cluster


@pytest.fixture(scope="session")
def rgw_s3(rgw: RgwCluster):
    """A boto3 client of the gateway, as the tests' user."""
    return boto3.client("s3", endpoint_url=rgw.endpoint)


@pytest.fixture
def rgw_bucket(rgw_s3) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    rgw_s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def s3(moto: MotoServer):
    return boto3.client("s3", endpoint_url=moto.endpoint_url)


@pytest.fixture
def bucket(s3) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def run_pffs(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PFFS, *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


def unmount_quietly(mountpoint: Path) -> None:
    """Teardown of a mount that `pffs umount` did not take, or whose daemon was killed: its
    connection aborted and the mount detached, never waiting on it (tests/fusecheck.py)."""
    clear_mount(mountpoint)


@contextlib.contextmanager
def mounted(
    source: str, mountpoint: Path, *options: str, env: dict[str, str] | None = None
) -> Iterator[Path]:
    """`pffs mount` (the daemon way), yield, then unmount as `pffs umount` does (fusermount3,
    called from here: one CLI start fewer per mount; tests of `pffs umount` run it) and wait
    for the daemon to exit, its work done (the disk tier's writes behind flushed, staged files
    uploaded): what follows may look at its cache or mount it again. Never leaves a mount
    behind."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_file = mountpoint.parent / f"{mountpoint.name}.log"
    result = run_pffs(
        "mount",
        source,
        str(mountpoint),
        *("--log-file", str(log_file), *NO_FREE_FLOOR),  # a test's own floor comes after
        *options,
        env=env,
    )
    assert result.returncode == 0, result.stderr + _tail(log_file)
    daemon = re.search(r"\(pid (\d+),", result.stdout)
    assert daemon, result.stdout
    try:
        yield mountpoint
    finally:
        try:
            fusermount(str(mountpoint))
        except PffsError:  # busy, or already gone
            unmount_quietly(mountpoint)
        assert wait_unmounted(str(mountpoint)), f"{mountpoint} still mounted"
        assert wait_exited(int(daemon.group(1))), f"the daemon of {mountpoint} still runs"


def _tail(path: Path) -> str:
    try:
        return "\n" + "\n".join(path.read_text().splitlines()[-20:])
    except OSError:
        return ""


@pytest.fixture
def mount_s3(moto: MotoServer, tmp_path: Path):
    """Mount a bucket of the moto server: `with mount_s3("s3://b") as mnt: ...`."""

    def _mount(source: str, *options: str, name: str = "mnt"):
        return mounted(source, tmp_path / name, "--endpoint-url", moto.endpoint_url, *options)

    return _mount


def stats_snapshot(mnt: Path) -> dict[str, Any]:
    """A mount's `.pffs/stats`: its metrics as JSON."""
    with open(mnt / ".pffs" / "stats", "rb") as f:
        data: dict[str, Any] = json.load(f)
    return data


def metric_value(snapshot: dict[str, Any], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (0 when none)."""
    family = snapshot["metrics"].get(name, {"samples": []})
    return float(
        sum(
            s["value"]
            for s in family["samples"]
            if all(s["labels"].get(k) == v for k, v in labels.items())
        )
    )

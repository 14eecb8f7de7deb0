"""A bench stopped partway leaves nothing behind: SIGTERM (what `timeout` and `kill` send) and
SIGINT to its process group (what Ctrl-C in a terminal sends).

A real quick bench runs against s3rver (and against Ceph's gateway) behind the delay proxy,
with real rclone and pffs mounts. Every process it starts inherits a marker in its environment,
so the test finds them in /proc whatever session they put themselves in (servers and proxies
run in sessions of their own, mount daemons detach): it waits until the server, the proxy and
a FUSE mount are up, stops the bench, then checks that no marked process and no FUSE mount
under the bench's temporary directory is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pffs.testing.rgw import missing_binaries
from tests.bench.sizes import SMALL_DATASET
from tests.fusecheck import clear_mount, fuse_mounts_under
from tests.processes import marked_processes

pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is missing (apt-get install fio)"),
    pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone is missing"),
]
MARK = "PFFS_BENCH_STOP_TEST"


# Each server by the command of its process: s3rver, and Ceph's gateway (beside its monitor and
# OSD, all of which must go, and its directory with them).
SERVER_COMMANDS = {"s3rver": "s3rver", "rgw": "radosgw"}


@pytest.mark.parametrize(
    ("signum", "exit_code", "server"),
    [(signal.SIGTERM, 143, "s3rver"), (signal.SIGINT, 130, "s3rver"), (signal.SIGTERM, 143, "rgw")],
    ids=["term", "int", "term-rgw"],
)
def test_a_stopped_bench_leaves_no_process_and_no_mount(
    tmp_path: Path, signum: signal.Signals, exit_code: int, server: str
) -> None:
    if server == "rgw" and missing_binaries():
        pytest.skip(f"Ceph is not installed ({', '.join(missing_binaries())} missing)")
    token = uuid.uuid4().hex
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), MARK: token}
    argv = [sys.executable, "-m", "bench", "--quick", "--latency", "20ms", *SMALL_DATASET]
    argv += ["--systems", "rclone,pffs"]
    argv += ["--servers", server, "--out", str(tmp_path / "results")]
    log = tmp_path / "bench.log"
    with open(log, "wb") as out:
        bench = subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        started = stop_partway(bench, signum, token, scratch, log, SERVER_COMMANDS[server])
        assert bench.wait(timeout=180) == exit_code, log.read_text()[-3000:]
        # Mount daemons end on their own once unmounted: give them a moment.
        deadline = time.monotonic() + 10
        while marked_processes(MARK, token) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fuse_mounts_under(scratch) == [], log.read_text()[-3000:]
        assert marked_processes(MARK, token) == {}, (started, log.read_text()[-3000:])
        assert "stopped by" in log.read_text()
        assert list(scratch.glob("pffs-bench-*/rgw")) == []  # the cluster's directory too
    finally:  # a failing bench leaves nothing behind either
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for mountpoint in fuse_mounts_under(scratch):
            clear_mount(mountpoint)
        for pid in marked_processes(MARK, token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stop_partway(
    bench: subprocess.Popen[bytes],
    signum: signal.Signals,
    token: str,
    scratch: Path,
    log: Path,
    server_command: str,
) -> dict[int, str]:
    """Once the server, the delay proxy and a mount are up, send `signum`; what was running."""
    deadline = time.monotonic() + 300
    while True:
        assert bench.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the bench never got its mounts up"
        commands = " ".join(marked_processes(MARK, token).values())
        up = server_command in commands and "testing.delay" in commands
        if fuse_mounts_under(scratch) and up:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # into the scenarios
    started = marked_processes(MARK, token)
    if signum == signal.SIGINT:
        os.killpg(bench.pid, signum)  # a terminal's Ctrl-C reaches the whole group
    else:
        bench.send_signal(signum)
    return started

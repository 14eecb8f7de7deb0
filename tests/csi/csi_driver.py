"""A `pffs csi` driver in a subprocess, and gRPC clients for it over its unix socket.

Shared by the CSI tests (their `driver` fixture: tests/csi/conftest.py). The driver is the real
command (`python -m pffs csi --mode all`); the tests speak real gRPC to it. Everything it mounts
lies under the test's own directory and is unmounted by `cleanup_mounts`, so a failing test
leaves no mount behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pffs.csi.proto import csi_pb2, csi_pb2_grpc
from pffs.mounting.kernel import mount_table
from tests.conftest import NO_FREE_FLOOR
from tests.fusecheck import end_connection

AccessMode = csi_pb2.VolumeCapability.AccessMode


def capability(mode: int = AccessMode.MULTI_NODE_READER_ONLY) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),  # type: ignore[arg-type]
    )


@dataclass
class Driver:
    """One run of `pffs csi`; restart() stops it (SIGTERM) and starts it again."""

    root: Path
    env: dict[str, str] | None = None
    node_id: str = "node-1"
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    # A short directory for the socket: unix socket paths are limited to 107 bytes.
    socket_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="csi-"))

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def log_file(self) -> Path:
        return self.root / "driver.log"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_dir}/csi.sock"

    def start(self) -> Driver:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.runs += 1
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pffs",
                    "--debug",
                    "csi",
                    "--endpoint",
                    self.endpoint,
                    "--node-id",
                    self.node_id,
                    "--mode",
                    "all",
                    "--cache-dir",
                    str(self.cache_dir),
                    "--state-dir",
                    str(self.state_dir),
                    "--kubelet-dir",
                    str(self.kubelet_dir),
                    *NO_FREE_FLOOR,  # the node's disk, shared with the machine's other work
                    *self.extra_args,
                ],
                stdout=log,
                stderr=log,
                env=self.env,
            )
        finally:
            log.close()
        self.channel = grpc.insecure_channel(self.endpoint)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=60)
        except grpc.FutureTimeoutError:
            raise AssertionError(f"the driver did not come up:\n{self.log()}") from None
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> Driver:
        self.stop()
        return self.start()

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def target(self, pod: str) -> Path:
        """A target path the way kubelet makes them; its parent exists, itself not."""
        parent = self.kubelet_dir / "pods" / pod / "volumes" / "kubernetes.io~csi" / "pv"
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"

    def publish(
        self,
        volume_id: str,
        target: Path,
        context: dict[str, str],
        secrets: dict[str, str] | None = None,
        readonly: bool = False,
        mode: int = AccessMode.MULTI_NODE_READER_ONLY,
    ) -> csi_pb2.NodePublishVolumeResponse:
        response: csi_pb2.NodePublishVolumeResponse = self.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=str(target),
                volume_capability=capability(mode),
                readonly=readonly,
                volume_context=context,
                secrets=secrets or {},
            ),
            timeout=120,
        )
        return response

    def unpublish(self, volume_id: str, target: Path) -> csi_pb2.NodeUnpublishVolumeResponse:
        response: csi_pb2.NodeUnpublishVolumeResponse = self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
            timeout=60,
        )
        return response

    def cleanup(self) -> None:
        self.stop()
        cleanup_mounts(self.root)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@contextlib.contextmanager
def running(
    root: Path, env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()
) -> Iterator[Driver]:
    """A driver started under `root`, stopped and its mounts detached at the end."""
    driver = Driver(root, env=env, extra_args=extra_args).start()
    try:
        yield driver
    finally:
        driver.cleanup()


def cleanup_mounts(root: Path) -> None:
    """Detach every mount under `root`, deepest first (binds before their staging mount), a
    FUSE one's connection ended first so that nothing waits on it (tests/fusecheck.py)."""
    prefix = str(root) + "/"
    mounts = sorted(
        {e.mountpoint for e in mount_table() if e.mountpoint.startswith(prefix)},
        key=len,
        reverse=True,
    )
    for path in mounts:
        end_connection(path)
        subprocess.run(["umount", "-l", path], capture_output=True, check=False, timeout=30)


def status_of(call: object) -> grpc.StatusCode:
    """The status code a failed call ended with."""
    assert isinstance(call, grpc.RpcError), call
    code: grpc.StatusCode = call.code()
    return code


def mount_daemons(staging_prefix: str) -> list[int]:
    """Pids of pffs mount daemons serving a mountpoint under `staging_prefix`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if b"_daemon" in argv and state != b"Z" and _serves_under(int(entry), staging_prefix):
            pids.append(int(entry))
    return pids


def _serves_under(pid: int, prefix: str) -> bool:
    # The daemon gets its config on stdin; its log file (an open fd) names the volume's key.
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False

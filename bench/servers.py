"""S3 servers for the benchmark: moto, s3rver, Ceph's RADOS Gateway, MinIO, or any endpoint,
each on its own port.

Every server started here is stopped by `stop()`, and recorded with bench.leftovers, so
nothing outlives a bench however it ends. With `--latency`, `far` puts a userspace delay proxy
in front of a server (this kernel has no netem), to mimic a cloud store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.leftovers import stop_process, track_process
from pffs.testing.rgw import CEPH_PACKAGES, RgwCluster, RgwUnavailable, missing_binaries
from pffs.testing.servers import free_port, wait_for_port

S3RVER_VERSION = "3"
# What each server is, for a reader of the figures (the README's headline names the columns).
KINDS = {
    "moto": "a Python test double that reads a whole object for each ranged GET",
    "s3rver": "a Node.js test double",
    "rgw": "Ceph's RADOS Gateway, a production S3 server (one node, Debian's Ceph)",
    "minio": "MinIO, a production S3 server",
}


@dataclass
class Server:
    name: str
    endpoint_url: str
    access_key: str
    secret_key: str
    stop: Callable[[], None] = field(repr=False, default=lambda: None)
    pid: int | None = None  # the server process (the proxy's, for a far one), when we run it
    # The store's own processes (RGW: its gateway and OSD), whose CPU is the store's side of a
    # read; a far server's are those of the server behind its proxy.
    store_pids: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """Environment giving a client this server's credentials."""
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


class Unavailable(Exception):
    """A server or system that cannot run here, with the reason."""


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    return lambda: stop_process(proc)


def _spawn(
    argv: list[str], env: dict[str, str], host: str, port: int, log: str
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
    track_process(proc)
    try:
        wait_for_port(port)
    except TimeoutError:
        proc.kill()
        raise Unavailable(f"{argv[0]} did not listen on {host}:{port} (log: {log})") from None
    return proc


def far(server: Server, rtt_ms: float, log: str) -> Server:
    """The same server behind a delay proxy (pffs.testing.delay) adding `rtt_ms` per round trip.

    The proxy runs as a process of its own, so its CPU is its own and it never competes for
    the GIL of the bench's clients. Stopping the returned server stops the proxy only.
    """
    upstream = urllib.parse.urlsplit(server.endpoint_url)
    argv = [sys.executable, "-m", "pffs.testing.delay", "--rtt-ms", str(rtt_ms)]
    argv += ["--upstream", f"{upstream.hostname}:{upstream.port}"]
    with open(log, "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    track_process(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # the proxy prints its port once it listens
    proc.stdout.close()
    if not line.isdigit():
        proc.kill()
        proc.wait()
        raise Unavailable(f"the delay proxy did not start (log: {log})")
    return Server(
        f"{server.name}, {rtt_ms:g} ms",
        f"http://127.0.0.1:{int(line)}",
        server.access_key,
        server.secret_key,
        _stopper(proc),
        proc.pid,
        server.store_pids,
    )


# Where the bench keeps what it installs between runs (s3rver's npm package).
TOOLS_DIR = os.path.join(os.path.expanduser("~/.cache"), "pffs-bench")


def s3rver_binary(cache_dir: str) -> str:
    """The s3rver command, installed with npm into the bench's cache when missing."""
    found = shutil.which("s3rver")
    if found:
        return found
    prefix = os.path.join(cache_dir, "s3rver")
    binary = os.path.join(prefix, "node_modules", ".bin", "s3rver")
    if os.path.exists(binary):
        return binary
    if shutil.which("npm") is None:
        raise Unavailable("s3rver is not installed and npm is missing (apt-get install npm)")
    os.makedirs(prefix, exist_ok=True)
    result = subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            prefix,
            "--no-audit",
            "--no-fund",
            f"s3rver@{S3RVER_VERSION}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not os.path.exists(binary):
        raise Unavailable(f"npm install s3rver failed: {result.stderr.strip()[-300:]}")
    return binary


class Launcher:
    """Starts servers on loopback (`far` then puts one far away)."""

    def __init__(self, workdir: str, cache_dir: str = TOOLS_DIR) -> None:
        self.workdir = workdir
        self.cache_dir = cache_dir
        self.host = "127.0.0.1"

    def _log(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.log")

    def moto(self) -> Server:
        port = free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)]
        proc = _spawn(argv, dict(os.environ), self.host, port, self._log("moto"))
        url = f"http://{self.host}:{port}"
        return Server("moto", url, "bench", "bench-secret", _stopper(proc), proc.pid, (proc.pid,))

    def s3rver(self) -> Server:
        binary = s3rver_binary(self.cache_dir)
        port = free_port()
        data = tempfile.mkdtemp(prefix="s3rver-", dir=self.workdir)
        argv = [binary, "-d", data, "-a", self.host, "-p", str(port), "--silent"]
        # s3rver 3 makes continuation tokens with a cipher OpenSSL 3 only has in its legacy
        # provider; without it every truncated listing is a 500.
        env = {**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"}
        proc = _spawn(argv, env, self.host, port, self._log("s3rver"))
        url = f"http://{self.host}:{port}"
        return Server("s3rver", url, "S3RVER", "S3RVER", _stopper(proc), proc.pid, (proc.pid,))

    def rgw(self, objectstore: str = "memstore") -> Server:
        """A one-node Ceph and its gateway (pffs.testing.rgw), with a user of the bench's own;
        Ceph is installed from Debian's packages when missing."""
        install_ceph()
        try:
            cluster = RgwCluster.start(
                Path(self.workdir) / "rgw", objectstore=objectstore, on_spawn=track_process
            )
        except RgwUnavailable as exc:
            raise Unavailable(str(exc)) from None
        try:
            access, secret = cluster.create_user("pffs-bench")
        except BaseException as exc:
            cluster.stop()
            if isinstance(exc, RgwUnavailable):
                raise Unavailable(str(exc)) from None
            raise
        gateway = cluster.processes["rgw"].pid
        store = (gateway, cluster.processes["osd.0"].pid)
        return Server("rgw", cluster.endpoint, access, secret, cluster.stop, gateway, store)

    def minio(self, binary: str) -> Server:
        if not os.path.exists(binary) and shutil.which(binary) is None:
            raise Unavailable(f"no MinIO binary {binary!r}")
        port = free_port()
        data = tempfile.mkdtemp(prefix="minio-", dir=self.workdir)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": "pffsbench",
            "MINIO_ROOT_PASSWORD": "pffsbench-secret",
        }
        argv = [binary, "server", data, "--address", f"{self.host}:{port}", "--quiet"]
        proc = _spawn(argv, env, self.host, port, self._log("minio"))
        url = f"http://{self.host}:{port}"
        return Server("minio", url, "pffsbench", "pffsbench-secret", _stopper(proc), proc.pid)


def install_ceph() -> None:
    """Ceph's packages from Debian when missing (as s3rver comes from npm); Unavailable, with
    why, where they cannot be installed."""
    if not missing_binaries():
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        why = "no apt-get" if apt is None else "not root"
        raise Unavailable(f"Ceph is not installed and cannot be here ({why})")
    print("bench: installing Ceph from Debian's packages (about 1.5 min)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [apt, "update", "-qq"],
        [apt, "install", "-y", "-qq", "--no-install-recommends", *CEPH_PACKAGES],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            lines = (result.stderr.strip() or result.stdout.strip() or "failed").splitlines()
            raise Unavailable(f"apt-get could not install Ceph: {lines[-1][:200]}")
    missing = missing_binaries()
    if missing:
        raise Unavailable(f"Ceph installed, yet {', '.join(missing)} missing")


def external(endpoint_url: str) -> Server:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise Unavailable("--endpoint-url needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return Server(f"endpoint {endpoint_url}", endpoint_url, key, secret)

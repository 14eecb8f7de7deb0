"""S3 servers for the benchmark: moto, s3rver, MinIO, or any endpoint, each on its own port.

Every server started here is stopped by `stop()`; the bench runs them all inside one
ExitStack so nothing outlives it. With `--latency`, a server runs inside a network namespace of
the bench's own, reached through a veth pair delayed with netem, to mimic a cloud store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from pffs.testing.servers import free_port, wait_for_port

S3RVER_VERSION = "3"
NAMESPACE = "pffsbench"
# Addresses inside the bench's own network namespace and its veth peer, nowhere else.
HOST_SIDE, NS_SIDE = "10.213.77.1", "10.213.77.2"


@dataclass
class Server:
    name: str
    endpoint_url: str
    access_key: str
    secret_key: str
    stop: Callable[[], None] = field(repr=False, default=lambda: None)

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


def _spawn(
    argv: list[str], env: dict[str, str], host: str, port: int, log: str
) -> Callable[[], None]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        wait_for_port_on(host, port)
    except TimeoutError:
        proc.kill()
        raise Unavailable(f"{argv[0]} did not listen on {host}:{port} (log: {log})") from None

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return stop


def wait_for_port_on(host: str, port: int) -> None:
    if host == "127.0.0.1":
        wait_for_port(port)
        return
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{host}:{port}")


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
    """Starts servers on loopback, or inside the latency namespace when one is set up."""

    def __init__(self, workdir: str, cache_dir: str, latency_ms: float = 0.0) -> None:
        self.workdir = workdir
        self.cache_dir = cache_dir
        self.latency_ms = latency_ms
        self.prefix: list[str] = []
        self.host = "127.0.0.1"
        if latency_ms > 0:
            self._make_namespace()

    def _make_namespace(self) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            raise Unavailable("--latency needs root and iproute2 (ip, tc) for a network namespace")
        self.close()
        delay = f"{self.latency_ms / 2:.1f}ms"  # half each way: the round trip gets the whole
        commands = [
            ["ip", "netns", "add", NAMESPACE],
            ["ip", "link", "add", "pffsb0", "type", "veth", "peer", "name", "pffsb1"],
            ["ip", "link", "set", "pffsb1", "netns", NAMESPACE],
            ["ip", "addr", "add", f"{HOST_SIDE}/30", "dev", "pffsb0"],
            ["ip", "link", "set", "pffsb0", "up"],
            [
                "ip",
                "netns",
                "exec",
                NAMESPACE,
                "ip",
                "addr",
                "add",
                f"{NS_SIDE}/30",
                "dev",
                "pffsb1",
            ],
            ["ip", "netns", "exec", NAMESPACE, "ip", "link", "set", "pffsb1", "up"],
            ["ip", "netns", "exec", NAMESPACE, "ip", "link", "set", "lo", "up"],
            ["tc", "qdisc", "add", "dev", "pffsb0", "root", "netem", "delay", delay],
            [
                "ip",
                "netns",
                "exec",
                NAMESPACE,
                "tc",
                "qdisc",
                "add",
                "dev",
                "pffsb1",
                "root",
                "netem",
                "delay",
                delay,
            ],
        ]
        for argv in commands:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                self.close()
                if "qdisc kind is unknown" in result.stderr:
                    raise Unavailable("--latency needs the kernel's netem qdisc (sch_netem)")
                raise Unavailable(f"{' '.join(argv)}: {result.stderr.strip()}")
        self.prefix = ["ip", "netns", "exec", NAMESPACE]
        self.host = NS_SIDE

    def close(self) -> None:
        if self.latency_ms > 0:
            subprocess.run(["ip", "link", "del", "pffsb0"], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True, check=False)

    def _log(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.log")

    def moto(self) -> Server:
        port = free_port()
        argv = [*self.prefix, sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)]
        stop = _spawn(argv, dict(os.environ), self.host, port, self._log("moto"))
        return Server("moto", f"http://{self.host}:{port}", "bench", "bench-secret", stop)

    def s3rver(self) -> Server:
        binary = s3rver_binary(self.cache_dir)
        port = free_port()
        data = tempfile.mkdtemp(prefix="s3rver-", dir=self.workdir)
        argv = [*self.prefix, binary, "-d", data, "-a", self.host, "-p", str(port), "--silent"]
        # s3rver 3 makes continuation tokens with a cipher OpenSSL 3 only has in its legacy
        # provider; without it every truncated listing is a 500.
        env = {**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"}
        stop = _spawn(argv, env, self.host, port, self._log("s3rver"))
        return Server("s3rver", f"http://{self.host}:{port}", "S3RVER", "S3RVER", stop)

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
        argv = [*self.prefix, binary, "server", data, "--address", f"{self.host}:{port}", "--quiet"]
        stop = _spawn(argv, env, self.host, port, self._log("minio"))
        return Server("minio", f"http://{self.host}:{port}", "pffsbench", "pffsbench-secret", stop)


def external(endpoint_url: str) -> Server:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise Unavailable("--endpoint-url needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return Server(f"endpoint {endpoint_url}", endpoint_url, key, secret)

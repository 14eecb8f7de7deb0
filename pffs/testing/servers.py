"""Helpers shared by the demo, the tests and the benchmark: a real S3 server on 127.0.0.1.

`MotoServer` runs moto's HTTP server in a child process (as tests and the bench need a server
that outlives nothing of theirs) or in-process threads (the demo, which must start nothing
else). Both speak real HTTP on a loopback port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Self

# moto accepts any credentials unless told otherwise; these keep boto3 from looking elsewhere.
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "pffs-test",
    "AWS_SECRET_ACCESS_KEY": "pffs-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


class Service:
    """A local server or proxy that is started and stopped; `with X(...) as x:` starts it on
    entry and stops it on the way out, failures included."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class MotoServer(Service):
    """moto's S3 server on 127.0.0.1 in a child process; use as a context manager."""

    def __init__(self, env: dict[str, str] | None = None, access_log: str | None = None) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._env = env or {}
        # The server's access log (one line per request), to count requests at the server.
        self.access_log = access_log
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MotoServer:
        log = open(self.access_log, "ab") if self.access_log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=log,
                env={**os.environ, **self._env},
            )
        finally:
            if not isinstance(log, int):
                log.close()
        wait_for_port(self.port)
        return self

    def requests(self, method: str, path: str) -> int:
        """How many `method` requests for `path` (e.g. "/bucket/key") the server answered."""
        assert self.access_log, "start the server with access_log= to count requests"
        needle = f"{method} {path} HTTP/"  # werkzeug may colour the quoted request
        with open(self.access_log, encoding="utf-8", errors="replace") as f:
            return sum(needle in line for line in f)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

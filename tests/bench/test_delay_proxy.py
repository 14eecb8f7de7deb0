"""The delay proxy (pffs.testing.delay): bytes forwarded exactly, each round trip at least the
delay, connections closed cleanly. Bounds here are lower bounds only: how fast the proxy is,
is measured by hand (docs/BENCHMARKS.md), never asserted."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pffs.testing.delay import PIPES_IN_FLIGHT, DelayProxy


def body_of(size: int) -> bytes:
    """Deterministic, non-repeating bytes: a shifted or dropped chunk cannot go unnoticed."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


class Upstream(ThreadingHTTPServer):
    """An HTTP/1.1 server with keep-alive: GET /N answers N bytes, PUT answers the body's sha256,
    and every connection it accepted is counted."""

    daemon_threads = True

    def __init__(self) -> None:
        self.connections: set[tuple[str, int]] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.connections.add(self.client_address)
                payload = body_of(int(self.path.lstrip("/")))
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_PUT(self) -> None:
                server.connections.add(self.client_address)
                received = self.rfile.read(int(self.headers["Content-Length"]))
                digest = hashlib.sha256(received).hexdigest().encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(digest)))
                self.end_headers()
                self.wfile.write(digest)

        super().__init__(("127.0.0.1", 0), Handler)
        self.port: int = self.server_address[1]


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def get(connection: http.client.HTTPConnection, path: str) -> bytes:
    connection.request("GET", path)
    response = connection.getresponse()
    assert response.status == 200
    return response.read()


def test_forwards_large_bodies_exactly_on_one_kept_alive_connection(upstream: Upstream) -> None:
    sent = body_of(5 << 20)[::-1]  # not what the server generates, so the echo is real
    with DelayProxy(upstream.port, rtt_ms=5) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        assert get(connection, f"/{8 << 20}") == body_of(8 << 20)
        connection.request("PUT", "/echo", body=sent)
        assert connection.getresponse().read() == hashlib.sha256(sent).hexdigest().encode()
        assert get(connection, "/1") == body_of(1)
        connection.close()
    assert len(upstream.connections) == 1  # three requests, one connection: keep-alive held


def test_parallel_connections_each_get_their_own_bytes(upstream: Upstream) -> None:
    sizes = [1 << 20, 3 << 20, 17, 700_001, 2 << 20, 65536, 5, 4 << 20]
    with DelayProxy(upstream.port, rtt_ms=10) as proxy:

        def fetch(size: int) -> bool:
            connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            try:
                return get(connection, f"/{size}") == body_of(size)
            finally:
                connection.close()

        results: list[bool] = []
        threads = [
            threading.Thread(target=lambda s=size: results.append(fetch(s))) for size in sizes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == [True] * len(sizes)


def test_each_round_trip_takes_at_least_the_delay(upstream: Upstream) -> None:
    rtt = 0.1
    with DelayProxy(upstream.port, rtt_ms=rtt * 1000) as proxy:
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        get(connection, "/100")
        first = time.perf_counter() - started
        started = time.perf_counter()
        get(connection, "/100")
        second = time.perf_counter() - started
        connection.close()
    assert first >= 2 * rtt  # the connection's handshake, then the request's round trip
    assert second >= rtt  # a kept-alive connection: one round trip


def test_an_upstream_close_reaches_the_client_as_an_eof(upstream: Upstream) -> None:
    with DelayProxy(upstream.port, rtt_ms=5) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(b"GET /1000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            while chunk := sock.recv(65536):  # ends only when the proxy passes the close on
                received += chunk
        assert received.endswith(body_of(1000))
        deadline = time.monotonic() + 5
        while proxy.links and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not proxy.links  # the finished connection was forgotten


def test_stop_closes_connections_and_the_port(upstream: Upstream) -> None:
    proxy = DelayProxy(upstream.port, rtt_ms=5).start()
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    get(connection, "/10")
    proxy.stop()
    with pytest.raises((http.client.HTTPException, OSError)):
        get(connection, "/10")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
    assert not any(t.name == "delay-proxy" for t in threading.enumerate())


def test_an_unreachable_upstream_closes_the_client_connection() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]
    with (
        DelayProxy(dead_port, rtt_ms=0) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100) == b""


def test_a_negative_round_trip_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        DelayProxy(1, rtt_ms=-1)
    result = subprocess.run(
        [sys.executable, "-m", "pffs.testing.delay", "--upstream", "nowhere", "--rtt-ms", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "expected HOST:PORT, got 'nowhere'" in result.stderr.strip().splitlines()[-1]


def _numbered(count: int) -> Iterator[bytes]:
    """`count` chunks of 64 KiB, each opening with its number: a chunk lost, doubled or out of
    order shows."""
    filler = bytes(range(256)) * 256
    for number in range(count):
        yield number.to_bytes(8, "big") + filler[8:]


def test_a_reader_that_stalls_holds_the_upstream_back_and_misses_nothing() -> None:
    chunks = 1024  # 64 MiB: more than the proxy holds in its pipes and the sockets' buffers
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                for chunk in _numbered(chunks):
                    connection.sendall(chunk)

        threading.Thread(target=serve, daemon=True).start()
        with (
            DelayProxy(listener.getsockname()[1], rtt_ms=2) as proxy,
            socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as reader,
        ):
            time.sleep(1.0)  # the reader reads nothing: the proxy must stop taking more
            (link,) = proxy.links
            assert link.down is not None
            held = link.down.held_pipes()
            assert 0 < held <= PIPES_IN_FLIGHT
            received = bytearray()
            while chunk := reader.recv(1 << 20):
                received += chunk
    assert bytes(received) == b"".join(_numbered(chunks))


def test_an_upstream_reset_leaves_the_next_connections_exact(upstream: Upstream) -> None:
    """A reset mid-answer ends that connection only; the pipes it held are not handed out
    twice, so the connections after it still carry their own bytes."""
    with socket.create_server(("127.0.0.1", 0)) as resetting:

        def reset_each() -> None:
            for _ in range(8):
                connection, _ = resetting.accept()
                connection.sendall(b"x" * 100_000)
                # SO_LINGER 0: the close sends a reset, not a FIN
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                connection.close()

        threading.Thread(target=reset_each, daemon=True).start()
        with DelayProxy(resetting.getsockname()[1], rtt_ms=2) as proxy:
            for _ in range(8):
                with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as reader:
                    reader.sendall(b"GET / HTTP/1.1\r\n\r\n")
                    with contextlib.suppress(ConnectionResetError):
                        while reader.recv(65536):
                            pass
            proxy.upstream = ("127.0.0.1", upstream.port)  # the same pipes, now for answers
            sizes = [3 << 20, 1 << 20, 700_001, 2 << 20]
            results: list[bool] = []

            def fetch(size: int) -> None:
                connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
                results.append(get(connection, f"/{size}") == body_of(size))
                connection.close()

            threads = [threading.Thread(target=fetch, args=(size,)) for size in sizes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert results == [True] * len(sizes)

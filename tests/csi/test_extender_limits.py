"""The scheduler extender's HTTP side under clients that are not the scheduler (over real
sockets, csi/affinity/httpserve.py): 200 connections trickling a byte a second hold no thread
while a scheduler call is answered, and are cut off at the request deadline; connections over
the cap are closed at once; a body over its cap is refused without being read. The API server
is tests/csi/kube_apiserver.py's stand-in (none can run here)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from pffs.csi.affinity.extender import Extender, make_server
from pffs.csi.affinity.httpserve import HttpLimits, HttpServer
from pffs.kube import KubeClient
from tests.csi.kube_apiserver import FakeApiServer
from tests.csi.test_affinity_extender import ATTRS_A, PVC_A, A, _args, _node, _pod
from tests.waiting import eventually

GIB = 1 << 30
SLOW = 200
# The slow connections' deadline: the scheduler's answer comes before it (the test's check that
# it waited for none of them), given room on a loaded machine.
REQUEST_SECONDS = 5.0


@pytest.fixture
def served() -> Iterator[tuple[FakeApiServer, HttpServer]]:
    with FakeApiServer() as api:
        api.add_pffs_claim("ml", "imagenet", "pvc-1111", ATTRS_A)
        _node(api, "n1", {A: (1.0, 100 * GIB)})
        _node(api, "n2", {})
        limits = HttpLimits(request_seconds=REQUEST_SECONDS, max_connections=SLOW + 8)
        server = make_server(Extender(KubeClient(api.url)), "127.0.0.1:0", "/pffs", limits)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        yield api, server
        server.shutdown()
        server.server_close()


def _connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def test_slow_connections_hold_no_thread_and_the_scheduler_is_answered(
    served: tuple[FakeApiServer, HttpServer],
) -> None:
    api, server = served
    request = b"POST /pffs/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    threads_before = threading.active_count()
    slow = [_connect(server) for _ in range(SLOW)]
    stop = threading.Event()

    def trickle() -> None:  # slowloris: one byte a second on each connection
        position = 0
        while not stop.is_set() and position < len(request):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(request[position : position + 1])
            position += 1
            stop.wait(1.0)

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        eventually(lambda: server.connections == SLOW, 10, "every slow connection accepted")
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        body = json.dumps(_args(api, _pod([PVC_A]), by_name=True, names=["n1", "n2"]))
        conn.request("POST", "/pffs/prioritize", body=body)
        response = conn.getresponse()
        answer = json.loads(response.read())
        # Answered with every slow connection still held (none has sent its whole request
        # yet, nor been cut off at its deadline): it waited for none of them.
        assert server.connections >= SLOW
        conn.close()
        assert response.status == 200
        assert answer == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}]
        # What makes it deterministic: the slow connections hold no thread (the answer
        # waits for no one of them); only the extender's few workers exist.
        assert threading.active_count() <= threads_before + 1 + server.limits.workers + 1
        # Each slow connection is cut off at its request's deadline, though it still trickles.
        deadline = time.monotonic() + REQUEST_SECONDS + 5
        for sock in slow:
            assert _closed_by_server(sock, max(0.1, deadline - time.monotonic()))
        assert server.connections == 0
    finally:
        stop.set()
        trickler.join()
        for sock in slow:
            sock.close()


def test_connections_over_the_cap_are_closed_at_once() -> None:
    limits = HttpLimits(max_connections=3)
    server = make_server(Extender(None), "127.0.0.1:0", "", limits)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        held = [_connect(server) for _ in range(3)]
        eventually(lambda: server.connections == 3, 10, "three connections accepted")
        extra = _connect(server)
        assert _closed_by_server(extra, 5)
        held[0].close()
        eventually(lambda: server.connections < 3, 10, "a held connection's close seen")
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200  # a freed slot serves again
        conn.close()
        for sock in [*held[1:], extra]:
            sock.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_body_over_its_cap_is_refused_unread(served: tuple[FakeApiServer, HttpServer]) -> None:
    _, server = served
    with _connect(server) as sock:
        sock.sendall(
            b"POST /pffs/filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % (server.limits.max_body_bytes + 1)
        )
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"larger than" in answer
    # The deployed pod's limit is 256 Mi: bodies being received take a quarter at most.
    assert server.limits.body_budget <= 64 << 20
    assert server.limits.max_body_bytes <= server.limits.body_budget

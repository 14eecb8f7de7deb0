"""The peer server's caps over real sockets (pffs.group.server, the handler of
tests/group/test_protocol.py): one address holds at most MAX_PER_ADDRESS connections, while
another address is still served; a connection that sends nothing is closed after
FIRST_REQUEST; the refusal log stays within its global rate however many addresses and
reasons there are."""

from __future__ import annotations

import logging
import socket
import time

import h11
import pytest
import trio

from pffs.group import server as server_module
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.protocol import BlockRequest
from pffs.group.server import PeerServer
from tests.group.test_protocol import BLOCKS, DATA, SECRET, serve_and
from tests.waiting import eventually


def _connect(url: str, source: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect((host, int(port)))
    return sock


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_one_address_holds_at_most_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "MAX_PER_ADDRESS", 4)
    one_request = PeerServer._one_request
    waiting: list[str] = []  # the address of each connection counted and waiting for a request

    async def counted(
        self: PeerServer, conn: h11.Connection, stream: trio.SocketStream, peer: str, wait: float
    ) -> bool:
        waiting.append(peer)
        return await one_request(self, conn, stream, peer, wait)

    monkeypatch.setattr(PeerServer, "_one_request", counted)

    def crowd(url: str) -> tuple[list[bool], bool]:
        held = [_connect(url, "127.0.0.3") for _ in range(4)]
        eventually(lambda: waiting.count("127.0.0.3") == 4, what="the four accepted and counted")
        extra = _connect(url, "127.0.0.3")
        refused = _closed(extra, 2.0)
        kept = [not _closed(sock, 0.05) for sock in held]
        for sock in [*held, extra]:
            sock.close()
        return kept, refused

    async def check(member: Member) -> tuple[list[bool], bool, bytes]:
        kept, refused = await trio.to_thread.run_sync(crowd, member.url)
        # another address (the client's 127.0.0.1) is served meanwhile
        data = await PeerClient(SECRET, "asker").get(member, BlockRequest(BLOCKS, 0))
        return kept, refused, data

    kept, refused, data = serve_and(check)
    assert kept == [True] * 4 and refused
    assert data == DATA[:4096]


def test_a_silent_connection_is_closed_after_the_first_request_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "FIRST_REQUEST", 0.3)

    def silent(url: str) -> float:
        sock = _connect(url, "127.0.0.1")
        started = time.monotonic()
        assert _closed(sock, 5.0)
        sock.close()
        return time.monotonic() - started

    async def check(member: Member) -> float:
        return await trio.to_thread.run_sync(silent, member.url)

    # Not before its wait; never closed would fail `_closed` (5 s) above.
    assert serve_and(check) >= 0.2


def test_refusals_are_logged_within_one_global_rate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server_module, "REFUSAL_LOG_BURST", 5)

    def unsigned(url: str) -> None:
        for n in range(40):  # 8 addresses, each request with its own made-up member name
            sock = _connect(url, f"127.0.0.{2 + n % 8}")
            sock.sendall(f"GET /v3/block HTTP/1.1\r\nhost: x\r\nx-pffs-from: n{n}\r\n\r\n".encode())
            sock.recv(100)
            sock.close()

    async def check(member: Member) -> None:
        await trio.to_thread.run_sync(unsigned, member.url)

    with caplog.at_level(logging.WARNING, logger="pffs.group"):
        serve_and(check)
    lines = [r for r in caplog.records if "refused a request" in r.getMessage()]
    # one line per address and reason however many names they claim, 5 in all for 8 of them
    assert len(lines) == 5, [r.getMessage() for r in lines]
    assert len({r.getMessage().split(" (")[0] for r in lines}) == 5


def test_a_head_that_trickles_is_cut_off_at_the_request_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head's clock starts at its first byte: sending a byte now and then (never idle long
    enough for the first request's wait) does not keep a connection."""
    monkeypatch.setattr(server_module, "REQUEST_TIME", 0.5)

    def trickle(url: str) -> float:
        sock = _connect(url, "127.0.0.1")
        started = time.monotonic()
        try:
            for byte in b"GET /v3/block?s=a HTTP/1.1\r\n" * 10:
                sock.sendall(bytes([byte]))
                if _closed(sock, 0.1):
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.close()
        return time.monotonic() - started

    async def check(member: Member) -> float:
        return await trio.to_thread.run_sync(trickle, member.url)

    # Kept, the trickle would take its 28 s; a loaded machine's delay is well within 15.
    assert 0.4 <= serve_and(check) < 15.0

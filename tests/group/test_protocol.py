"""The peer protocol over real HTTP on 127.0.0.1: the h11 server (pffs.group.server) and the
urllib3 client (pffs.group.client) in one process, the server handed a block handler of its own
(no cache): a signed request gets its block over a kept-alive connection; an unsigned one, a
request of another secret, a malformed request or target is refused, and nothing hangs."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TypeVar

import pytest
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.group import protocol
from pffs.group.client import PeerClient, PeerFailed, PeerMiss
from pffs.group.protocol import BadRequest, BlockRequest
from pffs.group.server import NotServed, PeerServer
from pffs.group.signing import Verifier

SECRET = b"a-shared-secret-of-the-group"
T = TypeVar("T")
BLOCKS = ObjectBlocks("s3://bucket", "alice", "d/f.bin", '"v1"', 10_000, 4096)
DATA = bytes(range(256)) * 40


async def handler(request: BlockRequest) -> bytes | None:
    if request.blocks.source != BLOCKS.source:
        raise NotServed("a source this member does not mount")
    if request.cached_only:
        return None
    start = request.blocks.start(request.index)
    return DATA[start : start + request.length]


def serve_and(check: Callable[[str], T]) -> T:
    """Run the server on 127.0.0.1 and `check(url)` in a worker thread."""

    async def main() -> T:
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        server = PeerServer(handler, Verifier(SECRET))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listener)
            result = await trio.to_thread.run_sync(check, f"http://127.0.0.1:{port}")
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main)


def test_blocks_over_one_kept_alive_connection() -> None:
    def check(url: str) -> list[bytes]:
        client = PeerClient(SECRET, "asker")
        got = [client.get(url, BlockRequest(BLOCKS, index)) for index in range(3)]
        pool = client._pool.connection_from_url(url)
        assert pool.num_connections == 1  # one connection carried all three
        with pytest.raises(PeerMiss):
            client.get(url, BlockRequest(BLOCKS, 0, cached_only=True))
        return got

    got = serve_and(check)
    assert got == [DATA[:4096], DATA[4096:8192], DATA[8192:10_000]]


def test_refusals() -> None:
    def check(url: str) -> list[str]:
        reasons = []
        for client, request in (
            (PeerClient(b"another-secret-entirely", "x"), BlockRequest(BLOCKS, 0)),
            (
                PeerClient(SECRET, "x"),
                BlockRequest(ObjectBlocks("s3://other", "alice", "f", "v", 9, 4), 0),
            ),
        ):
            with pytest.raises(PeerFailed) as failed:
                client.get(url, request)
            reasons.append(str(failed.value))
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"GET /v1/block HTTP/1.1\r\nHost: x\r\n\r\n")  # unsigned
            reasons.append(raw.recv(100).split(b"\r\n")[0].decode())
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"\x00\x01garbage\r\n\r\n")
            reasons.append(raw.recv(100).split(b"\r\n")[0].decode())
        return reasons

    assert serve_and(check) == [
        "HTTP 403",
        "source not served there",
        "HTTP/1.1 403 ",
        "HTTP/1.1 400 ",
    ]


@pytest.mark.parametrize(
    "target",
    [
        "/v1/other?s=a",
        "/v1/block?s=a&p=f&v=e&i=3&n=10&b=4",  # no block 3 of 10 bytes in 4-byte blocks
        "/v1/block?s=a&p=f&v=e&i=0&n=10&b=4&s=b",
        "/v1/block?s=a&p=f&v=e&i=x&n=10&b=4",
        "/v1/block?" + "s=a&" * 5000,
    ],
)
def test_bad_targets(target: str) -> None:
    with pytest.raises(BadRequest):
        protocol.parse_target(target)

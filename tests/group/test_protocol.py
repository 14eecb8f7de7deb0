"""The peer protocol over real HTTP on 127.0.0.1: the h11 server (pffs.group.server) and the
h11 client on trio (pffs.group.client) in one process, the server handed a block handler of its own
(no cache): a signed request gets its block over a kept-alive connection; an unsigned one, a
request of another secret, a malformed request or target is refused, and nothing hangs."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import crc32c
import pytest
import trio
import urllib3

from pffs.cache.keys import ObjectBlocks
from pffs.cache.pieces import Pieces
from pffs.group import protocol, signing, stats
from pffs.group import server as server_module
from pffs.group.client import PeerAskSecond, PeerClient, PeerFailed, PeerMiss, Timeouts
from pffs.group.members import Member
from pffs.group.protocol import BadRequest, BlockRequest
from pffs.group.server import AskSecond, NotServed, PeerServer
from pffs.group.signing import Signed, Verifier

SECRET = b"a-shared-secret-of-the-group"
MEMBER = "member"
T = TypeVar("T")
BLOCKS = ObjectBlocks("s3://bucket", "alice", "d/f.bin", '"v1"', 10_000, 4096)
DATA = bytes(range(256)) * 40


# The blocks of STREAMED come in pieces: the first half at once, the rest once `released`
# (or after 10 s: then the first half was not sent before the rest was in), or its fetch
# fails after the first half (index 1) or before any byte (index 2).
STREAMED = ObjectBlocks("s3://bucket", "alice", "d/streamed.bin", '"v1"', 3 * 4096, 4096)
released = threading.Event()
waited_out: list[bool] = []


async def handler(request: BlockRequest, signed: Signed) -> bytes | Pieces | None:
    if request.blocks.source != BLOCKS.source:
        raise NotServed("a source this member does not mount")
    if request.cached_only:
        return None
    if request.blocks.path == "d/hot.bin" and not request.forwarded:
        raise AskSecond("hot")
    start = request.blocks.start(request.index)
    data = DATA[start : start + request.length]
    if request.blocks.path != STREAMED.path:
        return data
    pieces = Pieces(len(data))

    async def produce() -> None:
        if request.index == 2:
            pieces.fail(OSError("the store is down"))
            return
        pieces.add(data[:2048])
        if request.index == 1:
            await trio.sleep(0)
            pieces.fail(OSError("the store went away"))
            return
        waited_out.append(not await trio.to_thread.run_sync(released.wait, 10))
        pieces.finish(data)

    trio.lowlevel.spawn_system_task(produce)
    return pieces


def serve_and(check: Callable[[Member], Awaitable[T]]) -> T:
    """Run the server of member MEMBER on 127.0.0.1 and `check(member)` beside it, in the same
    trio run."""

    async def main() -> T:
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        server = PeerServer(handler, Verifier(SECRET, MEMBER))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listener)
            result = await check(Member(MEMBER, f"http://127.0.0.1:{port}"))
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main)


def test_blocks_over_one_kept_alive_connection() -> None:
    async def check(member: Member) -> list[bytes]:
        client = PeerClient(SECRET, "asker")
        got = [await client.get(member, BlockRequest(BLOCKS, index)) for index in range(3)]
        assert client.connections_opened == 1  # one connection carried all three
        with pytest.raises(PeerMiss):
            await client.get(member, BlockRequest(BLOCKS, 0, cached_only=True))
        return got

    got = serve_and(check)
    assert got == [DATA[:4096], DATA[4096:8192], DATA[8192:10_000]]


def test_a_block_is_streamed_as_it_arrives() -> None:
    """The first half of a block reaches the asker before the owner has the rest; a fetch
    failing mid-block closes the connection (a short body), one failing first answers 503."""

    def read_streamed(url: str) -> tuple[bytes, bytes]:
        target = BlockRequest(STREAMED, 0).target()
        response = urllib3.PoolManager().request(
            "GET",
            url + target,
            headers=signing.sign(SECRET, "GET", target, MEMBER),
            preload_content=False,
        )
        assert response.headers["content-length"] == str(4096 + protocol.FOOTER.size)
        first = response.read(2048)
        released.set()
        return first, response.read()

    async def check(member: Member) -> tuple[bytes, bytes, list[str]]:
        first, rest = await trio.to_thread.run_sync(read_streamed, member.url)
        client = PeerClient(SECRET, "asker")
        failures = []
        for index in (1, 2):
            with pytest.raises(PeerFailed) as failed:
                await client.get(member, BlockRequest(STREAMED, index))
            failures.append(str(failed.value))
        return first, rest, failures

    first, rest, failures = serve_and(check)
    assert waited_out == [False]
    body = first + rest
    assert body[: -protocol.FOOTER.size] == DATA[:4096]
    assert protocol.FOOTER.unpack(body[-protocol.FOOTER.size :])[0] == crc32c.crc32c(DATA[:4096])
    assert failures == ["short body", "the owner's store failed"]


def test_a_hot_block_is_sent_to_its_second_copy() -> None:
    """A 307 is PeerAskSecond; the same request forwarded gets the block."""
    hot = ObjectBlocks("s3://bucket", "alice", "d/hot.bin", '"v1"', 4096, 4096)

    async def check(member: Member) -> bytes:
        client = PeerClient(SECRET, "asker")
        with pytest.raises(PeerAskSecond):
            await client.get(member, BlockRequest(hot, 0))
        return await client.get(member, BlockRequest(hot, 0, forwarded=True))

    assert serve_and(check) == DATA[:4096]


def test_refusals() -> None:
    def raw_requests(url: str) -> list[str]:
        reasons = []
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"GET /v3/block HTTP/1.1\r\nHost: x\r\n\r\n")  # unsigned
            reasons.append(raw.recv(100).split(b"\r\n")[0].decode())
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"\x00\x01garbage\r\n\r\n")
            reasons.append(raw.recv(100).split(b"\r\n")[0].decode())
        return reasons

    async def check(member: Member) -> list[str]:
        reasons = []
        for client, request in (
            (PeerClient(b"another-secret-entirely", "x"), BlockRequest(BLOCKS, 0)),
            (
                PeerClient(SECRET, "x"),
                BlockRequest(ObjectBlocks("s3://other", "alice", "f", "v", 9, 4), 0),
            ),
        ):
            with pytest.raises(PeerFailed) as failed:
                await client.get(member, request)
            reasons.append(str(failed.value))
        return reasons + await trio.to_thread.run_sync(raw_requests, member.url)

    assert serve_and(check) == [
        "HTTP 403",
        "source not served there",
        "HTTP/1.1 403 ",
        "HTTP/1.1 400 ",
    ]


@pytest.mark.parametrize(
    "target",
    [
        "/v3/other?s=a",
        "/v3/block?s=a&p=f&v=e&i=3&n=10&b=4",  # no block 3 of 10 bytes in 4-byte blocks
        "/v3/block?s=a&p=f&v=e&i=0&n=10&b=4&s=b",
        "/v3/block?s=a&p=f&v=e&i=x&n=10&b=4",
        "/v3/block?" + "s=a&" * 5000,
        "/v3/block?s=a&a=b&p=f&v=e&i=0&n=10&b=4&c=1&f=1&x=1&y=2",  # more fields than a block's
        # paths outside the source: absolute, `..`, empty or `.` parts, a NUL
        "/v3/block?s=a&a=b&p=%2Fetc%2Fshadow&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=d%2F..%2F..%2Fx&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=..&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=d%2F%2Fx&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=d%2F.%2Fx&v=e&i=0&n=10&b=4",
        "/v3/block?s=a&a=b&p=d%00x&v=e&i=0&n=10&b=4",
    ],
)
def test_bad_targets(target: str) -> None:
    with pytest.raises(BadRequest):
        protocol.parse_target(target)


@pytest.mark.parametrize(
    "path", ["d/f.bin", "a b+c&d=e%f?g#h/ü €.bin", "+", "%41", "=&="], ids=repr
)
def test_a_target_names_the_block_it_was_made_for(path: str) -> None:
    blocks = ObjectBlocks("s3://bucket@http://h:9000/", "k=1&2", path, '"e+1"', 10_000, 4096)
    for request in (
        BlockRequest(blocks, 2),
        BlockRequest(blocks, 0, cached_only=True),
        BlockRequest(blocks, 1, forwarded=True),
    ):
        assert protocol.parse_target(request.target()) == request


def test_a_trickling_peer_is_cut_off_at_the_whole_block_timeout() -> None:
    """A peer that keeps sending, one byte at a time, never long enough apart for the
    first-byte timeout: the whole block's timeout ends the request (a stand-in for a slow or
    malicious peer on a raw socket; no pffs member answers so)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    request = BlockRequest(BLOCKS, 0)

    def trickle() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            head = (
                "HTTP/1.1 200 OK\r\n"
                f"{protocol.VERSION}: {BLOCKS.version}\r\n"
                f"content-length: {request.length + protocol.FOOTER.size}\r\n\r\n"
            )
            connection.sendall(head.encode())
            while not stop.wait(0.02):
                try:
                    connection.sendall(b"x")
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    client = PeerClient(SECRET, "asker", Timeouts(connect=0.5, first_byte=2.0, whole=0.3))
    outcome: list[str] = []

    async def ask() -> None:
        with trio.move_on_after(20):  # a bound for a failing run only: 80 s to trickle
            try:
                member = Member(MEMBER, f"http://127.0.0.1:{listener.getsockname()[1]}")
                await client.get(member, request)
            except PeerFailed as exc:
                outcome.append(str(exc))

    trio.run(ask)
    stop.set()
    listener.close()
    assert outcome == ["block too slow"]


def test_a_connection_the_member_closed_while_idle_is_not_used(monkeypatch) -> None:
    """The server closes an idle kept-alive connection: the next request finds it closed
    before sending and opens another (no failure, nothing told to a breaker)."""
    monkeypatch.setattr(server_module, "IDLE", 0.2)
    connection = PeerServer._connection
    ended: list[bool] = []

    async def counted(self: PeerServer, stream: trio.SocketStream) -> None:
        await connection(self, stream)
        ended.append(True)

    monkeypatch.setattr(PeerServer, "_connection", counted)

    async def check(member: Member) -> list[bytes]:
        client = PeerClient(SECRET, "asker")
        first = await client.get(member, BlockRequest(BLOCKS, 0))
        with trio.fail_after(30):  # past the server's IDLE, however late: it closed the connection
            while not ended:
                await trio.sleep(0.01)
        second = await client.get(member, BlockRequest(BLOCKS, 1))
        assert client.connections_opened == 2
        return [first, second]

    assert serve_and(check) == [DATA[:4096], DATA[4096:8192]]


def reply_head(data: bytes) -> bytes:
    """A member's reply head for `data` of BLOCKS, as a raw socket standing in for one sends it."""
    return (
        "HTTP/1.1 200 OK\r\n"
        f"{protocol.VERSION}: {BLOCKS.version}\r\n"
        f"content-length: {len(data) + protocol.FOOTER.size}\r\n\r\n"
    ).encode()


def test_a_request_on_a_connection_closed_as_it_was_sent_is_sent_again() -> None:
    """A member (a raw socket standing in for one) answers one request, then closes the same
    connection when the next arrives, unanswered: the client sends that request once more, on
    a new connection, and gets its block."""
    request = BlockRequest(BLOCKS, 0)
    data = DATA[:4096]
    head = reply_head(data)
    listener = socket.create_server(("127.0.0.1", 0))
    served = []

    def fake_member() -> None:
        for replies in (1, 1):
            connection, _ = listener.accept()
            with connection:
                for _ in range(replies):
                    nonce = nonce_of(connection.recv(65536))
                    served.append(1)  # before the reply: the client may check as soon as it has it
                    connection.sendall(head + data + tagged_footer(data, nonce))
                connection.recv(65536)  # the next request: closed unanswered

    thread = threading.Thread(target=fake_member, daemon=True)
    thread.start()
    client = PeerClient(SECRET, "asker")
    member = Member(MEMBER, f"http://127.0.0.1:{listener.getsockname()[1]}")

    async def ask_twice() -> None:
        assert await client.get(member, request) == data
        assert await client.get(member, request) == data

    try:
        trio.run(ask_twice)
    finally:
        listener.close()
    assert client.connections_opened == 2 and len(served) == 2


def nonce_of(request: bytes) -> str:
    """The nonce of a raw request's head."""
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == signing.NONCE.encode():
            return value.strip().decode()
    raise AssertionError("no nonce")


def tagged_footer(data: bytes, nonce: str) -> bytes:
    """What a member holding SECRET sends after `data` (a block of BLOCKS) for `nonce`."""
    crc = crc32c.crc32c(data)
    return protocol.FOOTER.pack(
        crc, signing.reply_tag(SECRET, nonce, MEMBER, BLOCKS.version, len(data), crc)
    )


def test_a_signed_target_of_too_many_fields_is_refused_and_the_server_goes_on() -> None:
    """A member with the secret sending a target of 11 fields gets a 400; the server then
    serves the next request (parse_qs's bare ValueError once escaped the server's task)."""

    def too_many_fields(url: str) -> int:
        target = BlockRequest(BLOCKS, 0).target() + "&w=0&x=1&y=2&z=3"
        host, port = url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=5)
        connection.request("GET", target, headers=signing.sign(SECRET, "GET", target, MEMBER))
        status = connection.getresponse().status
        connection.close()
        return status

    async def check(member: Member) -> tuple[int, bytes]:
        status = await trio.to_thread.run_sync(too_many_fields, member.url)
        return status, await PeerClient(SECRET, "asker").get(member, BlockRequest(BLOCKS, 0))

    assert serve_and(check) == (400, DATA[:4096])


@pytest.mark.parametrize("forge", ["no tag", "another secret", "another nonce", "another member"])
def test_a_reply_without_the_right_tag_is_refused(forge: str) -> None:
    """A raw socket at the member's address answers the block with the right bytes, version,
    length and CRC32C, but a tag it cannot make (zeros, another secret's, another request's,
    another member's): the asker refuses it and counts it."""
    request = BlockRequest(BLOCKS, 0)
    data = DATA[:4096]
    head = reply_head(data)
    listener = socket.create_server(("127.0.0.1", 0))

    def forger() -> None:
        connection, _ = listener.accept()
        with connection:
            nonce = nonce_of(connection.recv(65536))
            crc = crc32c.crc32c(data)
            secret, name = SECRET, MEMBER
            if forge == "another secret":
                secret = b"not-the-group-secret-at-all"
            elif forge == "another nonce":
                nonce = "0" * 32
            elif forge == "another member":
                name = "someone-else"
            tag = signing.reply_tag(secret, nonce, name, BLOCKS.version, len(data), crc)
            if forge == "no tag":
                tag = bytes(signing.TAG_SIZE)
            connection.sendall(head + data + protocol.FOOTER.pack(crc, tag))

    threading.Thread(target=forger, daemon=True).start()
    client = PeerClient(SECRET, "asker")
    member = Member(MEMBER, f"http://127.0.0.1:{listener.getsockname()[1]}")
    before = stats.UNAUTHENTICATED_REPLIES._value.get()
    outcome: list[str] = []

    async def ask() -> None:
        try:
            await client.get(member, request)
        except PeerFailed as exc:
            outcome.append(str(exc))

    try:
        trio.run(ask)
    finally:
        listener.close()
    assert outcome == ["reply not authenticated"]
    assert stats.UNAUTHENTICATED_REPLIES._value.get() == before + 1

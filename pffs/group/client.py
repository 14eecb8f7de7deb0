"""Asking a peer for a block: one signed GET through h11 on trio's own sockets, over a
kept-alive connection, with the reply checked before anyone uses it.

Why in the trio task and not a worker thread: a block asked through a blocking client
(http.client, as before) took a hop to a worker thread and back per request (a queue, a futex
wake, trio's wakeup socket), the largest named part of the asker's CPU per hit
(docs/notes/cache-group.md, "The peer path's CPU"). h11 parses; this module
only moves bytes between it and the socket. Each member has a small stack of idle connections;
a request takes one (a stale one, which the member closed while it was idle, is dropped first),
and gives it back once the reply was read whole. A request on a reused connection that fails
before any reply (the member closed it just then) is sent once more on a new connection: a
block request changes nothing at the member.

Timeouts are short and apart from the store's: `connect`, `first_byte` (and any later pause
between bytes) and `whole` for the block. The body is read as the owner sends it (the block,
then its CRC32C: pffs.group.protocol) and checked once whole. Every way a reply can be wrong
raises `PeerFailed` with a short reason: a refused or timed-out connection, a status other
than 200, a version, length or CRC32C that is not the one asked for, a reply whose tag
(pffs.group.signing.reply_tag: the group's HMAC of the request's nonce, the member's name, the
version, length and CRC32C) does not match, counted in `pffs_group_unauthenticated_replies`:
something answering at a member's address without the group's secret gives no bytes. Each
request is signed for the member it goes to, with its principal's proof (`proof_key`). A 404
to a cached-only request is `PeerMiss`, a 503 `PeerStoreFailed` (the owner's store failed it), a 307
`PeerAskSecond` (a hot block: pffs.group.hot), a 421 `PeerNotServed` (the peer does not serve
that source): the peer is fine in all four. Used from the trio tasks of one run (`close` also
after it).
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import crc32c
import h11
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.group import protocol, signing, stats
from pffs.group.members import Member
from pffs.group.protocol import BlockRequest

CHUNK = 256 * 1024
MAX_IDLE = 16  # idle connections kept per member
MAX_MEMBERS = 256  # members with idle connections kept (past it, all are closed)
MAX_HEAD = 16 * 1024  # a reply's head (h11 refuses a longer one)

# The key that proves the principal a request reads as (pffs.group.principals), or None
# when this process cannot prove it (its blocks are then never asked of peers).
ProofKey = Callable[[ObjectBlocks], bytes | None]


def no_proof(blocks: ObjectBlocks) -> bytes | None:
    return None


@dataclass(frozen=True)
class Timeouts:
    connect: float = 0.5
    # The owner answers once the block's first bytes are in: a store GET's first byte (or
    # joining one) fits in this.
    first_byte: float = 5.0
    whole: float = 15.0


class PeerFailed(Exception):
    """The peer did not give the block: fetch it from the store."""


class PeerMiss(PeerFailed):
    """A cached-only request for a block the peer does not hold."""


class PeerAskSecond(PeerFailed):
    """The owner of a hot block sends this request to its second copy (307): the peer is fine."""


class PeerNotServed(PeerFailed):
    """The peer does not serve the block's source (421: not mounted there): the peer is fine."""


class PeerStoreFailed(PeerFailed):
    """The peer answered, but could not get the block from the store (503): the peer is fine."""


class _Stale(Exception):
    """A reused connection failed before any reply: the member had closed it."""


class _Connection:
    """One kept-alive connection to a member: its socket and h11's view of it."""

    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)

    def close(self) -> None:
        """At once (no checkpoint: also from a cancelled task), and also after the run ended."""
        if trio.lowlevel.in_trio_run():
            self.stream.socket.close()
        else:  # no run to tell: nothing waits on the socket either
            os.close(self.stream.socket.detach())

    def reusable(self) -> bool:
        """After a reply read whole: whether both sides may go on (then it is ready)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


class PeerClient:
    """Signed block requests to any member, over kept-alive connections."""

    def __init__(
        self,
        secret: bytes,
        self_name: str,
        timeouts: Timeouts = Timeouts(),
        proof_key: ProofKey = no_proof,
    ) -> None:
        self._secret = secret
        self._self = self_name
        self.timeouts = timeouts
        self.proof_key = proof_key
        self._idle: dict[str, list[_Connection]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}
        self.connections_opened = 0  # for the tests: kept-alive connections are reused

    async def get(self, member: Member, request: BlockRequest) -> bytes:
        """The block `request` names from `member`."""
        target = request.target()
        url = member.url
        try:
            return await self._get(member, target, request, self._take(url))
        except _Stale:  # once, on a new connection
            return await self._get(member, target, request, None)

    async def _get(
        self, member: Member, target: str, request: BlockRequest, reused: _Connection | None
    ) -> bytes:
        url = member.url
        deadline = trio.current_time() + self.timeouts.whole
        conn = reused if reused is not None else await self._connect(url)
        try:
            data = await self._exchange(conn, member, target, request, deadline, reused is not None)
        except BaseException:
            conn.close()  # in an unknown state (or cancelled mid-way): not back to the pool
            raise
        if conn.reusable():
            self._give_back(url, conn)
        else:
            conn.close()
        return data

    async def _exchange(
        self,
        conn: _Connection,
        member: Member,
        target: str,
        request: BlockRequest,
        deadline: float,
        reused: bool,
    ) -> bytes:
        host = self._addresses[member.url][0]
        headers = [("host", host), ("x-pffs-from", self._self)]
        signed = signing.sign(
            self._secret, "GET", target, member.name, self.proof_key(request.blocks)
        )
        headers += signed.items()
        wire = conn.h11.send(h11.Request(method="GET", target=target, headers=headers))
        try:
            await conn.stream.send_all(wire + (conn.h11.send(h11.EndOfMessage()) or b""))
            response = await self._next(conn, deadline)
        except PeerFailed:
            raise  # a timeout: never sent again
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            if reused:
                raise _Stale from None
            raise PeerFailed("connection broken") from None
        if not isinstance(response, h11.Response):
            raise PeerFailed("connection broken")
        data, footer = await self._body(conn, response, request, deadline)
        crc, tag = protocol.FOOTER.unpack(footer)
        if crc != crc32c.crc32c(data):
            raise PeerFailed("CRC32C mismatch")
        expected = signing.reply_tag(
            self._secret, signed[signing.NONCE], member.name, request.blocks.version, len(data), crc
        )
        if not signing.tags_match(expected, tag):
            stats.UNAUTHENTICATED_REPLIES.inc()
            raise PeerFailed("reply not authenticated")
        return data

    async def _next(self, conn: _Connection, deadline: float) -> h11.Event:
        """h11's next event of the reply, past any 1xx (receiving as needed)."""
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                conn.h11.receive_data(await self._receive(conn, deadline))
            elif not isinstance(event, h11.InformationalResponse):
                return event  # type: ignore[return-value]

    async def _receive(self, conn: _Connection, deadline: float) -> bytes:
        """What the socket has (b"" at its end), within `first_byte` and the block's deadline."""
        now = trio.current_time()
        with trio.move_on_at(min(deadline, now + self.timeouts.first_byte)):
            return await conn.stream.receive_some(CHUNK)
        raise PeerFailed("block too slow" if trio.current_time() >= deadline else "timed out")

    async def _connect(self, url: str) -> _Connection:
        address = self._addresses.get(url)
        if address is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise PeerFailed("not an http:// member URL")
            address = self._addresses[url] = (parts.hostname, parts.port or 80)
        with trio.move_on_after(self.timeouts.connect):
            try:
                stream = await trio.open_tcp_stream(*address)
            except OSError:
                raise PeerFailed("connection refused") from None
            self.connections_opened += 1
            return _Connection(stream)
        raise PeerFailed("connect timed out")

    def _take(self, url: str) -> _Connection | None:
        """An idle connection to `url` the member has not closed, or None."""
        idle = self._idle.get(url)
        while idle:
            conn = idle.pop()
            if not _readable(conn.stream.socket.fileno()):
                return conn
            conn.close()  # closed by the member (readable: its EOF), or unasked-for bytes
        return None

    def _give_back(self, url: str, conn: _Connection) -> None:
        idle = self._idle.get(url)
        if idle is None:
            if len(self._idle) >= MAX_MEMBERS:
                self.close()
            idle = self._idle[url] = []
        if len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            conn.close()

    async def _body(
        self, conn: _Connection, response: h11.Response, request: BlockRequest, deadline: float
    ) -> tuple[bytes, bytes]:
        """The block and its footer, once the status, version and length are the ones asked."""
        status = response.status_code
        if status == 404 and request.cached_only:
            raise PeerMiss("not held")
        if status == 307:
            raise PeerAskSecond("hot: ask the second copy")
        if status == 421:
            raise PeerNotServed("source not served there")
        if status == 503:
            raise PeerStoreFailed("the owner's store failed")
        if status != 200:
            raise PeerFailed(f"HTTP {status}")
        headers = dict(response.headers)
        version = headers.get(protocol.VERSION.encode(), b"").decode("latin-1")
        if version != request.blocks.version:
            raise PeerFailed("another version")
        expected = request.length
        wanted = expected + protocol.FOOTER.size
        if headers.get(b"content-length") != str(wanted).encode():
            raise PeerFailed("wrong length")
        pieces: list[bytes | memoryview] = []
        try:
            while True:  # h11 holds the body to its Content-Length: a short one is an error
                event = await self._next(conn, deadline)
                if isinstance(event, h11.Data):
                    pieces.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise PeerFailed("connection broken")
        except h11.RemoteProtocolError:  # a Content-Length body's only one: it ended early
            raise PeerFailed("short body") from None
        except trio.BrokenResourceError:
            raise PeerFailed("connection broken") from None
        return _split_footer(pieces, protocol.FOOTER.size)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _split_footer(pieces: list[bytes | memoryview], size: int) -> tuple[bytes, bytes]:
    """The body's pieces joined, less its last `size` bytes, and those bytes: the block is
    copied once (the footer may straddle the last two pieces; the one it cuts stays a view)."""
    footer = b""
    while len(footer) < size:
        last = pieces.pop()
        cut = len(last) - (size - len(footer))
        footer = bytes(last[max(cut, 0) :]) + footer
        if cut > 0:
            pieces.append(memoryview(last)[:cut])
    return b"".join(pieces), footer


def _readable(fd: int) -> bool:
    """Whether an idle connection has something to read: the member closed it (or sent what
    no request asked for); either way it is not used again."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))

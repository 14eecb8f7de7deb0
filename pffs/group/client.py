"""Asking a peer for a block: one signed GET over a kept-alive connection (the standard
library's http.client), in a worker thread, with the reply checked before anyone uses it.

Why http.client and not urllib3's pool (which wraps it): urllib3 adds a URL parse and a
character-by-character percent-encoding check of every target, retry and timeout objects, and
a response wrapper around every read, which together cost the asker more than half its CPU per
block (docs/notes/cache-group.md, "the peer path's CPU"). Here each member has a small stack of
idle connections; a request takes one (a stale one, which the member closed while it was idle,
is dropped first), and gives it back once the reply's body was read whole. A request on a
reused connection that fails before any reply (the member closed it just then) is sent once
more on a new connection: a block request changes nothing at the member.

Timeouts are short and apart from the store's: `connect`, `first_byte` (and any later pause
between bytes) and `whole` for the block. The body is read as the owner sends it (the block,
then its CRC32C: pffs.group.protocol) and checked once whole. Every way a reply can be wrong
raises `PeerFailed` with a short reason: a refused or timed-out connection, a status other
than 200, a version, length or CRC32C that is not the one asked for. A 404 to a cached-only
request is `PeerMiss`, a 503 `PeerStoreFailed` (the owner's store failed it), a 307
`PeerAskSecond` (a hot block: pffs.group.hot), a 421 `PeerNotServed` (the peer does not serve
that source): the peer is fine in all four.
"""

from __future__ import annotations

import http.client
import select
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import crc32c

from pffs.group import protocol, signing
from pffs.group.protocol import BlockRequest

CHUNK = 256 * 1024
MAX_IDLE = 16  # idle connections kept per member
MAX_MEMBERS = 256  # members with idle connections kept (past it, all are closed)


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


class PeerClient:
    """Signed block requests to any member, over kept-alive connections."""

    def __init__(self, secret: bytes, self_name: str, timeouts: Timeouts = Timeouts()) -> None:
        self._secret = secret
        self._self = self_name
        self.timeouts = timeouts
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self.connections_opened = 0  # for the tests: kept-alive connections are reused

    def get(self, url: str, request: BlockRequest) -> bytes:
        """The block `request` names from the member at `url` (in a worker thread)."""
        target = request.target()
        try:
            return self._get(url, target, request, self._take(url))
        except _Stale:  # once, on a new connection
            return self._get(url, target, request, None)

    def _get(
        self,
        url: str,
        target: str,
        request: BlockRequest,
        reused: http.client.HTTPConnection | None,
    ) -> bytes:
        headers = signing.sign(self._secret, "GET", target)
        headers["x-pffs-from"] = self._self
        deadline = time.monotonic() + self.timeouts.whole
        conn = reused if reused is not None else self._connect(url)
        try:
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            if reused is not None and not isinstance(exc, TimeoutError):
                raise _Stale from None
            raise PeerFailed(_reason(exc)) from None
        try:
            data = self._body(response, request, deadline)
            response.close()  # read whole: the connection may carry the next request
        except BaseException:
            conn.close()  # the connection is in an unknown state: not back to the pool
            raise
        if response.will_close:
            conn.close()
        else:
            self._give_back(url, conn)
        return data

    def _connect(self, url: str) -> http.client.HTTPConnection:
        address = self._addresses.get(url)
        if address is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise PeerFailed("not an http:// member URL")
            address = self._addresses[url] = (parts.hostname, parts.port or 80)
        conn = http.client.HTTPConnection(*address, timeout=self.timeouts.connect)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise PeerFailed(
                "connection refused" if not isinstance(exc, TimeoutError) else "connect timed out"
            ) from None
        assert conn.sock is not None
        conn.sock.settimeout(self.timeouts.first_byte)  # and between any two receives
        self.connections_opened += 1
        return conn

    def _take(self, url: str) -> http.client.HTTPConnection | None:
        """An idle connection to `url` the member has not closed, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(url)
                if not idle:
                    return None
                conn = idle.pop()
            if conn.sock is not None and not _readable(conn.sock.fileno()):
                return conn
            conn.close()  # closed by the member (readable: its EOF), or unasked-for bytes

    def _give_back(self, url: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.get(url)
            if idle is None:
                if len(self._idle) >= MAX_MEMBERS:
                    self._close_idle()
                idle = self._idle[url] = []
            if len(idle) < MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def _body(
        self, response: http.client.HTTPResponse, request: BlockRequest, deadline: float
    ) -> bytes:
        if response.status == 404 and request.cached_only:
            raise PeerMiss("not held")
        if response.status == 307:
            raise PeerAskSecond("hot: ask the second copy")
        if response.status == 421:
            raise PeerNotServed("source not served there")
        if response.status == 503:
            raise PeerStoreFailed("the owner's store failed")
        if response.status != 200:
            raise PeerFailed(f"HTTP {response.status}")
        if response.getheader(protocol.VERSION) != request.blocks.version:
            raise PeerFailed("another version")
        expected = request.length
        wanted = expected + protocol.FOOTER.size
        if response.getheader("content-length") != str(wanted):
            raise PeerFailed("wrong length")
        pieces: list[bytes] = []
        got = 0
        try:
            while got < wanted:
                # At most what one receive gives, so the whole-block deadline holds against a
                # peer that trickles (read(n) waits for all n bytes).
                piece = response.read1(min(CHUNK, wanted - got))
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
                if time.monotonic() > deadline:
                    raise PeerFailed("block too slow")
        except (http.client.HTTPException, OSError) as exc:
            raise PeerFailed(_reason(exc)) from None
        if got != wanted:
            raise PeerFailed("short body")
        body = b"".join(pieces)
        data = memoryview(body)[:expected]
        if protocol.FOOTER.unpack_from(body, expected)[0] != crc32c.crc32c(data):
            raise PeerFailed("CRC32C mismatch")
        return body[:expected]

    def close(self) -> None:
        with self._lock:
            self._close_idle()

    def _close_idle(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _readable(fd: int) -> bool:
    """Whether an idle connection has something to read: the member closed it (or sent what
    no request asked for); either way it is not used again."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _reason(exc: Exception) -> str:
    if isinstance(exc, http.client.IncompleteRead):  # the body ended before its length
        return "short body"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, (http.client.HTTPException, ConnectionError)):
        return "connection broken"
    return type(exc).__name__

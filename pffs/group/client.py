"""Asking a peer for a block: one signed GET over a kept-alive connection (urllib3), in a
worker thread, with the reply checked before anyone uses it.

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

import time
from dataclasses import dataclass

import crc32c
import urllib3

from pffs.group import protocol, signing
from pffs.group.protocol import BlockRequest

CHUNK = 256 * 1024


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


class PeerClient:
    """Signed block requests to any member, over a pool of kept-alive connections."""

    def __init__(self, secret: bytes, self_name: str, timeouts: Timeouts = Timeouts()) -> None:
        self._secret = secret
        self._self = self_name
        self.timeouts = timeouts
        self._pool = urllib3.PoolManager(
            num_pools=256,
            maxsize=16,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(connect=timeouts.connect, read=timeouts.first_byte),
        )

    def get(self, url: str, request: BlockRequest) -> bytes:
        """The block `request` names from the member at `url` (in a worker thread)."""
        target = request.target()
        headers = signing.sign(self._secret, "GET", target)
        headers["x-pffs-from"] = self._self
        deadline = time.monotonic() + self.timeouts.whole
        try:
            response = self._pool.request(
                "GET", url + target, headers=headers, preload_content=False, redirect=False
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise PeerFailed(_reason(exc)) from None
        try:
            data = self._body(response, request, deadline)
        except BaseException:
            response.close()  # the connection is in an unknown state: not back to the pool
            raise
        response.release_conn()
        return data

    def _body(
        self, response: urllib3.BaseHTTPResponse, request: BlockRequest, deadline: float
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
        version = response.headers.get(protocol.VERSION)
        if version != request.blocks.version:
            raise PeerFailed("another version")
        expected = request.length
        if response.headers.get("content-length") != str(expected + protocol.FOOTER.size):
            raise PeerFailed("wrong length")
        pieces: list[bytes] = []
        got, wanted = 0, expected + protocol.FOOTER.size
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
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise PeerFailed(_reason(exc)) from None
        body = b"".join(pieces)
        if len(body) != wanted:
            raise PeerFailed("short body")
        data, footer = body[:expected], body[expected:]
        crc = crc32c.crc32c(data)
        if protocol.FOOTER.unpack(footer)[0] != crc:
            raise PeerFailed("CRC32C mismatch")
        return data

    def close(self) -> None:
        self._pool.clear()


def _reason(exc: Exception) -> str:
    cause = (
        exc.args[1]
        if isinstance(exc, urllib3.exceptions.ProtocolError) and len(exc.args) > 1
        else exc
    )
    if isinstance(cause, urllib3.exceptions.IncompleteRead):  # the body ended before its length
        return "short body"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):  # before: it is a timeout too
        return "connection refused"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return "timed out"
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return "connection broken"
    return type(exc).__name__

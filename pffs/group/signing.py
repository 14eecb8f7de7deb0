"""Signed peer requests and authenticated replies: HMAC-SHA256 under the group's secret, and
under the key of the principal a request reads as.

A request's signature covers the method, the request target (path and query, which name the
block, its source and principal included), a timestamp, a random nonce and the name of the
member it is sent to; the secret never crosses the wire. A server refuses a request without
those headers, with a header not of its form (a decimal timestamp, hex nonce and signature of
their lengths: checked before anything is compared, and compared as bytes), with a timestamp
more than `MAX_SKEW` seconds away from its clock, sent to another member (a replay elsewhere),
with a nonce it has seen within that window (a replay), or with a signature that does not
match. Once `MAX_NONCES` nonces of the window are remembered, further requests are refused
until the oldest age out: a nonce is never forgotten while its request could still be replayed.

A second HMAC over the same message, `x-pffs-proof`, is keyed by the principal's key
(pffs.group.principals): only a holder of that principal's credential, or of the secret its
mounts were given, can make it; the owner checks it before it reads as that principal.

A reply carries a tag (`reply_tag`): an HMAC under the group's secret of the request's nonce,
the member's name, the block's version, length and CRC32C; the CRC32C covers the bytes, so the
tag costs one HMAC over a few dozen bytes, never the block twice. An asker refuses a reply
whose tag does not match: something that answers at a member's address without the secret
cannot give it bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from pffs.errors import UsageError

TIME = "x-pffs-time"
NONCE = "x-pffs-nonce"
SIGNATURE = "x-pffs-signature"
TO = "x-pffs-to"  # the member the request is for (signed: refused by any other)
PROOF = "x-pffs-proof"  # the principal's HMAC of the same message
MAX_SKEW = 30.0
MIN_SECRET = 16
MAX_SECRET = 4096
# Nonces remembered against replays (those older than MAX_SKEW are refused by their time); past
# it, requests are refused (not the oldest nonces forgotten) until some age out: 4,369 requests
# a second to one member at most (a 256 KiB block each: over 1 GiB/s), about 26 MB held.
MAX_NONCES = 131072
BUSY = "too many requests"  # the refusal of a full nonce window (the server answers 503)
MAX_NAME = 253  # a member's name: a DNS name at most
TAG_SIZE = 16  # a reply's tag: HMAC-SHA256 truncated to 128 bits

_REQUEST_DOMAIN = b"pffs peer request v3\n"
_REPLY_DOMAIN = b"pffs peer reply v3\n"
_STAMP = re.compile(r"[0-9]{1,12}\.[0-9]{3}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_REPLY_NUMBERS = struct.Struct(">QI")  # length, CRC32C


def read_secret(path: str, option: str = "--group-secret-file") -> bytes:
    """The secret in `path` (surrounding whitespace dropped), or a one-line error."""
    try:
        with open(path, "rb") as f:
            secret = f.read(MAX_SECRET + 1).strip()
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None
    if len(secret) > MAX_SECRET:
        raise UsageError(f"{option} {path}: longer than {MAX_SECRET} bytes")
    if len(secret) < MIN_SECRET:
        raise UsageError(f"{option} {path}: the secret needs {MIN_SECRET} bytes or more")
    return secret


def _message(method: str, target: str, stamp: str, nonce: str, to: str) -> bytes:
    text = "\n".join((method, target, stamp, nonce, to))
    return _REQUEST_DOMAIN + text.encode("utf-8", "surrogateescape")


def _mac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(
    secret: bytes, method: str, target: str, to: str, principal_key: bytes | None = None
) -> dict[str, str]:
    """The headers that sign `method target` now, for member `to`; with the principal's proof
    when its key is given."""
    stamp = f"{time.time():.3f}"
    nonce = secrets.token_hex(16)
    message = _message(method, target, stamp, nonce, to)
    headers = {TIME: stamp, NONCE: nonce, TO: to, SIGNATURE: _mac(secret, message)}
    if principal_key is not None:
        headers[PROOF] = _mac(principal_key, message)
    return headers


def reply_tag(secret: bytes, nonce: str, member: str, version: str, length: int, crc: int) -> bytes:
    """The tag a reply of `member` to the request `nonce` carries after the block's CRC32C."""
    message = b"\n".join(
        (
            _REPLY_DOMAIN + nonce.encode(),
            member.encode("utf-8", "surrogateescape"),
            version.encode("utf-8", "surrogateescape"),
            _REPLY_NUMBERS.pack(length, crc),
        )
    )
    return hmac.new(secret, message, hashlib.sha256).digest()[:TAG_SIZE]


def tags_match(expected: bytes, got: bytes) -> bool:
    return len(got) == TAG_SIZE and hmac.compare_digest(expected, got)


@dataclass(frozen=True, slots=True)
class Signed:
    """A request whose group signature passed: what its principal's proof must match."""

    message: bytes
    nonce: str
    to: str  # the name of this member the request was sent to
    proof: str  # "" when the request carries none

    def proves(self, principal_key: bytes) -> bool:
        """Whether the request's proof was made with `principal_key`."""
        if not _HEX64.fullmatch(self.proof):
            return False
        return hmac.compare_digest(_mac(principal_key, self.message).encode(), self.proof.encode())


class Verifier:
    """Checks signed requests to member `self_name` against one secret, remembering recent
    nonces; tags this member's replies. A request may also name the member by the address it
    was sent to (a `dns://` member list names members so)."""

    def __init__(self, secret: bytes, self_name: str) -> None:
        self._secret = secret
        self.self_name = self_name
        self._nonces: OrderedDict[str, float] = OrderedDict()

    def check(
        self, method: str, target: str, headers: Mapping[str, str], address: str = ""
    ) -> Signed | str:
        """The request as signed (sent to this member's `address`), or why it must be
        refused."""
        stamp, nonce, signature = headers.get(TIME), headers.get(NONCE), headers.get(SIGNATURE)
        to = headers.get(TO)
        if not stamp or not nonce or not signature or to is None:
            return "unsigned"
        if not _STAMP.fullmatch(stamp):
            return "bad timestamp"
        if not _HEX32.fullmatch(nonce) or not _HEX64.fullmatch(signature):
            return "malformed signature"
        now = time.time()
        if not abs(now - float(stamp)) <= MAX_SKEW:
            return "old timestamp"
        if to != self.self_name and (not address or to != address.replace(":", "-")):
            return "for another member"
        message = _message(method, target, stamp, nonce, to)
        if not hmac.compare_digest(_mac(self._secret, message).encode(), signature.encode()):
            return "bad signature"
        self._forget_old(now)
        if nonce in self._nonces:
            return "replayed"
        if len(self._nonces) >= MAX_NONCES:
            return BUSY  # every nonce still in its window is kept
        self._nonces[nonce] = now
        return Signed(message, nonce, to, headers.get(PROOF, ""))

    def reply_tag(self, signed: Signed, version: str, length: int, crc: int) -> bytes:
        """The tag of this member's reply to `signed`, under the name it was asked by."""
        return reply_tag(self._secret, signed.nonce, signed.to, version, length, crc)

    def _forget_old(self, now: float) -> None:
        nonces = self._nonces
        while nonces and now - next(iter(nonces.values())) > MAX_SKEW:
            nonces.popitem(last=False)

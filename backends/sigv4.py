"""AWS Signature Version 4 for the lean GET engine's requests (GETs without a body, to S3).

botocore's S3SigV4Auth is a large part of a request's CPU: an AWSRequest and its header
objects, and four HMACs to derive the day's signing key each time. This signs the same way
(the test checks it against botocore's signer, header for header) in a fraction of that: the
signing key is kept for its day, region and secret, the canonical request is built from
strings, X-Amz-Date is formatted once a second and each HMAC is one C call. As botocore does
for a request without a streaming body, the payload is signed: the empty body's SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Protocol
from urllib.parse import urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Credentials(Protocol):
    """The frozen credentials of one request: botocore's ReadOnlyCredentials."""

    @property
    def access_key(self) -> str: ...
    @property
    def secret_key(self) -> str: ...
    @property
    def token(self) -> str | None: ...


class SigV4Signer:
    """Signs GETs for one service; thread-safe (the cached key and date are replaced whole)."""

    def __init__(self, service: str = "s3") -> None:
        self._service = service
        self._key: tuple[tuple[str, str, str], _Hmac] | None = None
        self._date: tuple[int, str] = (-1, "")  # (second, its X-Amz-Date)

    def sign(
        self,
        credentials: Credentials,
        region: str,
        host: str,
        target: str,
        headers: dict[str, str],
        now: float | None = None,
    ) -> dict[str, str]:
        """`headers` with the signing headers and Authorization added, for a GET of `target`
        (its path and query, encoded as sent) on `host` (as `host_header` gives it) at time
        `now` (default: the clock)."""
        amz_date = self._amz_date(time.time() if now is None else now)
        day = amz_date[:8]
        signed = dict(headers)
        signed["X-Amz-Date"] = amz_date
        signed["X-Amz-Content-SHA256"] = EMPTY_SHA256
        if credentials.token:
            signed["X-Amz-Security-Token"] = credentials.token
        canonical = {"host": host}
        for header, value in signed.items():
            canonical[header.lower()] = " ".join(value.split())
        names = sorted(canonical)
        signed_headers = ";".join(names)
        path, _, query_text = target.partition("?")
        query = ""
        if query_text:
            pairs = sorted(_pair(item) for item in query_text.split("&"))
            query = "&".join(f"{name}={value}" for name, value in pairs)
        lines = "".join(f"{header}:{canonical[header]}\n" for header in names)
        request = f"GET\n{path or '/'}\n{query}\n{lines}\n{signed_headers}\n{EMPTY_SHA256}"
        scope = f"{day}/{region}/{self._service}/aws4_request"
        digest = hashlib.sha256(request.encode()).hexdigest()
        to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"
        key = self._signing_key(credentials.secret_key, day, region)
        signature = key.hexdigest(to_sign.encode())
        signed["Authorization"] = (
            f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={signed_headers}, Signature={signature}"
        )
        return signed

    def _amz_date(self, now: float) -> str:
        """X-Amz-Date of a time, formatted once a second (strftime per request costs)."""
        second = int(now)
        cached = self._date
        if cached[0] == second:
            return cached[1]
        text = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
        self._date = (second, text)
        return text

    def _signing_key(self, secret: str, day: str, region: str) -> _Hmac:
        cached = self._key
        if cached is not None and cached[0] == (secret, day, region):
            return cached[1]
        key = f"AWS4{secret}".encode()
        for part in (day, region, self._service, "aws4_request"):
            key = hmac.digest(key, part.encode(), "sha256")
        keyed = _Hmac(key)
        self._key = ((secret, day, region), keyed)
        return keyed


class _Hmac:
    """HMAC-SHA256 under one key, its padded key blocks hashed once (RFC 2104): a message then
    costs two copies of a hash state, under half of what `hmac.digest` costs by keying OpenSSL
    anew each time."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # longer than SHA-256's block: hashed first (a signing key is 32)
            key = hashlib.sha256(key).digest()
        block = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in block))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in block))

    def hexdigest(self, message: bytes) -> str:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


def host_header(url: str) -> str:
    """The Host a request to `url` carries and signs, as botocore derives it: the host name,
    bracketed when IPv6, with the port unless it is the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _pair(item: str) -> tuple[str, str]:
    """A query item as (name, value), the order SigV4 sorts them in."""
    name, _, value = item.partition("=")
    return name, value

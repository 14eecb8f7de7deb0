"""Signed peer requests: an HMAC-SHA256 of the request under the group's shared secret.

The signature covers the method, the request target (path and query, which name the block,
its source included), a timestamp and a random nonce; the secret never crosses the wire. A
server refuses a request without the three headers, with a timestamp more than `MAX_SKEW`
seconds away from its clock, with a nonce it has seen within that window (a replay), or with a
signature that does not match.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping

from pffs.errors import UsageError

TIME = "x-pffs-time"
NONCE = "x-pffs-nonce"
SIGNATURE = "x-pffs-signature"
MAX_SKEW = 30.0
MIN_SECRET = 16
MAX_SECRET = 4096
# Nonces remembered against replays (those older than MAX_SKEW are refused by their time).
MAX_NONCES = 65536


def read_secret(path: str) -> bytes:
    """The shared secret in `path` (surrounding whitespace dropped), or a one-line error."""
    try:
        with open(path, "rb") as f:
            secret = f.read(MAX_SECRET + 1).strip()
    except OSError as exc:
        raise UsageError(f"--group-secret-file {path}: {exc.strerror}") from None
    if len(secret) > MAX_SECRET:
        raise UsageError(f"--group-secret-file {path}: longer than {MAX_SECRET} bytes")
    if len(secret) < MIN_SECRET:
        raise UsageError(f"--group-secret-file {path}: the secret needs {MIN_SECRET} bytes or more")
    return secret


def _mac(secret: bytes, method: str, target: str, stamp: str, nonce: str) -> str:
    message = "\n".join((method, target, stamp, nonce)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, target: str) -> dict[str, str]:
    """The headers that sign `method target` now."""
    stamp = f"{time.time():.3f}"
    nonce = secrets.token_hex(16)
    return {TIME: stamp, NONCE: nonce, SIGNATURE: _mac(secret, method, target, stamp, nonce)}


class Verifier:
    """Checks signed requests against one secret, remembering recent nonces."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._nonces: OrderedDict[str, float] = OrderedDict()

    def refusal(self, method: str, target: str, headers: Mapping[str, str]) -> str | None:
        """Why the request must be refused, or None when it is signed right."""
        stamp, nonce, signature = headers.get(TIME), headers.get(NONCE), headers.get(SIGNATURE)
        if not stamp or not nonce or not signature:
            return "unsigned"
        try:
            sent = float(stamp)
        except ValueError:
            return "bad timestamp"
        now = time.time()
        if not abs(now - sent) <= MAX_SKEW:
            return "old timestamp"
        expected = _mac(self._secret, method, target, stamp, nonce)
        if not hmac.compare_digest(expected, signature):
            return "bad signature"
        if nonce in self._nonces:
            return "replayed"
        self._remember(nonce, now)
        return None

    def _remember(self, nonce: str, now: float) -> None:
        self._nonces[nonce] = now
        while self._nonces and (
            len(self._nonces) > MAX_NONCES or now - next(iter(self._nonces.values())) > MAX_SKEW
        ):
            self._nonces.popitem(last=False)

"""The lean GET engine's HTTP response: http.client's, with its header block parsed by a few
lines of our own instead of the email package.

Why: http.client hands every response's headers to `email.parser`, which costs about 55 us of
CPU per response on this project's 2-core machine (a tenth of a 100 KiB GET's client CPU, all of
it holding the GIL that the mount's FUSE loop needs). S3 answers carry a dozen plain
`Name: value` lines; splitting them is all a GET needs (docs/BENCHMARKS.md, "Cold epoch at
0 ms"). Everything else (the status line, the body, chunked transfer, keep-alive) stays
http.client's: `begin` sets the same attributes its own does.
"""

from __future__ import annotations

import http.client
from typing import Any

# As http.client bounds them: the longest header line, and the most header lines.
MAX_LINE = 65536
MAX_HEADERS = 100


class Headers:
    """A response's header lines, looked up by name in any case (what HTTPResponse asks of
    its `headers`: `get` and `get_all`)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, list[str]] = {}

    def add(self, name: str, value: str) -> None:
        self._values.setdefault(name.lower(), []).append(value)

    def get(self, name: str, default: Any = None) -> Any:
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: Any = None) -> Any:
        return self._values.get(name.lower(), default)

    def items(self) -> list[tuple[str, str]]:
        return [(name, value) for name, values in self._values.items() for value in values]


def read_headers(fp: Any) -> Headers:
    """The header lines up to the blank one that ends them; malformed input raises as
    http.client does (LineTooLong, HTTPException)."""
    headers = Headers()
    name = ""
    for _ in range(MAX_HEADERS + 1):
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return headers
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and name:  # an obsolete folded continuation line
            values = headers.get_all(name)
            values[-1] = f"{values[-1]} {text.strip()}"
            continue
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip():
            raise http.client.HTTPException(f"malformed header line: {text[:80]!r}")
        headers.add(name, value.strip())
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


class LeanResponse(http.client.HTTPResponse):
    """http.client's response with `read_headers` in place of the email package, read
    through its socket's `makefile` reader, which it never closes: the connection owns it
    (pffs.backends.s3connections keeps one per connection, for every answer on it)."""

    def _close_conn(self) -> None:
        self.fp = None  # type: ignore[assignment]  # over; the reader stays with its connection

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:  # 100 Continue answers come before the real one: skipped
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            read_headers(self.fp)
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        headers = read_headers(self.fp)
        self.headers = self.msg = headers
        encoding = headers.get("transfer-encoding")
        self.chunked = bool(encoding) and encoding.lower() == "chunked"
        self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            if self.length is not None and self.length < 0:
                self.length = None
        no_body = status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
        if no_body or 100 <= status < 200 or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True

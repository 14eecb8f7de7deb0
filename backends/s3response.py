"""The lean GET engine's HTTP response: http.client's, with its header block parsed by a few
lines of our own instead of the email package.

Why: http.client hands every response's headers to `email.parser`, about a tenth of a small
GET's client CPU, all of it holding the GIL that the mount's FUSE loop needs. S3 answers carry a
dozen plain `Name: value` lines, taken here in one read and searched by name when asked.
Everything else (the status line, the body, chunked transfer, keep-alive) stays http.client's:
`begin` sets the same attributes its own does.
"""

from __future__ import annotations

import http.client
import io
from typing import Any

# As http.client bounds them: the longest header line, and the most header lines.
MAX_LINE = 65536
MAX_HEADERS = 100


class Headers:
    """A response's header lines, looked up by name in any case (what HTTPResponse asks of
    its `headers`: `get` and `get_all`).

    Kept as their text and searched when asked: a GET asks for four or five of an answer's
    dozen or more headers, fewer than splitting every line into a dictionary would cost. A
    line that is not "Name: value" is passed over, as http.client's parser passes it (checking
    every line by a regex would cost more than all the rest)."""

    __slots__ = ("_lower", "_text")

    def __init__(self, text: str) -> None:
        """`text`: the lines, each after a LF, without CRs (as `_text_of` makes them)."""
        self._text = text
        self._lower = text.lower()

    def get(self, name: str, default: Any = None) -> Any:
        key = f"\n{name.lower()}:"
        at = self._lower.find(key)
        return default if at < 0 else self._value(at + len(key))

    def get_all(self, name: str, default: Any = None) -> Any:
        key = f"\n{name.lower()}:"
        at = self._lower.find(key)
        values = []
        while at >= 0:
            values.append(self._value(at + len(key)))
            at = self._lower.find(key, at + 1)
        return values or default

    def _value(self, start: int) -> str:
        """The value that starts at `start`, its folded continuation lines joined to it."""
        text = self._text
        end = text.find("\n", start)
        value = text[start : end if end >= 0 else None].strip()
        while end >= 0 and text[end + 1 : end + 2] in (" ", "\t"):
            after = text.find("\n", end + 1)
            value = f"{value} {text[end + 1 : after if after >= 0 else None].strip()}"
            end = after
        return value

    def items(self) -> list[tuple[str, str]]:
        names = dict.fromkeys(
            line.partition(":")[0].strip().lower()
            for line in self._text.split("\n")
            if line and line[0] not in " \t"
        )
        return [(name, value) for name in names for value in self.get_all(name)]


def read_headers(fp: io.BufferedReader[Any]) -> Headers:
    """The header lines up to the blank one that ends them; too long a line, or too many,
    raise as http.client raises (LineTooLong, HTTPException)."""
    text = _buffered_text(fp)
    return Headers(_read_text(fp) if text is None else text)


def _buffered_text(fp: io.BufferedReader[Any]) -> str | None:
    """The header lines, taken in one read when the reader's buffer holds all of them and
    they end in CRLF (an S3 answer's do: they come whole in its first packet), else None."""
    buffered = fp.peek(MAX_LINE)
    if buffered[:2] == b"\r\n":  # no headers at all
        fp.read(2)
        return ""
    # The first blank line, unless a bare LF ends the block sooner (then: line by line).
    # Searched from the start only: a miss would scan the body read ahead with it.
    end = buffered.find(b"\n\r\n")
    if end < 0 or buffered.find(b"\n\n", 0, end + 1) >= 0 or buffered[:1] == b"\n":
        return None
    block = fp.read(end + 3)
    if block.count(b"\n") > MAX_HEADERS + 1:
        raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
    return "\n" + block[:end].decode("iso-8859-1").replace("\r\n", "\n").rstrip("\r")


def _read_text(fp: io.BufferedReader[Any]) -> str:
    """The header lines, read one by one (what the buffer did not hold whole)."""
    lines: list[str] = []
    for _ in range(MAX_HEADERS + 1):
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return "".join(lines)
        lines.append("\n" + line.decode("iso-8859-1").rstrip("\r\n"))
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

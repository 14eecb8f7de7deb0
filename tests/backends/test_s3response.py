"""The lean GET engine's response parsing (pffs.backends.s3connections) against raw answers: the
same status, headers, body framing and keep-alive decision http.client's own parser gives."""

from __future__ import annotations

import http.client
import io

import pytest

from pffs.backends.s3connections import LeanResponse, read_headers


class _Socket:
    """What HTTPResponse needs of a socket: a file of the raw answer."""

    def __init__(self, raw: bytes, buffer: int = io.DEFAULT_BUFFER_SIZE) -> None:
        self._raw = raw
        self._buffer = buffer

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._raw), self._buffer)


def _reader(raw: bytes) -> io.BufferedReader[io.BytesIO]:
    return io.BufferedReader(io.BytesIO(raw))


def _both(
    raw: bytes, method: str = "GET", buffer: int = io.DEFAULT_BUFFER_SIZE
) -> tuple[http.client.HTTPResponse, LeanResponse]:
    """The answer read by http.client's parser and by ours (through a reader of `buffer`)."""
    theirs = http.client.HTTPResponse(_Socket(raw), method=method)  # type: ignore[arg-type]
    ours = LeanResponse(_Socket(raw, buffer), method=method)  # type: ignore[arg-type]
    theirs.begin()
    ours.begin()
    return theirs, ours


def _unfolded(value: str | None) -> str | None:
    return None if value is None else " ".join(value.split())


ANSWERS = {
    "ranged GET": b'HTTP/1.1 206 Partial Content\r\nETag: "abc"\r\nContent-Length: 5\r\n'
    b"Content-Range: bytes 0-4/10\r\nConnection: keep-alive\r\n\r\nhello",
    "closing": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    "no length": b"HTTP/1.1 200 OK\r\nX-Amz-Bucket-Region: eu-west-1\r\n\r\nto the end",
    "HTTP/1.0 keep-alive": b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "HTTP/1.0": b"HTTP/1.0 404 Not Found\r\nContent-Length: 4\r\n\r\nnone",
    "continue first": b"HTTP/1.1 100 Continue\r\nX-Skip: 1\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    "not modified": b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n',
    "folded and repeated": b"HTTP/1.1 200 OK\r\nX-Long: one\r\n two\r\nX-Twice: a\r\n"
    b"x-twice: b\r\nContent-Length: 0\r\n\r\n",
    "bare newlines": b"HTTP/1.1 200 OK\nContent-Length: 1\n\nz",
    "mixed newlines": b"HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 4\n\r\n\r\n\r\n",
    "no headers": b"HTTP/1.1 200 OK\r\n\r\nall of it",
}


# A small buffer holds no answer's headers whole: they are read line by line.
@pytest.mark.parametrize("buffer", [io.DEFAULT_BUFFER_SIZE, 16], ids=["buffered", "lines"])
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_reads_an_answer_as_http_client_does(name: str, buffer: int) -> None:
    theirs, ours = _both(ANSWERS[name], buffer=buffer)
    assert (ours.status, ours.reason, ours.version) == (
        theirs.status,
        theirs.reason,
        theirs.version,
    )
    assert (ours.length, ours.will_close) == (theirs.length, theirs.will_close)
    for header in ("etag", "Content-Range", "x-amz-bucket-region", "X-Long", "X-Twice", "X-A"):
        # A folded line is unfolded (RFC 9112: the fold is one space); email keeps the fold.
        assert _unfolded(ours.getheader(header)) == _unfolded(theirs.getheader(header)), header
    assert ours.read() == theirs.read()
    assert ours.isclosed() and theirs.isclosed()


def test_a_head_answer_has_no_body() -> None:
    theirs, ours = _both(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", method="HEAD")
    assert ours.length == theirs.length == 0


@pytest.mark.parametrize(
    "line", [b"no colon here", b": no name", b"Name : space before the colon", b" folded first"]
)
def test_a_malformed_header_line_is_passed_over(line: bytes) -> None:
    headers = read_headers(_reader(line + b"\r\nX-Good: 1\r\n\r\n"))
    assert headers.get("x-good") == "1"
    assert headers.get("name") is None


@pytest.mark.parametrize("buffer", [io.DEFAULT_BUFFER_SIZE, 16], ids=["buffered", "lines"])
def test_too_many_headers_is_an_error(buffer: int) -> None:
    raw = b"".join(b"X-%d: v\r\n" % n for n in range(101)) + b"\r\n"
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        read_headers(io.BufferedReader(io.BytesIO(raw), buffer))
    assert read_headers(io.BufferedReader(io.BytesIO(raw[8:]), buffer)).get("x-100") == "v"


def test_an_overlong_line_is_an_error() -> None:
    with pytest.raises(http.client.LineTooLong):
        read_headers(_reader(b"X-Big: " + b"a" * 70000 + b"\r\n\r\n"))


def test_an_unknown_protocol_is_an_error() -> None:
    with pytest.raises(http.client.UnknownProtocol):
        LeanResponse(_Socket(b"HTTP/2.0 200 OK\r\n\r\n")).begin()  # type: ignore[arg-type]

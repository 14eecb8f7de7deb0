"""The lean GET engine's connections: a pool of idle keep-alive connections to one host, each
connection its socket and the one buffered reader every answer on it is read through, read and
send timeouts kept by the kernel on plain sockets, and the answer's head read off it.

Why not http.client's connection for the requests: building a request through `putrequest`
and `putheader` (each header checked by regexes), a new `socket.makefile` reader per answer and
a Python timeout that polls before each recv and send cost a quarter of the engine's CPU per
GET. Here a request is one string written with one `sendall`, and answers are read through a reader
made once per connection. http.client still connects (TCP_NODELAY, TLS, CONNECT tunnels through
a proxy) and still frames the answer (`LeanResponse`, below).

An answer's head (`LeanResponse`): http.client's response, with its header block parsed by a
few lines of our own instead of the email package. Why: http.client hands every response's
headers to `email.parser`, about a tenth of a small GET's client CPU, all of it holding the GIL
that the mount's FUSE loop needs. S3 answers carry a dozen plain `Name: value` lines, taken
here in one read and searched by name when asked. Everything else (the status line, the body,
chunked transfer, keep-alive) stays http.client's: `begin` sets the same attributes its own does.

A warm spare: when a request takes the pool's last idle connection (or finds none), one more is
opened in a thread of its own and kept idle, so the next request does not pay a connection's
round trip (TCP, and TLS) on its own path. A reader's cold start sends two GETs at once (its
few bytes and the block behind them): with one idle connection, the one that lost the race
opened a connection while the reader waited on it (docs/notes/rgw.md).

Connections that may lead nowhere. A connection opened while the store was down, or idle
through an outage, may be bound to nothing that answers (a load balancer or a NAT keeping it
tied to a backend that died takes the request and never forwards it), and the pool's check
(`idle_and_open`) cannot tell. Two rules keep such a connection from costing a request its
whole timeout after the store is back:

- `renew()` (called once the source has come back up: pffs.backends.s3) closes every idle
  connection, and those in use when they are handed back (each connection carries the pool's
  generation of when it was opened: an older one is closed, never kept), then opens the spare
  again, now that the store answers;
- a connection that has never carried an answer waits for its first one only
  `first_answer_timeout` (the probe's answer timeout, or the request timeout where that is
  shorter); from its first answer on, the request timeout. A dead connection costs seconds,
  wherever it came from (a spare, a new one); a slow store's first byte on a new connection
  past it is retried as any timeout is.

Timeouts: a plain socket is left in blocking mode with SO_RCVTIMEO / SO_SNDTIMEO set, so that
no poll precedes each recv and send; a recv or send the kernel timed out fails with EAGAIN,
which `SocketReader` and `send` raise as TimeoutError, the very error a Python-side timeout
raises. A TLS socket keeps Python's timeout: under a blocking Python socket, OpenSSL reads an
EAGAIN as "try again" and the ssl module would retry the read forever.
"""

from __future__ import annotations

import http.client
import io
import logging
import select
import socket
import ssl
import struct
import threading
from typing import Any
from urllib.parse import urlsplit

from botocore.httpsession import get_cert_path

log = logging.getLogger(__name__)

# Room for an answer's status and headers and the start of its body in one recv; a larger
# body is read straight into the bytes object it ends in (BufferedReader reads past its buffer).
READ_BUFFER = 64 * 1024
# Linux's TCP_QUICKACK (None elsewhere): see Connection.send.
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class SocketReader(io.RawIOBase):
    """A socket's bytes as a raw file, a recv the kernel timed out raised as TimeoutError
    (socket.SocketIO would answer None, which a buffered reader takes for a short read)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError as exc:  # SO_RCVTIMEO ran out
            raise TimeoutError("timed out reading from the store") from exc


class Connection:
    """One keep-alive connection: its socket, the reader its answers are read through (whole
    answers only: a half-read one closes the connection), the pool's generation when it was
    opened, and whether it has carried an answer yet."""

    __slots__ = ("answered", "generation", "reader", "sock")

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        self.generation = generation
        self.answered = False
        self.reader: io.BufferedReader[SocketReader] = io.BufferedReader(
            SocketReader(sock), READ_BUFFER
        )

    def makefile(self, mode: str) -> io.BufferedReader[SocketReader]:
        """The reader an answer is read through (what http.client's response asks of a
        socket); the same one for every answer, so that bytes read ahead are never lost."""
        return self.reader

    def send(self, request: bytes) -> None:
        try:
            self.sock.sendall(request)
        except BlockingIOError as exc:  # SO_SNDTIMEO ran out
            raise TimeoutError("timed out sending to the store") from exc
        if QUICKACK is not None:
            # Acknowledge the answer's first segment at once, not after the kernel's delayed
            # ACK (40 ms): a server that leaves Nagle's algorithm on (RGW's beast frontend by
            # default) holds a small body written after its headers until they are ACKed, so
            # a 4 KiB GET or a listing page would take a round trip and 40 ms more. Set per
            # request: the kernel leaves quick-ACK mode by itself on a request-answer exchange.
            self.sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)

    def idle_and_open(self) -> bool:
        """Whether the connection can carry a request: nothing to read on it (a keep-alive
        connection the server closed, or wrote on, reads as ready). poll, not select: a
        mount's descriptors may number past select's 1024."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        self.sock.close()


class Connections:
    """Idle keep-alive connections to one host, shared by threads (a LIFO under a lock).

    Not urllib3: its pool and response wrapper add CPU to every GET, and this path needs
    none of their features.
    """

    def __init__(
        self,
        scheme: str,
        netloc: str,
        connect_timeout: float,
        read_timeout: float,
        verify: bool | str,
        max_idle: int,
        proxy: tuple[str, dict[str, str]] | None = None,
        first_answer_timeout: float | None = None,
    ) -> None:
        """`proxy`: (URL, headers) of the HTTP proxy boto3 would use for this host, if any;
        `first_answer_timeout`: the wait for a new connection's first answer (None: the read
        timeout; never longer than it)."""
        self._netloc = netloc
        self._proxy = proxy
        # Through a proxy a plain-HTTP request names the whole URL and carries the proxy's
        # headers; an HTTPS one goes through a CONNECT tunnel and carries nothing extra.
        self.absolute_form = proxy is not None and scheme == "http"
        self.request_headers = proxy[1] if proxy is not None and scheme == "http" else {}
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._timeval = _timeval(read_timeout)
        first = read_timeout if first_answer_timeout is None else first_answer_timeout
        self._first_answer_timeout = min(first, read_timeout)
        self._first_timeval = _timeval(self._first_answer_timeout)
        self._max_idle = max_idle
        self._generation = 0  # renew() moves it: connections of an older one are let go
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._spare_opening = False  # one spare at a time
        self._closed = False
        self._tls: ssl.SSLContext | None = None
        if scheme == "https":
            # The CA bundle botocore itself would load (the given one, else its default).
            cafile = get_cert_path(verify) if verify is not False else None
            self._tls = ssl.create_default_context(cafile=cafile)
            if verify is False:
                self._tls.check_hostname = False
                self._tls.verify_mode = ssl.CERT_NONE

    def take(self) -> tuple[Connection, bool]:
        """An idle connection the server has not closed meanwhile (and True), or a new
        connected one (and False). Leaving none idle, it has a spare opened (see above)."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                connection = self._idle.pop()
                last = not self._idle
            # Sending on a connection the server closed would fail, and the failure would be
            # counted and retried as the store's.
            if connection.idle_and_open():
                if last:
                    self._open_spare()
                return connection, True
            connection.close()
        generation = self._generation  # before connecting: a renew() meanwhile outdates it
        self._open_spare()
        return Connection(self._connect(), generation), False

    def answered(self, connection: Connection) -> None:
        """`connection` has carried an answer (its head read): from now on it waits for the
        store as long as the request timeout allows."""
        if connection.answered:
            return
        connection.answered = True
        if self._first_answer_timeout == self._read_timeout:
            return
        sock = connection.sock
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(self._read_timeout)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._timeval)

    def renew(self) -> None:
        """Let go of every connection open now (see the module's docstring): the idle ones
        close at once, those in use when handed back; then a spare is opened."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        self._open_spare()

    def _open_spare(self) -> None:
        """Open one connection more in a thread of its own and keep it idle (none while one
        is being opened, none for a pool that keeps no idle connection)."""
        with self._lock:
            if self._spare_opening or self._closed or self._max_idle == 0:
                return
            self._spare_opening = True
        threading.Thread(target=self._spare, name="pffs-spare-connection", daemon=True).start()

    def _spare(self) -> None:
        try:
            while True:
                generation = self._generation
                connection = Connection(self._connect(), generation)
                if generation == self._generation:
                    break
                connection.close()  # renewed while it connected: opened too early, again
        except (OSError, http.client.HTTPException) as exc:  # ssl.SSLError is an OSError
            # Nothing waits on a spare: the request that needs a connection opens its own
            # and meets the error there.
            log.debug("a spare connection could not be opened: %s", exc)
            return
        finally:
            with self._lock:
                self._spare_opening = False
        self.give(connection)

    def _connect(self) -> socket.socket:
        """A connected socket (through the proxy's tunnel for HTTPS), its timeouts set."""
        host = self._netloc if self._proxy is None else urlsplit(self._proxy[0]).netloc
        host = host.rsplit("@", 1)[-1]  # the proxy's credentials are in its headers
        opener: http.client.HTTPConnection
        if self._tls is not None:
            opener = http.client.HTTPSConnection(
                host, timeout=self._connect_timeout, context=self._tls
            )
            if self._proxy is not None:
                opener.set_tunnel(self._netloc, headers=self._proxy[1])
        else:
            opener = http.client.HTTPConnection(host, timeout=self._connect_timeout)
        opener.connect()  # TCP_NODELAY, TLS and the tunnel, as http.client does them
        sock = opener.sock
        assert sock is not None
        # Until its first answer, the first-answer timeout (see the module's docstring).
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(self._first_answer_timeout)
        else:
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._first_timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._timeval)
        return sock

    def give(self, connection: Connection) -> None:
        with self._lock:
            if (
                not self._closed
                and connection.generation == self._generation
                and len(self._idle) < self._max_idle
            ):
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True  # a spare still being opened is closed when it arrives
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _timeval(seconds: float) -> bytes:
    """`seconds` as the struct timeval SO_RCVTIMEO and SO_SNDTIMEO take; at least 1 us: a zero
    timeval would mean no timeout at all."""
    return struct.pack("ll", *divmod(max(1, round(seconds * 1e6)), 10**6))


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

"""A fault-injecting HTTP proxy on 127.0.0.1, for tests and drills (never used by a mount).

`FaultProxy` sits between pffs and an S3 server (moto, s3rver): pffs is pointed at the proxy's
endpoint URL and the proxy forwards each request to the real server. Before or after forwarding
it can inject one of the failures a real store and network produce:

- ``reset``: the connection is reset (RST) before any response byte;
- ``503``: a ``503 SlowDown`` S3 error, as a throttling store answers;
- ``500``: a ``500 InternalError``;
- ``stall``: nothing is sent for `stall_seconds` (longer than the client's read timeout), then
  the connection is closed;
- ``truncate``: the response headers promise the full body, half of it is sent, then the
  connection is closed;
- ``flip``: one byte of the request's body is inverted on its way to the server (a PUT or a
  part corrupted in transit), which only a checksum the server verifies catches.

Faults come at configured rates (a seeded random draw per request) or on demand (`inject`, a
queue served before the rates), and only for requests a `match` predicate accepts (by default,
object GETs, so a mount's preflight checks are not disturbed). `down()` makes every request
fail by reset ("the store is unreachable"); `up()` restores service. `hang()` makes it a store
that stops answering: every request, on old connections and new ones alike, is read and never
answered; `resume()` makes it answer again, though never the requests read while it hung (as a
blackholed network drops them). What becomes of the connections that were open while it hung
(accepted before the hang or during it) is `resume`'s `held`: ``answer`` (they are answered
again), ``reset`` (each is reset at once), or ``black hole`` (their requests are read and never
answered, for good: an L4 load balancer or a NAT keeping connections bound to a backend that
died). A connection that carried a request during the hang and then carries another is counted
in `reused_after_hang`; a request that arrives after `resume()` on any connection that was open
during the hang, in `used_after_hang`: a client should have let go of them.
`throttle_above(n)` makes it a store that throttles under load: a matching request arriving
while `n` are already in flight (it would make more than `n`) gets ``503 SlowDown`` (counted
as "throttle"). `hold_tail(count)` holds the next matching GET's body after its first `count`
bytes (its head and those sent, `holding` set) until `release()`: a store whose reply is on its
way, for a test that acts while a fetch is half done. Every fault is counted in `injected`, so
a test can check that its faults were actually hit, and the bytes of the matching GETs'
bodies it forwarded in `body_bytes` (what a mount fetched).

One thread per client connection (HTTP/1.1 keep-alive is honoured), one upstream connection per
client connection; a stalled connection never holds up the others.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import random
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from typing import BinaryIO

from pffs.testing.servers import Service

FAULTS = ("reset", "503", "500", "stall", "truncate", "flip")
# What `resume` does with the connections open while the store hung (see the docstring).
HELD = ("answer", "reset", "black hole")
# What `_choose` answers for a matching request forwarded unharmed: it counts in `in_flight`.
_COUNTED = "counted"
Match = Callable[[str, str, dict[str, str]], bool]
_MAX_LINE = 65536


def object_gets(method: str, path: str, headers: dict[str, str]) -> bool:
    """The default `match`: GETs of objects (ranged reads), not listings or bucket checks."""
    bucket_and_key = path.split("?", 1)[0].lstrip("/")
    return method == "GET" and "/" in bucket_and_key.rstrip("/") and "range" in headers


def any_request(method: str, path: str, headers: dict[str, str]) -> bool:
    return True


class FaultProxy(Service):
    """Forward HTTP to `upstream` (host, port), injecting faults; use as a context manager."""

    def __init__(
        self,
        upstream_port: int,
        *,
        rates: dict[str, float] | None = None,
        match: Match = object_gets,
        stall_seconds: float = 5.0,
        seed: int = 0,
        upstream_host: str = "127.0.0.1",
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.stall_seconds = stall_seconds
        self.match = match
        self.injected: collections.Counter[str] = collections.Counter()
        self.forwarded = 0
        # Every request read from a client, (method, path), faulted or not: what reached the
        # store's door, for tests that ask "did this read ask the store at all?".
        self.requests: list[tuple[str, str]] = []
        # Bytes of the bodies of matching GETs (by default object reads) sent back to clients.
        self.body_bytes = 0
        self._rates: dict[str, float] = {}
        self._queue: collections.deque[str] = collections.deque()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._down = False
        self._answering = threading.Event()
        self._answering.set()
        self.reused_after_hang = 0  # requests on a connection whose earlier request hung
        self.used_after_hang = 0  # requests after resume() on a connection open while hung
        # The connections being served, and those of them open while the store hung (each
        # with its fate once resume() chose it; None while it still hangs).
        self._links: set[socket.socket] = set()
        self._hung_links: dict[socket.socket, str | None] = {}
        self._throttle_above: int | None = None
        self.in_flight = 0  # matching requests being forwarded now
        self._hold_after: int | None = None
        self.holding = threading.Event()  # a GET's body is held (hold_tail)
        self._released = threading.Event()
        self._closing = threading.Event()
        self.set_rates(rates or {})
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    # --- control -----------------------------------------------------------------------------

    def set_rates(self, rates: dict[str, float]) -> None:
        """Probability of each fault per matching request (their sum must be at most 1)."""
        unknown = set(rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        if sum(rates.values()) > 1.0:
            raise ValueError("fault rates add up to more than 1")
        with self._lock:
            self._rates = dict(rates)

    def inject(self, fault: str, count: int = 1) -> None:
        """Fail the next `count` matching requests with `fault` (before any rate applies)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
        with self._lock:
            self._queue.extend([fault] * count)

    def down(self) -> None:
        """Every request, matching or not, is answered with a reset: the store is unreachable."""
        self._down = True

    def up(self) -> None:
        self._down = False

    def hang(self) -> None:
        """Read every request and answer none, until `resume()`: the store stops answering."""
        with self._lock:
            self._answering.clear()
            self._hung_links.update(dict.fromkeys(self._links))

    def resume(self, held: str = "answer") -> None:
        """Answer again (new requests; those read while hung stay unanswered); the connections
        open while it hung are `held` (one of HELD)."""
        if held not in HELD:
            raise ValueError(f"unknown {held!r}; known: {HELD}")
        with self._lock:
            for link in self._hung_links:
                self._hung_links[link] = held
            if held == "reset":
                for link in self._hung_links:
                    # RST at close; the read under way wakes (EOF) and the handler closes.
                    with contextlib.suppress(OSError):
                        link.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        link.shutdown(socket.SHUT_RD)
            self._answering.set()

    def throttle_above(self, limit: int | None) -> None:
        """Answer 503 SlowDown to a matching request that would make more than `limit` in
        flight (None: never)."""
        self._throttle_above = limit

    def hold_tail(self, count: int) -> None:
        """Hold the next matching GET's body after its first `count` bytes until `release()`."""
        self._released.clear()
        self.holding.clear()
        self._hold_after = count

    def release(self) -> None:
        self._released.set()

    def _held(self, client: socket.socket, head: bytes, payload: bytes) -> bool:
        """Send a reply whose tail is to be held (False: none is, or this body is no longer
        than what is sent before the hold)."""
        with self._lock:
            count = self._hold_after
            if count is None or len(payload) <= count:
                return False
            self._hold_after = None
        client.sendall(head + payload[:count])
        self.holding.set()
        self._released.wait()  # stop() sets it too
        client.sendall(payload[count:])
        return True

    @property
    def total_injected(self) -> int:
        with self._lock:
            return sum(self.injected.values())

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            # A short poll: stop() waits for it (socketserver's default half second would add
            # that much to every test's teardown).
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fault-proxy",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()  # wakes stalled connections
        self._answering.set()  # and hung ones
        self._released.set()  # and held ones
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- serving -----------------------------------------------------------------------------

    def _choose(self, method: str, path: str, headers: dict[str, str]) -> str | None:
        if self._down:
            with self._lock:
                self.injected["down"] += 1
            return "reset"
        if not self.match(method, path, headers):
            return None
        with self._lock:
            if self._queue:
                fault: str | None = self._queue.popleft()
            else:
                draw, fault = self._random.random(), None
                for name, rate in self._rates.items():
                    if draw < rate:
                        fault = name
                        break
                    draw -= rate
            limit = self._throttle_above
            if fault is None and limit is not None and self.in_flight >= limit:
                self.injected["throttle"] += 1
                return "503"
            if fault is not None:
                self.injected[fault] += 1
            if fault is None:
                self.in_flight += 1
                return _COUNTED
            return fault

    def _fate(self, client: socket.socket) -> str | None:
        """What becomes of a request on `client` after a hang: None (served as any other),
        or its connection's `held` (counted)."""
        with self._lock:
            fate = self._hung_links.get(client)
            if fate is not None:
                self.used_after_hang += 1
                if fate == "black hole":
                    self.injected["black hole"] += 1
            return fate

    def _serve_connection(self, client: socket.socket) -> None:
        with self._lock:
            self._links.add(client)
            if not self._answering.is_set():
                self._hung_links[client] = None
        try:
            self._serve_requests(client)
        finally:
            with self._lock:
                self._links.discard(client)
                self._hung_links.pop(client, None)

    def _serve_requests(self, client: socket.socket) -> None:
        upstream: http.client.HTTPConnection | None = None
        reader = client.makefile("rb")
        hung = False  # a request on this connection was read while the store hung
        try:
            while not self._closing.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                with self._lock:
                    self.requests.append((method, path))
                if hung:
                    with self._lock:
                        self.reused_after_hang += 1
                fate = self._fate(client) if self._answering.is_set() else None
                if fate == "black hole":
                    continue  # read, never answered
                if fate == "reset":
                    _reset(client)
                    return
                if not self._answering.is_set():
                    with self._lock:
                        self.injected["hang"] += 1
                    hung = True
                    self._answering.wait()
                    continue  # that request is never answered
                fault = self._choose(method, path, headers)
                if fault == "reset":
                    _reset(client)
                    return
                if fault in ("500", "503"):
                    client.sendall(_s3_error(int(fault)))
                    continue
                if fault == "stall" and method != "GET":
                    self._closing.wait(self.stall_seconds)
                    return
                if fault == "flip" and body:
                    middle = len(body) // 2
                    body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]
                if upstream is None:
                    upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
                try:
                    status, reason, response_headers, payload = _forward(
                        upstream, method, path, headers, body
                    )
                finally:
                    if fault == _COUNTED:
                        with self._lock:
                            self.in_flight -= 1
                with self._lock:
                    self.forwarded += 1
                    if fault == _COUNTED and method == "GET":
                        self.body_bytes += len(payload)
                head = _response_head(status, reason, response_headers, len(payload), method)
                if fault == "stall":  # headers, a little of the body, then silence
                    client.sendall(head + payload[: len(payload) // 4])
                    self._closing.wait(self.stall_seconds)
                    return
                if fault == "truncate" and len(payload) > 1:
                    client.sendall(head + payload[: len(payload) // 2])
                    return
                if fault != _COUNTED or method != "GET" or not self._held(client, head, payload):
                    client.sendall(head + (b"" if method == "HEAD" else payload))
                if headers.get("connection", "").lower() == "close":
                    return
        except (OSError, http.client.HTTPException, ValueError):
            return  # the client went away or spoke nonsense: drop the connection
        finally:
            reader.close()
            if upstream is not None:
                upstream.close()
            with contextlib.suppress(OSError):
                client.close()


def _read_request(reader: BinaryIO) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request off a client connection, or None when the client closed it."""
    line = reader.readline(_MAX_LINE)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(_MAX_LINE)
    if not line:
        return None
    method, path, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = reader.readline(_MAX_LINE)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _read_chunked(reader)
        del headers["transfer-encoding"]
        headers["content-length"] = str(len(body))
    else:
        body = reader.read(int(headers.get("content-length", "0") or 0))
    return method, path, headers, body


def _read_chunked(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int(reader.readline(_MAX_LINE).split(b";")[0].strip(), 16)
        if size == 0:
            while reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                pass  # trailers: dropped
            return b"".join(parts)
        parts.append(reader.read(size))
        reader.readline(_MAX_LINE)


def _forward(
    upstream: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
) -> tuple[int, str, list[tuple[str, str]], bytes]:
    upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        if name not in ("connection", "keep-alive", "proxy-connection"):
            upstream.putheader(name, value)
    upstream.endheaders(body if body else None)
    response = upstream.getresponse()
    payload = response.read()  # http.client undoes chunking; the client gets Content-Length
    hop = {"connection", "keep-alive", "transfer-encoding", "content-length"}
    kept = [(k, v) for k, v in response.getheaders() if k.lower() not in hop]
    content_length = response.getheader("content-length")
    if method == "HEAD" and content_length is not None:
        kept.append(("Content-Length", content_length))
    return response.status, response.reason, kept, payload


def _response_head(
    status: int, reason: str, headers: list[tuple[str, str]], length: int, method: str
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if method != "HEAD":
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _s3_error(status: int) -> bytes:
    code, message = (
        ("SlowDown", "Please reduce your request rate.")
        if status == 503
        else ("InternalError", "We encountered an internal error. Please try again.")
    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>faultproxy</RequestId></Error>"
    ).encode()
    reason = "Slow Down" if status == 503 else "Internal Server Error"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _reset(client: socket.socket) -> None:
    """Close with RST instead of FIN: the client sees 'connection reset by peer'."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()

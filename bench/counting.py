"""A counting proxy: what a mount asks the store, counted at the store's side, by kind.

Put in front of a server (or of the delay proxy in front of it), it forwards every connection
byte for byte and reads the requests going to the store as they pass: GET of an object, HEAD,
LIST (a GET of a bucket's listing) and OTHER (writes, deletes, other bucket queries). Every
system is counted the same way, whatever its client library, since only the HTTP/1.1 request
stream is read (request heads, bodies skipped by Content-Length or chunk sizes).

It runs as a process of its own, so its CPU never competes with the GIL of the readers it
counts: `python -m bench.counting --upstream 127.0.0.1:9000` prints its port, serves until
SIGTERM, then prints the counts as one JSON line (on SIGUSR1 too, and counts again from 0).
Beside the counts it adds up the bytes the store sent back (response heads and bodies: what
a store bills as egress), reported under `STORE_BYTES` in the same line. `CountingProxy`
starts, reads and stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TextIO

from bench.leftovers import track_process
from bench.servers import Server, Unavailable

KINDS = ("GET", "HEAD", "LIST", "OTHER")
STORE_BYTES = "store_bytes"  # the report line's key for the bytes the store sent
_READ = 256 * 1024
# Query parameters that make a GET of a bucket a listing (ListObjects v1 and v2).
_LISTING = {"list-type", "prefix", "delimiter", "marker", "continuation-token", "max-keys"}


def kind_of(method: str, target: str) -> str:
    """GET, HEAD, LIST or OTHER for one request line's method and target (path-style S3)."""
    parts = urllib.parse.urlsplit(target)
    path = parts.path.strip("/")
    if method == "HEAD":
        return "HEAD"
    if method != "GET":
        return "OTHER"
    if "/" in path:  # bucket/key: an object
        return "GET"
    query = set(urllib.parse.parse_qs(parts.query, keep_blank_values=True))
    return "LIST" if not query or query & _LISTING else "OTHER"


class RequestParser:
    """Reads an HTTP/1.1 request stream as it passes and counts its requests by kind."""

    def __init__(self, log: Callable[[str, str, str], None] | None = None) -> None:
        self.log = log  # told of each request: its method, target and Range header
        self.counts: Counter[str] = Counter()
        self._head = bytearray()  # a request head still arriving
        self._body_left = 0  # bytes of a Content-Length body still to skip
        self._chunked = False  # inside a chunked body
        self._line = bytearray()  # a chunk-size or trailer line still arriving
        self._chunk_left = 0  # bytes of the current chunk (and its CRLF) still to skip
        self._in_trailer = False

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._body_left:
                step = min(self._body_left, len(view))
                self._body_left -= step
                view = view[step:]
            elif self._chunked:
                view = self._feed_chunked(view)
            else:
                view = self._feed_head(view)

    def _feed_head(self, view: memoryview) -> memoryview:
        start = max(0, len(self._head) - 3)  # the blank line may straddle two reads
        self._head += view
        end = self._head.find(b"\r\n\r\n", start)
        if end < 0:
            return view[len(view) :]
        rest = len(self._head) - (end + 4)
        head = bytes(self._head[:end])
        self._head.clear()
        self._count(head)
        return view[len(view) - rest :]

    def _count(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        target = rest.rpartition(" ")[0] or rest
        self.counts[kind_of(method, target)] += 1
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if self.log is not None:
            self.log(method, target, headers.get("range", ""))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        else:
            self._body_left = int(headers.get("content-length", "0") or "0")

    def _feed_chunked(self, view: memoryview) -> memoryview:
        if self._chunk_left:
            step = min(self._chunk_left, len(view))
            self._chunk_left -= step
            return view[step:]
        newline = bytes(view).find(b"\n")
        if newline < 0:
            self._line += view
            return view[len(view) :]
        line = bytes(self._line + view[:newline]).strip()
        self._line.clear()
        view = view[newline + 1 :]
        if self._in_trailer:
            if not line:  # the blank line ends the trailer, and the request
                self._chunked = self._in_trailer = False
            return view
        size = int(line.split(b";")[0], 16)
        if size == 0:
            self._in_trailer = True
        else:
            self._chunk_left = size + 2  # the chunk and its CRLF
        return view


# The most one splice moves, and the pipe's capacity (Linux's default pipe-max-size).
_SPLICE_BYTES = 1 << 20
_MOVE = os.SPLICE_F_MOVE


def _forward_requests(
    client: socket.socket, store: socket.socket, parser: RequestParser, counting: threading.Lock
) -> None:
    """The client's bytes on to the store, read as they pass (requests are small: copied).
    `counting` is held while the parser counts, so that a report misses no request."""
    with contextlib.suppress(OSError):
        while data := client.recv(_READ):
            with counting:
                parser.feed(data)
            store.sendall(data)
        store.shutdown(socket.SHUT_WR)


def _forward_answers(store: socket.socket, client: socket.socket, sent: _Bytes) -> None:
    """The store's bytes on to the client by splice(2), through a pipe: they never enter this
    process, only their count does. Copying them through user space cost 0.8-1.7 CPU-s per GiB
    here, on the cores the store and the mount share; the delay proxy splices for the same
    reason (docs/notes/counting-proxy-splice.md)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # under a lower pipe-max-size splices move less
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _SPLICE_BYTES)
        with contextlib.suppress(OSError):  # a side gone: the connection ends
            while moved := os.splice(store.fileno(), write_end, _SPLICE_BYTES, flags=_MOVE):
                sent.add(moved)
                while moved:
                    moved -= os.splice(read_end, client.fileno(), moved, flags=_MOVE)
            client.shutdown(socket.SHUT_WR)
    finally:
        os.close(read_end)
        os.close(write_end)


class _Bytes:
    """A count the connections' threads add to and a report reads and resets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    def add(self, count: int) -> None:
        with self._lock:
            self._total += count

    def take(self) -> int:
        with self._lock:
            total, self._total = self._total, 0
            return total


class _Proxy:
    """Each accepted connection forwarded to the store by two threads, one per direction."""

    def __init__(self, host: str, port: int, log: TextIO | None = None) -> None:
        self.upstream = (host, port)
        self.log = log  # one line per request: seconds, connection, method, target, range
        self._log_lock = threading.Lock()
        self.parsers: list[RequestParser] = []
        self._counting = threading.Lock()  # held while a parser counts or a report reads
        self.sent = _Bytes()  # what the store sent back
        self._open: set[socket.socket] = set()  # the connections' sockets, both sides
        self._open_lock = threading.Lock()

    def serve(self, listener: socket.socket) -> None:
        """Accept until the listener is closed."""
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the proxy is stopping
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client: socket.socket) -> None:
        parser = RequestParser(self._logger(len(self.parsers)) if self.log else None)
        self.parsers.append(parser)
        try:
            store = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        for side in (client, store):
            side.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._open_lock:
            self._open.update((client, store))
        answers = threading.Thread(
            target=_forward_answers, args=(store, client, self.sent), daemon=True
        )
        answers.start()
        _forward_requests(client, store, parser, self._counting)
        answers.join()
        with self._open_lock:
            self._open.difference_update((client, store))
        client.close()
        store.close()

    def _logger(self, connection: int) -> Callable[[str, str, str], None]:
        def log(method: str, target: str, byte_range: str) -> None:
            assert self.log is not None
            line = f"{time.monotonic():.6f} {connection} {method} {target} {byte_range or '-'}"
            with self._log_lock:
                self.log.write(line + "\n")
                self.log.flush()

        return log

    def totals(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for parser in list(self.parsers):
            total.update(parser.counts)
        return {kind: total[kind] for kind in KINDS}

    def report(self) -> None:
        """Print the counts and the store's bytes since the last report as one JSON line, and
        start again from 0."""
        with self._counting:
            totals = self.totals()
            for parser in list(self.parsers):
                parser.counts.clear()
        print(json.dumps({**totals, STORE_BYTES: self.sent.take()}), flush=True)

    def drop_connections(self) -> None:
        """End every open connection (what it counted stands)."""
        with self._open_lock:
            for side in self._open:
                with contextlib.suppress(OSError):
                    side.shutdown(socket.SHUT_RDWR)


def _serve(proxy: _Proxy) -> None:
    """Listen, print the port, and serve until SIGTERM or SIGINT; SIGUSR1 reports."""
    signals = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
    # Blocked before any thread starts (they inherit the mask): only sigwait below takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    threading.Thread(target=proxy.serve, args=(listener,), daemon=True).start()
    print(listener.getsockname()[1], flush=True)  # the launcher reads this line
    while signal.sigwait(signals) == signal.SIGUSR1:
        proxy.report()
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
    listener.close()
    proxy.drop_connections()
    proxy.report()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.counting", description=__doc__)
    p.add_argument("--upstream", required=True, help="the store, HOST:PORT")
    p.add_argument("--log", help="a file of one line per request: time, connection, method, "
                   "target, Range header (bench.probes.client_reads)")  # fmt: skip
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    if not host or not port.isdigit():
        p.error(f"--upstream: {args.upstream!r} is not HOST:PORT")
    if args.log is None:
        _serve(_Proxy(host, int(port)))
        return 0
    with open(args.log, "a", encoding="utf-8") as log:
        _serve(_Proxy(host, int(port), log))
    return 0


class CountingProxy:
    """`server` behind a counting proxy process; `stop()` ends it and returns the counts.

    Each reading (`restart_count`, `stop`) also sets `store_bytes`: the bytes the store sent
    over the same span.
    """

    def __init__(self, server: Server, log: str | None = None) -> None:
        """`log`: a file the proxy writes each request to (its --log)."""
        upstream = urllib.parse.urlsplit(server.endpoint_url)
        argv = [sys.executable, "-m", "bench.counting"]
        argv += ["--upstream", f"{upstream.hostname}:{upstream.port or 80}"]
        argv += ["--log", log] if log else []
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        track_process(self._proc)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self._proc.kill()
            self._proc.wait()
            raise Unavailable("the counting proxy did not start")
        self.server = replace(server, endpoint_url=f"http://127.0.0.1:{line}", stop=lambda: None)
        self.store_bytes = 0

    @property
    def pid(self) -> int:
        """The proxy's process (its CPU is the counting's cost)."""
        return self._proc.pid

    def _reading(self, line: str) -> dict[str, int]:
        reading: dict[str, int] = json.loads(line)
        self.store_bytes = reading.pop(STORE_BYTES)
        return reading

    def restart_count(self) -> dict[str, int]:
        """The requests forwarded so far, by kind; counting starts again from 0."""
        assert self._proc.stdout is not None
        self._proc.send_signal(signal.SIGUSR1)
        return self._reading(self._proc.stdout.readline())

    def stop(self) -> dict[str, int]:
        """Stop the proxy; the requests it forwarded since the last restart_count, by kind."""
        assert self._proc.stdout is not None
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError("the counting proxy did not stop") from None
        return self._reading(out.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())

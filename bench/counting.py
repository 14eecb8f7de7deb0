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
import asyncio
import json
import signal
import subprocess
import sys
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


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    parser: RequestParser | None,
    counted: Counter[str] | None = None,
) -> None:
    try:
        while data := await reader.read(_READ):
            if parser is not None:
                parser.feed(data)
            if counted is not None:
                counted[STORE_BYTES] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class _Proxy:
    def __init__(self, host: str, port: int, log: TextIO | None = None) -> None:
        self.upstream = (host, port)
        self.log = log  # one line per request: seconds, connection, method, target, range
        self.parsers: list[RequestParser] = []
        self.sent: Counter[str] = Counter()  # STORE_BYTES: what the store sent back
        self.open: set[asyncio.Task[object]] = set()  # connections being served

    async def handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        parser = RequestParser(self._logger(len(self.parsers)) if self.log else None)
        self.parsers.append(parser)
        task = asyncio.current_task()
        if task is not None:
            self.open.add(task)
            task.add_done_callback(self.open.discard)
        try:
            store_reader, store_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(
                _pipe(client_reader, store_writer, parser),
                _pipe(store_reader, client_writer, None, self.sent),
            )
        except asyncio.CancelledError:
            pass  # the proxy is stopping: what was counted stands
        finally:
            for writer in (store_writer, client_writer):
                writer.close()

    def _logger(self, connection: int) -> Callable[[str, str, str], None]:
        def log(method: str, target: str, byte_range: str) -> None:
            assert self.log is not None
            line = f"{time.monotonic():.6f} {connection} {method} {target} {byte_range or '-'}"
            self.log.write(line + "\n")
            self.log.flush()

        return log

    def totals(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for parser in self.parsers:
            total.update(parser.counts)
        return {kind: total[kind] for kind in KINDS}

    def report(self) -> None:
        """Print the counts and the store's bytes since the last report as one JSON line, and
        start again from 0."""
        print(json.dumps({**self.totals(), STORE_BYTES: self.sent[STORE_BYTES]}), flush=True)
        for parser in self.parsers:
            parser.counts.clear()
        self.sent.clear()


async def _serve(proxy: _Proxy) -> None:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)  # the launcher reads this line
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    loop.add_signal_handler(signal.SIGUSR1, proxy.report)
    await stopped.wait()
    server.close()
    # Connections a client keeps alive end here, before the loop closes under them.
    for task in list(proxy.open):
        task.cancel()
    await asyncio.gather(*proxy.open, return_exceptions=True)
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
        asyncio.run(_serve(_Proxy(host, int(port))))
        return 0
    with open(args.log, "a", encoding="utf-8") as log:
        asyncio.run(_serve(_Proxy(host, int(port), log)))
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

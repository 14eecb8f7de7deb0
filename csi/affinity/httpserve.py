"""The scheduler extender's HTTP/1.1 server: bounded in connections, time and memory.

The extender answers kube-scheduler, but anyone who can reach its port can connect. So
connections are read by one asyncio loop, not a thread each: a client trickling a byte a second
holds a few kilobytes and no thread, and only a request read whole reaches the worker threads
that compute answers (the Kubernetes API calls they make block). Each connection is held to:

- `max_connections` open at once; beyond them a new one is closed at once;
- `request_seconds` from a request's first byte to its last (headers and body), and as long
  to take its answer: a deadline, not an idle time a slow sender stretches;
- `idle_seconds` between keep-alive requests;
- `max_header_bytes` of request line and headers, `max_body_bytes` of body (a Content-Length
  is required), and `body_budget` bytes of bodies being received by all connections together,
  so the memory they take stays well under the pod's limit. A request over one is answered
  413 or 503 and its connection closed.

What is answered is the handler's: (status, JSON document) for (method, path, body).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

log = logging.getLogger("pffs.csi.extender")

Handler = Callable[[str, str, bytes], tuple[int, Any]]


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 512
    request_seconds: float = 10.0
    idle_seconds: float = 60.0
    max_header_bytes: int = 32 * 1024
    # A request of names (nodeCacheCapable, as deploy/ configures it) is kilobytes; a NodeList
    # of objects for a thousand nodes fits too.
    max_body_bytes: int = 16 << 20
    body_budget: int = 64 << 20  # the pod's memory limit is 256 Mi
    workers: int = 4


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """Serves `handler` at (host, port); `serve_forever` in one thread, `shutdown` from any."""

    def __init__(self, handler: Handler, host: str, port: int, limits: HttpLimits) -> None:
        self.handler = handler
        self.limits = limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(128)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.connections = 0
        self._body_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopped = threading.Event()
        self._workers = concurrent.futures.ThreadPoolExecutor(
            limits.workers, thread_name_prefix="extender"
        )

    # --- life --------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown` (poll_interval: unused, for http.server's signature)."""
        try:
            asyncio.run(self._serve())
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving and wait for `serve_forever` to return (from another thread)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
            self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self.socket, limit=self.limits.max_header_bytes
        )
        async with server:
            await self._stop.wait()
            server.close()

    # --- one connection ----------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.limits.max_connections:
            log.warning("over %d connections: one closed at once", self.limits.max_connections)
            writer.transport.abort()
            return
        self.connections += 1
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.debug("a connection ended: %s", exc or type(exc).__name__)
        finally:
            self.connections -= 1
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request and its answer; whether the connection goes on."""
        limits = self.limits
        async with asyncio.timeout(limits.idle_seconds):
            first = await reader.read(1)  # a keep-alive connection waits here between requests
        if not first:
            return False
        try:
            async with asyncio.timeout(limits.request_seconds):
                method, path, keep_alive, body = await self._request(first, reader)
        except _Refused as refused:
            await self._answer(writer, refused.status, {"Error": str(refused)}, False)
            return False
        try:
            loop = asyncio.get_running_loop()
            status, doc = await loop.run_in_executor(
                self._workers, self.handler, method, path, body
            )
        finally:
            self._body_bytes -= len(body)
        await self._answer(writer, status, doc, keep_alive)
        return keep_alive

    async def _request(
        self, first: bytes, reader: asyncio.StreamReader
    ) -> tuple[str, str, bool, bytes]:
        try:
            head = first + await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"the request's headers are over {self.limits.max_header_bytes} bytes",
            ) from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request line")
        method, path, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if "transfer-encoding" in headers:
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "a Content-Length is required")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise _Refused(HTTPStatus.BAD_REQUEST, "a Content-Length is required")
        length = int(length_text)
        if length > self.limits.max_body_bytes:
            raise _Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the request is larger than {self.limits.max_body_bytes} bytes",
            )
        if self._body_bytes + length > self.limits.body_budget:
            raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests being received")
        self._body_bytes += length
        try:
            body = await reader.readexactly(length)
        except BaseException:
            self._body_bytes -= length
            raise
        return method, path, keep_alive, body

    async def _answer(
        self, writer: asyncio.StreamWriter, status: int, doc: Any, keep_alive: bool
    ) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        async with asyncio.timeout(self.limits.request_seconds):
            await writer.drain()

"""A TCP proxy that puts a store far away: every byte is held RTT/2 in each direction.

The kernel here has no netem, so the bench makes its far store in userspace. `DelayProxy`
listens on 127.0.0.1 and forwards each connection to an upstream server (moto, s3rver); each
chunk read from one side is stamped "due at arrival + RTT/2" and written to the other side when
due. Streams stay pipelined (the reader never waits for the writer), so the bandwidth of a
stream is kept and only its latency grows, as on a long fat network. Opening a connection costs
one round trip too, as a TCP handshake does: the first bytes a client sends are due no earlier
than one RTT after it connected, plus RTT/2.

It is lean on CPU, because it shares the machine with the store and the clients: one asyncio
thread for every connection, 256 KiB reads (asyncio's), one timer per direction at a time (not
one per chunk), no per-byte Python work. Backpressure is the transports' own: when one side
cannot take more, reading from the other side pauses.

In-process (`with DelayProxy(port, rtt_ms=20) as proxy:` then `proxy.endpoint_url`), or as a
process of its own, which keeps it off the GIL of whatever it measures:
`python -m pffs.testing.delay --upstream 127.0.0.1:9000 --rtt-ms 20` prints its port and serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import socket
import sys
import threading
from collections.abc import Callable

from pffs.testing.servers import Service

# Bytes a transport may buffer before the opposite side stops being read: a bandwidth-delay
# product's worth at a few hundred MB/s, so backpressure never throttles a healthy stream.
_WRITE_BUFFER_HIGH = 8 << 20
# Linux's TCP_QUICKACK (None elsewhere): see _Link.received.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_EOF = None  # the marker a pipe carries when its source stopped sending


class _Pipe:
    """One direction of one connection: chunks held until due, then written in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hold: float, not_before: float) -> None:
        self._loop = loop
        self._hold = hold
        self._not_before = not_before  # no byte leaves before this (the handshake's round trip)
        self._queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self.target: asyncio.Transport | None = None
        self.eof_queued = False
        self.ended = False  # the EOF went through, or the target is gone
        self.on_end: Callable[[], None] = lambda: None

    def push(self, data: bytes | None) -> None:
        if self.eof_queued or self.ended:
            return
        self.eof_queued = data is _EOF
        due = max(self._loop.time(), self._not_before) + self._hold
        self._queue.append((due, data))
        if self._timer is None and self.target is not None and len(self._queue) == 1:
            self._timer = self._loop.call_at(due, self._flush)

    def set_target(self, target: asyncio.Transport) -> None:
        self.target = target
        if self._queue and self._timer is None:
            self._timer = self._loop.call_at(self._queue[0][0], self._flush)

    def _flush(self) -> None:
        # One timer serves every chunk due by now: the loop wakes once per burst, not per chunk.
        self._timer = None
        target, now = self.target, self._loop.time()
        assert target is not None
        while self._queue and self._queue[0][0] <= now:
            data = self._queue.popleft()[1]
            if target.is_closing():
                self.end()
                return
            if data is _EOF:
                if target.can_write_eof():
                    target.write_eof()
                self.end()
                return
            target.write(data)
        if self._queue:
            self._timer = self._loop.call_at(self._queue[0][0], self._flush)

    def end(self) -> None:
        self.cancel()
        if not self.ended:
            self.ended = True
            self.on_end()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()


class _Link:
    """One proxied connection: the client's socket (side 0) and the upstream's (side 1)."""

    def __init__(self, proxy: DelayProxy, loop: asyncio.AbstractEventLoop) -> None:
        self._proxy = proxy
        self._loop = loop
        hold = proxy.rtt / 2
        # pipes[side] carries what `side` sends: pipes[0] client -> upstream, pipes[1] back.
        self.pipes = (_Pipe(loop, hold, loop.time() + proxy.rtt), _Pipe(loop, hold, 0.0))
        self.transports: list[asyncio.Transport | None] = [None, None]
        self.closed = False
        for pipe in self.pipes:
            pipe.on_end = self._pipe_ended

    def made(self, side: int, transport: asyncio.Transport) -> None:
        if self.closed:  # the client left while the upstream connection was being opened
            transport.close()
            return
        self.transports[side] = transport
        transport.set_write_buffer_limits(high=_WRITE_BUFFER_HIGH)
        self.pipes[1 - side].set_target(transport)
        if side == 0:
            self._proxy.links.add(self)
            self._loop.create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        try:
            await self._loop.create_connection(lambda: _End(self, 1), *self._proxy.upstream)
        except OSError:
            self.close()

    def received(self, side: int, data: bytes | None) -> None:
        self.pipes[side].push(data)
        upstream = self.transports[1]
        if side == 1 and _QUICKACK is not None and upstream is not None:
            # The proxy is a wire, not a client: its own delayed ACKs (40 ms) must not hold
            # back a server that leaves Nagle's algorithm on (RGW by default), which waits
            # for the ACK of an answer's headers before a small body. So it acknowledges at
            # once, as a client that sets TCP_QUICKACK does (pffs does); a client that delays
            # its ACKs would pay them against a real far server, which the proxy cannot show.
            sock = upstream.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def lost(self, side: int) -> None:
        # Nothing more can reach this side; what it sent still travels to the other side,
        # followed by an EOF (as a far peer's FIN would), and then the link closes.
        self.pipes[1 - side].end()
        if self.transports[1 - side] is None:
            self.close()
        else:
            self.pipes[side].push(_EOF)

    def _pipe_ended(self) -> None:
        if all(pipe.ended for pipe in self.pipes):
            self.close()

    def pause(self, side: int, paused: bool) -> None:
        """`side` cannot take more (or can again): stop (or resume) reading the other side."""
        source = self.transports[1 - side]
        if source is not None and not source.is_closing():
            (source.pause_reading if paused else source.resume_reading)()

    def close(self) -> None:
        self.closed = True
        for pipe in self.pipes:
            pipe.cancel()
        for transport in self.transports:
            if transport is not None:
                transport.close()
        self._proxy.links.discard(self)

    def abort(self) -> None:
        self.closed = True
        for pipe in self.pipes:
            pipe.cancel()
        for transport in self.transports:
            if transport is not None:
                transport.abort()


class _End(asyncio.Protocol):
    """One socket of a link; everything it hears goes to the link."""

    def __init__(self, link: _Link, side: int) -> None:
        self._link = link
        self._side = side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._link.made(self._side, transport)

    def data_received(self, data: bytes) -> None:
        self._link.received(self._side, data)

    def eof_received(self) -> bool:
        self._link.received(self._side, _EOF)
        return True  # keep the socket open for what the other side still sends

    def connection_lost(self, exc: Exception | None) -> None:
        self._link.lost(self._side)

    def pause_writing(self) -> None:
        self._link.pause(self._side, True)

    def resume_writing(self) -> None:
        self._link.pause(self._side, False)


class DelayProxy(Service):
    """Forward TCP from 127.0.0.1:`port` to `upstream`, `rtt_ms` added to every round trip."""

    def __init__(
        self,
        upstream_port: int,
        *,
        rtt_ms: float,
        upstream_host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if rtt_ms < 0:
            raise ValueError(f"a round trip cannot be negative: {rtt_ms} ms")
        self.upstream = (upstream_host, upstream_port)
        self.rtt = rtt_ms / 1000
        self.links: set[_Link] = set()
        self.port = port
        self.endpoint_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> asyncio.Server:
        """Start listening on the running loop (the process form runs it in its main thread)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server = await loop.create_server(
            lambda: _End(_Link(self, loop), 0), "127.0.0.1", self.port, backlog=512
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        return self._server

    def shutdown(self) -> None:
        """Stop listening and drop every connection (on the loop's thread)."""
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.abort()
        self.links.clear()

    def start(self) -> DelayProxy:
        """Serve from a thread of this process; returns once the port listens."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        def finish() -> None:
            self.shutdown()
            assert loop is not None
            # One more turn so the aborted transports run their connection_lost.
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(finish)
        thread.join(timeout=10)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _serve_until_signalled(proxy: DelayProxy) -> None:
    await proxy.serve()
    print(proxy.port, flush=True)  # the launcher reads the port from this one line
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    proxy.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pffs.testing.delay", description=__doc__)
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, required=True, help="round trip to add, in ms")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (any free one)")
    args = parser.parse_args(argv)
    if args.rtt_ms < 0:
        parser.error(f"--rtt-ms cannot be negative: {args.rtt_ms}")
    host, port = args.upstream
    proxy = DelayProxy(port, rtt_ms=args.rtt_ms, upstream_host=host, port=args.port)
    try:
        asyncio.run(_serve_until_signalled(proxy))
    except OSError as exc:
        print(f"delay proxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

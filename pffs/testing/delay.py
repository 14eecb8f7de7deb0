"""A TCP proxy that puts a store far away: every byte is held RTT/2 in each direction.

The kernel here has no netem, so the bench makes its far store in userspace. `DelayProxy`
listens on 127.0.0.1 and forwards each connection to an upstream server (moto, s3rver, RGW);
the bytes read from one side at once are stamped "due at arrival + RTT/2" and written to the
other side when due. Streams stay pipelined (the reader never waits for the writer), so the
bandwidth of a stream is kept and only its latency grows, as on a long fat network. Opening a
connection costs one round trip too, as a TCP handshake does: the first bytes a client sends
are due no earlier than one RTT after it connected, plus RTT/2.

It is lean on CPU, because it shares the machine with the store and the clients, and a real
network's distance costs a client's machine nothing. The bytes never enter the process: each
read is a splice(2) from the socket into a pipe of its own (the kernel hands the socket's
pages over), and each pipe is spliced on to the other socket when due. A copy through user
space cost about 0.8 CPU-s per GiB forwarded here, most of it the two copies and the pages the
received chunks were put in (docs/notes/delay-proxy-splice.md). One asyncio thread serves every
connection; one timer per direction at a time. Backpressure: a direction holding
`PIPES_IN_FLIGHT` pipes stops reading its source until some are written.

In-process (`with DelayProxy(port, rtt_ms=20) as proxy:` then `proxy.endpoint_url`), or as a
process of its own, which keeps it off the GIL of whatever it measures:
`python -m pffs.testing.delay --upstream 127.0.0.1:9000 --rtt-ms 20` prints its port and serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import fcntl
import os
import signal
import socket
import sys
import threading

from pffs.testing.servers import Service

# The most one splice moves, and each pipe's capacity (Linux's default pipe-max-size).
_PIPE_BYTES = 1 << 20
# Pipes a direction may hold before its source stops being read, two descriptors each. A read
# moved 220 KiB on average at 1.4 GB/s here, so 64 hold more than a bandwidth-delay product
# at a GB/s and 20 ms: backpressure never throttles a healthy stream.
PIPES_IN_FLIGHT = 64
# Out of descriptors: how long a source or the listener rests before it is read again.
_RETRY_AFTER_EMFILE = 0.05
# Empty pipes kept for the next reads, across connections.
_SPARE_PIPES = 256
# Linux's TCP_QUICKACK (None elsewhere): see _Direction.read.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
# What a connection's end may answer a read or a write with when the peer is gone.
_GONE = (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ETIMEDOUT, errno.EHOSTUNREACH)


class _Pipes:
    """Empty pipes, reused: a pipe is two descriptors and a system call to make."""

    def __init__(self) -> None:
        self._spare: list[tuple[int, int]] = []

    def take(self) -> tuple[int, int]:
        if self._spare:
            return self._spare.pop()
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Under a lower pipe-max-size the pipe keeps its size, and splices move less.
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        return read_end, write_end

    def give(self, pipe: tuple[int, int]) -> None:
        """An emptied pipe back to the pool (closed when the pool is full)."""
        if len(self._spare) < _SPARE_PIPES:
            self._spare.append(pipe)
        else:
            _close_pipe(pipe)

    def close(self) -> None:
        for pipe in self._spare:
            _close_pipe(pipe)
        self._spare.clear()


def _close_pipe(pipe: tuple[int, int]) -> None:
    for fd in pipe:
        os.close(fd)


class _Held:
    """Bytes read at once from one side, in a pipe, until due; a pipe of None: the side's EOF."""

    __slots__ = ("due", "left", "pipe")

    def __init__(self, due: float, pipe: tuple[int, int] | None, left: int) -> None:
        self.due = due
        self.pipe = pipe
        self.left = left


class _Direction:
    """One direction of one link: `source`'s bytes held in pipes until due, then spliced on to
    `target` in order, followed by an EOF when `source` ended."""

    def __init__(
        self,
        link: _Link,
        source: socket.socket,
        hold: float,
        not_before: float,
        quickack: bool,
    ) -> None:
        self._link = link
        self._loop = link.loop
        self._pipes = link.proxy.pipes
        self.source = source
        self.target: socket.socket | None = None  # set once the other side is connected
        self._hold = hold
        self._not_before = not_before  # no byte leaves before this (the handshake's round trip)
        self._quickack = quickack
        self._held: collections.deque[_Held] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._reading = False
        self._waiting_to_write = False
        self.source_ended = False
        self.ended = False  # the EOF went through, or the link closed

    def start_reading(self) -> None:
        if not self._reading and not self.source_ended and not self._link.closed:
            self._reading = True
            self._loop.add_reader(self.source.fileno(), self.read)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self.source.fileno())

    def read(self) -> None:
        """Splice what the source has into pipes, each stamped with when it is due."""
        due = max(self._loop.time(), self._not_before) + self._hold
        while len(self._held) < PIPES_IN_FLIGHT:
            try:
                pipe = self._pipes.take()
            except OSError as exc:  # out of descriptors: read again once some are back
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                self._stop_reading()
                self._loop.call_later(_RETRY_AFTER_EMFILE, self.start_reading)
                return
            try:
                moved = os.splice(self.source.fileno(), pipe[1], _PIPE_BYTES, flags=_FLAGS)
            except BlockingIOError:
                self._pipes.give(pipe)
                break
            except OSError as exc:
                if exc.errno not in _GONE:
                    self._pipes.give(pipe)
                    raise
                moved = 0  # reset by the peer: what it sent before still travels, then an EOF
            if moved == 0:
                self._pipes.give(pipe)
                self._stop_reading()
                self.source_ended = True
                self._hold_bytes(_Held(due, None, 0))
                self._link.source_ended()
                return
            self._hold_bytes(_Held(due, pipe, moved))
        else:
            self._stop_reading()  # backpressure: resumed as pipes are written
        if self._quickack and _QUICKACK is not None:
            # The proxy is a wire, not a client: its own delayed ACKs (40 ms) must not hold
            # back a server that leaves Nagle's algorithm on (RGW by default), which waits
            # for the ACK of an answer's headers before a small body. So it acknowledges at
            # once, as a client that sets TCP_QUICKACK does (pffs does); a client that delays
            # its ACKs would pay them against a real far server, which the proxy cannot show.
            self.source.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def held_pipes(self) -> int:
        """Pipes holding this direction's bytes now (for tests)."""
        return sum(held.pipe is not None for held in self._held)

    def _hold_bytes(self, held: _Held) -> None:
        self._held.append(held)
        if len(self._held) == 1:
            self._schedule()

    def connected(self, target: socket.socket) -> None:
        self.target = target
        self._schedule()

    def _schedule(self) -> None:
        idle = self._timer is None and not self._waiting_to_write
        if idle and self._held and self.target is not None:
            self._timer = self._loop.call_at(self._held[0].due, self.write)

    def write(self) -> None:
        """Splice every due pipe on to the target, in order; wait for room when it is full."""
        self._timer = None
        if self._waiting_to_write:
            self._waiting_to_write = False
            self._loop.remove_writer(self._target_fd())
        now = self._loop.time()
        while self._held and self._held[0].due <= now:
            held = self._held[0]
            if held.pipe is None:  # the source's EOF, after all it sent
                self._held.popleft()
                self._end()
                return
            try:
                moved = os.splice(held.pipe[0], self._target_fd(), held.left, flags=_FLAGS)
            except BlockingIOError:
                self._waiting_to_write = True
                self._loop.add_writer(self._target_fd(), self.write)
                return
            except OSError as exc:
                if exc.errno not in _GONE:
                    raise
                self._link.close()  # nothing more can reach the target
                return
            held.left -= moved
            if held.left == 0:
                self._held.popleft()
                self._pipes.give(held.pipe)
                self.start_reading()
        self._schedule()

    def _target_fd(self) -> int:
        assert self.target is not None
        return self.target.fileno()

    def _end(self) -> None:
        assert self.target is not None
        with contextlib.suppress(OSError):  # the target is gone already
            self.target.shutdown(socket.SHUT_WR)
        self.ended = True
        self._link.direction_ended()

    def close(self) -> None:
        """Stop everything this direction does; pipes still holding bytes are closed."""
        self._stop_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting_to_write and self.target is not None:
            self._loop.remove_writer(self.target.fileno())
        self._waiting_to_write = False
        for held in self._held:
            if held.pipe is not None:
                _close_pipe(held.pipe)
        self._held.clear()
        self.ended = True


class _Link:
    """One proxied connection: the client's socket and the upstream's, a direction each way."""

    def __init__(self, proxy: DelayProxy, client: socket.socket) -> None:
        assert proxy.loop is not None
        self.proxy = proxy
        self.loop = proxy.loop
        self.closed = False
        self.client = client
        self.upstream: socket.socket | None = None
        self.hold = proxy.rtt / 2
        now = self.loop.time()
        self.up = _Direction(self, client, self.hold, now + proxy.rtt, quickack=False)
        self.down: _Direction | None = None
        self.up.start_reading()
        # Referenced while it runs: the loop keeps only a weak reference to a task.
        self._connecting = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            await self.loop.sock_connect(upstream, self.proxy.upstream)
        except OSError:
            upstream.close()
            self.close()
            return
        if self.closed:  # the client left while the upstream connection was being opened
            upstream.close()
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream = upstream
        self.down = _Direction(self, upstream, self.hold, 0.0, quickack=True)
        self.down.connected(self.client)
        self.down.start_reading()
        self.up.connected(upstream)

    def source_ended(self) -> None:
        if self.upstream is None and self.up.source_ended:
            self.close()  # the client left before the upstream answered the connection

    def direction_ended(self) -> None:
        if self.up.ended and self.down is not None and self.down.ended:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for direction in (self.up, self.down):
            if direction is not None:
                direction.close()
        for sock in (self.client, self.upstream):
            if sock is not None:
                sock.close()
        self.proxy.links.discard(self)


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
        self.pipes = _Pipes()
        self.port = port
        self.endpoint_url = ""
        self.loop: asyncio.AbstractEventLoop | None = None  # set by serve
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> None:
        """Start listening on the running loop (the process form runs it in its main thread)."""
        self.loop = asyncio.get_running_loop()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", self.port))
            listener.listen(512)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.loop.add_reader(listener.fileno(), self._accept)

    def _accept(self) -> None:
        assert self._listener is not None and self.loop is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors: accept again once some are back
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                self.loop.remove_reader(self._listener.fileno())
                self.loop.call_later(_RETRY_AFTER_EMFILE, self._listen_again)
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.links.add(_Link(self, client))

    def _listen_again(self) -> None:
        if self._listener is not None and self.loop is not None:
            self.loop.add_reader(self._listener.fileno(), self._accept)

    def shutdown(self) -> None:
        """Stop listening and drop every connection (on the loop's thread)."""
        if self._listener is not None and self.loop is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for link in list(self.links):
            link.close()
        self.links.clear()
        self.pipes.close()

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
        loop, thread = self.loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        def finish() -> None:
            self.shutdown()
            assert loop is not None
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

"""The lean GET engine's pool of connections (backends/s3connections.py) against a real TCP
server that counts the connections it accepts: the warm spare opened when a request takes the
last idle connection, none for a pool that keeps no idle connection, none kept after close.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pffs.backends.s3connections import Connection, Connections


class _Acceptor:
    """A listening socket on 127.0.0.1 that accepts connections and holds them open."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # closed at the end of the test
                return
            self.accepted.append(sock)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.listener.close()
        for sock in self.accepted:
            sock.close()


@pytest.fixture
def acceptor() -> Iterator[_Acceptor]:
    server = _Acceptor()
    yield server
    server.close()


def _pool(acceptor: _Acceptor, max_idle: int) -> Connections:
    return Connections("http", f"127.0.0.1:{acceptor.port}", 2.0, 5.0, True, max_idle)


def _until(condition: Callable[[], bool]) -> None:
    """Wait for something another thread does (bounded: a failure, never a hang)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_taking_the_last_idle_connection_has_a_spare_opened(acceptor: _Acceptor) -> None:
    pool = _pool(acceptor, 4)
    first, reused = pool.take()  # none idle: a new one, and a spare beside it
    assert not reused
    _until(lambda: len(pool._idle) == 1)
    _until(lambda: len(acceptor.accepted) == 2)  # its accept thread may lag the connect
    pool.give(first)
    # A reader's two GETs at once (its bytes, the block behind them): both on warm connections.
    taken = [pool.take(), pool.take()]
    assert [reused for _, reused in taken] == [True, True]
    _until(lambda: len(pool._idle) == 1)  # the second left none idle: one spare more
    _until(lambda: len(acceptor.accepted) == 3)
    for connection, _ in taken:
        pool.give(connection)
    # With idle ones left, a take opens nothing.
    again, reused = pool.take()
    assert reused
    time.sleep(0.2)
    assert len(acceptor.accepted) == 3
    pool.give(again)
    pool.close()


def test_a_pool_that_keeps_none_idle_opens_no_spare(acceptor: _Acceptor) -> None:
    """A probe's pool: each probe connects afresh, and nothing is opened beside it."""
    pool = _pool(acceptor, 0)
    connection, reused = pool.take()
    assert not reused
    _until(lambda: len(acceptor.accepted) == 1)
    time.sleep(0.2)  # time for a spare, were one opened
    assert len(acceptor.accepted) == 1
    pool.give(connection)  # closed, not kept
    assert pool._idle == []


def test_a_spare_arriving_after_close_is_not_kept(acceptor: _Acceptor) -> None:
    pool = _pool(acceptor, 4)
    arrived = threading.Event()
    connect = pool._connect

    def slow_connect() -> socket.socket:
        arrived.wait(10)  # the spare connects only once the pool is closed
        return connect()

    first = Connection(connect(), 0)
    pool.give(first)
    pool._connect = slow_connect  # type: ignore[method-assign]
    taken, reused = pool.take()  # the last idle one: a spare starts, held in its connect
    assert reused
    pool.close()
    arrived.set()
    _until(lambda: not pool._spare_opening)
    assert pool._idle == []
    taken.close()


def test_a_spare_that_cannot_connect_is_only_logged() -> None:
    with socket.socket() as unused:  # a port bound a moment, where nothing listens
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    pool = Connections("http", f"127.0.0.1:{port}", 2.0, 5.0, True, 4)
    with pytest.raises(OSError):
        pool.take()  # the request's own connection fails, as before
    _until(lambda: not pool._spare_opening)
    assert pool._idle == []


def test_a_spare_connecting_across_a_renew_is_let_go_and_opened_again(
    acceptor: _Acceptor,
) -> None:
    """Issue 49: a spare whose connect started before the source came back (renew) may lead
    nowhere: it is closed on arrival and another is opened, of the new generation; a
    connection in use at the renew is closed when handed back, not kept."""
    pool = _pool(acceptor, 4)
    arrived = threading.Event()
    connect = pool._connect
    connects = []

    def held_connect() -> socket.socket:
        connects.append(pool._generation)
        if len(connects) == 1:
            arrived.wait(10)  # the first spare connects across the renew
        return connect()

    in_use = Connection(connect(), 0)
    pool._connect = held_connect  # type: ignore[method-assign]
    pool._open_spare()
    _until(lambda: len(connects) == 1)
    pool.renew()  # the spare is still connecting: renew's own spare waits for it
    arrived.set()
    _until(lambda: not pool._spare_opening)
    assert connects == [0, 1]
    assert [c.generation for c in pool._idle] == [1]
    pool.give(in_use)  # opened before the renew: closed, not kept
    assert in_use.sock.fileno() == -1
    assert len(pool._idle) == 1
    pool.close()

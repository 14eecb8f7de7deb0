"""pffs.jobs's choice of channel, against a directory laid out as a mount's `.pffs` (no
mount: a plain directory and a real unix socket stand in for pffs's). The socket is preferred;
without one, or with a socket nobody listens on (a mount closing it as it unmounts), the list
is written to the preload file."""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path

import pytest

from pffs import jobs
from pffs.config import OrderLimits
from pffs.jobs import preload_order


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / ".pffs").mkdir()
    (tmp_path / ".pffs" / "preload").write_text("")
    return tmp_path


def test_without_a_socket_the_list_goes_to_the_preload_file(root: Path) -> None:
    # A plain file reads back what was written: the list, whose first line stands for the report's
    # "queued N".
    assert preload_order(str(root), ["a", f"{root}/b", "/c"]) == ["b", "c"]
    assert (root / ".pffs" / "preload").read_text() == "a\nb\nc\n"


def test_a_socket_nobody_listens_on_leaves_the_preload_file(root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as closed:
        closed.bind(str(root / ".pffs" / "preload.sock"))  # bound, never listening
    assert preload_order(str(root), ["x", "y"]) == ["y"]
    assert (root / ".pffs" / "preload").read_text() == "x\ny\n"


def serve_once(listener: socket.socket, answer: bytes, received: list[bytes]) -> None:
    connection, _ = listener.accept()
    with connection:
        data = b""
        while chunk := connection.recv(4096):
            data += chunk
        received.append(data)
        connection.sendall(answer)


def test_the_socket_is_preferred_and_its_report_returned(root: Path) -> None:
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(root / ".pffs" / "preload.sock"))
        listener.listen()
        answer = b"queued 1\nnope: no such file\n"
        server = threading.Thread(target=serve_once, args=(listener, answer, received))
        server.start()
        assert preload_order(str(root), ["train/1.jpg", "", "nope"]) == ["nope: no such file"]
        server.join(10)
    assert received == [b"train/1.jpg\nnope\n"]
    assert (root / ".pffs" / "preload").read_text() == ""  # the file left alone


def test_a_socket_closed_without_an_answer_is_an_error(root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(root / ".pffs" / "preload.sock"))
        listener.listen()
        server = threading.Thread(target=serve_once, args=(listener, b"", []))
        server.start()
        with pytest.raises(ConnectionResetError) as reset:
            preload_order(str(root), ["a"])
        server.join(10)
    assert reset.value.errno == errno.ECONNRESET


def test_a_long_order_goes_as_lists_within_the_caps_and_a_refusal_raises(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's caps are the mount's defaults; an order past them goes over as several
    lists, in order; a list the mount refuses raises OrderRefused with its reason."""
    limits = OrderLimits()
    assert (limits.max_lines, limits.max_bytes) == (jobs.LIST_LINES, jobs.LIST_BYTES)
    monkeypatch.setattr(jobs, "LIST_LINES", 3)
    monkeypatch.setattr(jobs, "LIST_BYTES", 8)  # "aa\n" is 3 bytes: two lines fit
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(root / ".pffs" / "preload.sock"))
        listener.listen()

        def serve() -> None:
            for answer in (b"queued 2\n", b"queued 1\nx: bad\n", b"queued 1\n"):
                serve_once(listener, answer, received)

        server = threading.Thread(target=serve)
        server.start()
        assert preload_order(str(root), ["aa", "bb", "cc", "ddddd", "e"]) == ["x: bad"]
        server.join(10)
        assert received == [b"aa\nbb\n", b"cc\n", b"ddddd\ne\n"]

        server = threading.Thread(
            target=serve_once, args=(listener, b"refused: the list is over 8 bytes\n", [])
        )
        server.start()
        with pytest.raises(jobs.OrderRefused) as refused:
            preload_order(str(root), ["a"])
        server.join(10)
    assert refused.value.strerror == "the list is over 8 bytes"

"""The preload socket's caps on a real mount, against real client processes' sockets: a client
streaming 1 GiB is refused at the byte cap, 1,000 idle connections are refused beyond the
connection cap or cut off at the connection's lifetime (a short `--order-timeout`), the mount's
RSS meanwhile grows by at most 64 MiB, reads go on with exact bytes, and a list sent afterwards
is taken. Mounts of a `file://` tree, as root (open_tree needs CAP_SYS_ADMIN)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from pffs.config import OrderLimits
from pffs.jobs import preload_order
from tests.conftest import mounted

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(os.geteuid() != 0, reason="the preload socket needs CAP_SYS_ADMIN"),
]

MIB = 1 << 20
LIFETIME = 2.0  # --order-timeout: how long an idle connection holds its slot
IDLE_CONNECTIONS = 1000
FILES = IDLE_CONNECTIONS // 20 + 1
FILE_SIZE = 256 * 1024


def _content(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(251)) * (FILE_SIZE // 251 + 1)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "data").mkdir(parents=True)
    for i in range(FILES):
        (root / "data" / f"{i}.bin").write_bytes(_content(i)[:FILE_SIZE])
    return root


def _connect(mnt: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(mnt / ".pffs" / "preload.sock"))
    return sock


def _daemon_pid(mnt: Path) -> int:
    """The mount's process, as the kernel names the other end of its preload socket."""
    with _connect(mnt) as sock:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        ))  # fmt: skip
    return int(pid)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _answer(sock: socket.socket, timeout: float) -> bytes:
    """What the mount sends before it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _stream(mnt: Path, result: dict[str, object]) -> None:
    """1 GiB into the socket, as fast as the mount takes it; how far it got, and its answer."""
    chunk = b"data/0.bin\n" * (MIB // 11)
    sent = 0
    with _connect(mnt) as sock:
        try:
            while sent < 1 << 30:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        result["sent"] = sent
        result["answer"] = _answer(sock, 10)


def test_a_flood_is_refused_and_cut_off_while_reads_go_on(tmp_path: Path, tree: Path) -> None:
    with mounted(
        f"file://{tree}", tmp_path / "mnt", "--cache-dir", "none",
        "--order-timeout", str(LIFETIME),
    ) as mnt:  # fmt: skip
        pid = _daemon_pid(mnt)
        assert (mnt / "data" / "0.bin").read_bytes() == _content(0)[:FILE_SIZE]
        before = _rss(pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        streamed: dict[str, object] = {}
        streamer = threading.Thread(target=_stream, args=(mnt, streamed))
        try:
            streamer.start()
            idle = []
            for i in range(IDLE_CONNECTIONS):
                idle.append(_connect(mnt))
                if i % 20 == 0:  # reads go on meanwhile, each file's bytes exact
                    n = i // 20 + 1
                    assert (mnt / "data" / f"{n}.bin").read_bytes() == _content(n)[:FILE_SIZE]
            streamer.join(30)
            assert not streamer.is_alive()
            answers = [_answer(sock, LIFETIME + 10) for sock in idle]
        finally:
            done.set()
            sampler.join()
            for sock in idle:
                sock.close()

        limits = OrderLimits()
        assert isinstance(streamed["sent"], int) and streamed["sent"] < 1 << 30
        assert (
            streamed["answer"] == f"refused: the list is over {limits.max_bytes} bytes\n".encode()
        )
        # Every idle connection ended: turned away at once, or cut off at its lifetime.
        busy = f"refused: {limits.connections} lists are being received already\n".encode()
        late = f"refused: no whole list within {LIFETIME:g} s\n".encode()
        assert set(answers) <= {busy, late}, set(answers)
        assert answers.count(late) <= limits.connections
        assert answers.count(busy) >= IDLE_CONNECTIONS - limits.connections
        assert peak[0] - before <= 64 * MIB, (before, peak[0])

        # The channel serves again once the flood is gone.
        assert preload_order(str(mnt), ["data/5.bin", "data/nope"]) == ["data/nope: no such file"]
        log = (tmp_path / "mnt.log").read_text()
        assert f"uid {os.getuid()} pid " in log
        assert "refused" in log

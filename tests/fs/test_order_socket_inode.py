"""The preload socket's side in the VFS, without a kernel: the one MKNOD pffs answers (its name
in `.pffs`, a thread of this process, once), the name found and listed only while bound, and
its lists handled as the preload file's, the report
the sender's alone. The socket's server on a real mount:
tests/mount/test_order_socket.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pffs.errors import NotFound, ReadOnly, Unsupported
from pffs.fs.inodes import ROOT_INODE
from pffs.fs.orders import order_lines
from pffs.fs.special import HIDDEN_DIR, PRELOAD_FILE, PRELOAD_SOCKET, STATS_FILE
from pffs.fs.vfs import Vfs
from tests.fs.helpers import KIB, dataset, preloading_vfs, read_whole, resolve, with_vfs


def test_the_order_socket_takes_lists_and_only_its_own_mknod(tmp_path: Path) -> None:
    """Its MKNOD, its name while bound, and its lists, reported as the preload file reports."""
    dataset(tmp_path, {"a": 3}, 2 * KIB)
    vfs, backend = preloading_vfs(tmp_path, trigger_files=100)

    async def body() -> None:
        pffs = await resolve(vfs, HIDDEN_DIR)
        not_ours = os.getppid()  # a process, not a thread of this one
        mine = threading.get_native_id()
        with pytest.raises(Unsupported):  # no special file in a store
            vfs.mknod(ROOT_INODE, "x.sock", True, mine)
        with pytest.raises(Unsupported):
            vfs.mknod(pffs, PRELOAD_SOCKET, False, mine)  # a fifo
        with pytest.raises(ReadOnly):
            vfs.mknod(pffs, "other.sock", True, mine)
        with pytest.raises(ReadOnly):
            vfs.mknod(pffs, PRELOAD_SOCKET, True, not_ours)
        with pytest.raises(NotFound):  # not there until bound
            await vfs.lookup(pffs, PRELOAD_SOCKET)
        socket = vfs.mknod(pffs, PRELOAD_SOCKET, True, mine)
        assert (await vfs.lookup(pffs, PRELOAD_SOCKET)).ino == socket.ino
        assert await list_names(vfs, pffs) == [STATS_FILE, PRELOAD_FILE, PRELOAD_SOCKET]
        with pytest.raises(ReadOnly):  # one at a time
            vfs.mknod(pffs, PRELOAD_SOCKET, True, mine)
        with pytest.raises(ReadOnly):
            await vfs.unlink(pffs, PRELOAD_SOCKET)

        report = await vfs.take_order(order_lines(b"a/001.bin\n\nmissing\n"))
        assert report == b"queued 1\nmissing: no such file\n"
        # The report is the socket client's alone: the preload file shows it to nobody.
        assert await read_whole(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}") == b""
        await vfs.datasets.engine.wait_idle()
        assert list(backend.reads) == ["a/001.bin"]

        vfs.special.socket_bound = False  # closed (pffs.mounting.ordersocket)
        with pytest.raises(NotFound):
            await vfs.lookup(pffs, PRELOAD_SOCKET)

    with_vfs(vfs, body)


async def list_names(vfs: Vfs, ino: int) -> list[str]:
    names: list[str] = []

    def emit(name: str, inode: object, next_id: int) -> bool:
        names.append(name)
        return True

    fh = await vfs.opendir(ino)
    await vfs.readdir(fh, 0, emit)
    vfs.releasedir(fh)
    return names

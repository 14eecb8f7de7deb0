"""The hidden `.pffs` directory at the root of the tree: its `stats` and `preload` files and its
`preload.sock` socket.

`.pffs/stats` is a read-only JSON snapshot of every metric (pffs.metrics.snapshot), fresh at each
open. `.pffs/preload` is the one writable file, on read-only mounts too: a job writes tree paths
to it, one a line (an order list), and on close or fsync pffs preloads them in that order
(pffs.fs.datasets);
reading it gives the report of the caller's own list (`queued N`, then one line per bad entry;
or `refused: ...` for a list over a cap, pffs.fs.orders): through the handle that wrote it, or
to a later open by the same process, never another's. The preload socket `.pffs/preload.sock`
takes the same lists where no file can be written (a read-only bind of the mount): the mount's
own process binds it (pffs.mounting.ordersocket), and the kernel asks for its inode with a
MKNOD that only a thread of this process gets answered. `.pffs` is found by lookup but never
listed by readdir, so `ls`, `find` and data loaders walking the tree do not see
it; a store object of the same name at the root is shadowed. Everything else under `.pffs`
refuses changes (EROFS). The facade (pffs.fs.vfs) asks `claims_*` before handing an operation to
the rest of the file system; the handles opened here are kept with all others
(pffs.fs.handles). `.pffs/prefetch`, the preload file's former name, is found by lookup too
(the same file, a log line the first time), never listed.
"""

from __future__ import annotations

import json
import logging
import os
import time

from pffs import metrics
from pffs.backends.base import ObjectInfo
from pffs.config import OrderLimits
from pffs.errors import (
    Exists,
    IsADirectory,
    NotADirectory,
    NotFound,
    ReadOnly,
    TooLarge,
    Unsupported,
)
from pffs.fs.handles import OrderHandle, SnapshotHandle
from pffs.fs.inodes import ROOT_INODE, FixedInode, Inode
from pffs.fs.orders import UNKNOWN_SENDER, OrderBuffer, OrderSlots, Sender, SenderReports, refusal

log = logging.getLogger(__name__)

HIDDEN_DIR = ".pffs"
STATS_FILE = "stats"
PRELOAD_FILE = "preload"
FORMER_PRELOAD_FILE = "prefetch"  # its name before this release: deprecated
PRELOAD_SOCKET = "preload.sock"
# Inode numbers far above any the namespace hands out (it counts up from 2).
HIDDEN_DIR_INO = (1 << 62) + 1
STATS_FILE_INO = (1 << 62) + 2
PRELOAD_FILE_INO = (1 << 62) + 3
PRELOAD_SOCKET_INO = (1 << 62) + 4


def stats_bytes() -> bytes:
    """The content of `.pffs/stats`: the metrics snapshot as indented JSON."""
    return json.dumps(metrics.snapshot(), indent=1, sort_keys=True).encode() + b"\n"


class SpecialFiles:
    """`.pffs` and the files in it: their inodes, the handles they open, the caps and reports
    of order lists."""

    def __init__(self, mount_time: float, limits: OrderLimits | None = None) -> None:
        self.dir = FixedInode(
            HIDDEN_DIR_INO,
            HIDDEN_DIR,
            ObjectInfo(HIDDEN_DIR, 0, mount_time, None, True),
            float("inf"),
        )
        self.stats_file = FixedInode(
            STATS_FILE_INO,
            f"{HIDDEN_DIR}/{STATS_FILE}",
            ObjectInfo(STATS_FILE, 0, mount_time, None, False),
            float("inf"),
        )
        self.preload_file = FixedInode(
            PRELOAD_FILE_INO,
            f"{HIDDEN_DIR}/{PRELOAD_FILE}",
            ObjectInfo(PRELOAD_FILE, 0, mount_time, None, False),
            float("inf"),
        )
        self.preload_socket = FixedInode(
            PRELOAD_SOCKET_INO,
            f"{HIDDEN_DIR}/{PRELOAD_SOCKET}",
            ObjectInfo(PRELOAD_SOCKET, 0, mount_time, None, False),
            float("inf"),
        )
        self.socket_bound = False  # while the mount's process listens on it
        self.limits = limits or OrderLimits()
        self.slots = OrderSlots(self.limits)  # shared with the preload socket
        self.reports = SenderReports()  # each process's last report
        self.former_name_seen = False  # `.pffs/prefetch` was looked up: logged once

    @property
    def inodes(self) -> tuple[int, ...]:
        return (self.dir.ino, self.stats_file.ino, self.preload_file.ino, self.preload_socket.ino)

    def listed(self) -> tuple[Inode, ...]:
        """The entries of `.pffs`, in readdir's order."""
        files = (self.stats_file, self.preload_file)
        return (*files, self.preload_socket) if self.socket_bound else files

    def inode(self, ino: int) -> Inode | None:
        """Our inode for `ino`, with fresh attributes, or None when it is not ours."""
        if ino == HIDDEN_DIR_INO:
            return self.dir
        if ino == STATS_FILE_INO:  # it changes all the time; its size is unknown (direct_io)
            self.stats_file.info = ObjectInfo(STATS_FILE, 0, time.time(), None, False)
            return self.stats_file
        if ino == PRELOAD_FILE_INO:
            return self.preload_file
        if ino == PRELOAD_SOCKET_INO:  # asked for by the kernel also after it closed
            return self.preload_socket
        return None

    @staticmethod
    def claims_name(parent_ino: int, name: str) -> bool:
        """Whether `name` in directory `parent_ino` is ours (`.pffs` or anything in it)."""
        return parent_ino == HIDDEN_DIR_INO or (parent_ino == ROOT_INODE and name == HIDDEN_DIR)

    @staticmethod
    def claims_path(path: str) -> bool:
        return path == HIDDEN_DIR or path.startswith(HIDDEN_DIR + "/")

    def is_read_only(self, path: str) -> bool:
        return self.claims_path(path) and path != self.preload_file.path

    @staticmethod
    def refuse(what: str) -> ReadOnly:
        return ReadOnly(f"{what}: /{HIDDEN_DIR} is read-only")

    def refuse_mkdir(self, parent_ino: int, name: str) -> Exists | ReadOnly:
        if parent_ino == ROOT_INODE and name == HIDDEN_DIR:
            return Exists(f"/{HIDDEN_DIR} exists")
        return self.refuse("mkdir")

    def lookup(self, parent_ino: int, name: str, root: Inode) -> Inode | None:
        """Our answer to a lookup, or None when the name is not ours."""
        if parent_ino == ROOT_INODE and name == HIDDEN_DIR:
            return self.dir
        if parent_ino == HIDDEN_DIR_INO:
            if name == STATS_FILE:
                return self.stats_file
            if name == PRELOAD_FILE:
                return self.preload_file
            if name == FORMER_PRELOAD_FILE:
                self._note_former_name()
                return self.preload_file
            if name == PRELOAD_SOCKET and self.socket_bound:
                return self.preload_socket
            if name == ".":
                return self.dir
            if name == "..":
                return root
            raise NotFound(f"/{HIDDEN_DIR}/{name} does not exist")
        if parent_ino in (STATS_FILE_INO, PRELOAD_FILE_INO, PRELOAD_SOCKET_INO):
            raise NotADirectory(f"/{HIDDEN_DIR}/{STATS_FILE} is not a directory")
        return None

    def _note_former_name(self) -> None:
        if not self.former_name_seen:
            self.former_name_seen = True
            log.warning(
                "/%s/%s is deprecated and will be removed, use /%s/%s",
                *(HIDDEN_DIR, FORMER_PRELOAD_FILE, HIDDEN_DIR, PRELOAD_FILE),
            )

    def check_opendir(self, ino: int) -> None:
        ours = self.inode(ino)
        if ours is not None and not ours.is_dir:
            raise NotADirectory(f"/{ours.path} is not a directory")

    def bind_socket(self, parent_ino: int, name: str, caller_tid: int) -> Inode:
        """The MKNOD of the preload socket's bind(): answered for that one name, to a thread of
        this process (the kernel names the calling thread), while no socket is bound."""
        if parent_ino != HIDDEN_DIR_INO or name != PRELOAD_SOCKET:
            raise self.refuse("mknod")
        if self.socket_bound or not os.path.exists(f"/proc/self/task/{caller_tid}"):
            raise self.refuse(f"mknod {PRELOAD_SOCKET}")
        self.socket_bound = True
        return self.preload_socket

    def open(
        self, ino: int, for_writing: bool, sender: Sender = UNKNOWN_SENDER
    ) -> SnapshotHandle | OrderHandle | None:
        """A handle on `ino` if it is ours (None when not): the preload file written takes an
        order list; read, the stats file gives one consistent snapshot and the preload file
        `sender`'s last report."""
        if ino == HIDDEN_DIR_INO:
            raise IsADirectory(f"/{HIDDEN_DIR} is a directory")
        if ino == PRELOAD_FILE_INO:
            if not for_writing:
                return SnapshotHandle(self.reports.of(sender))
            self.slots.take()
            return OrderHandle(OrderBuffer(self.limits), sender)
        if ino == PRELOAD_SOCKET_INO:  # the kernel connects to a socket, never opens it here
            raise Unsupported(f"open: /{self.preload_socket.path} is a socket")
        if ino != STATS_FILE_INO:
            return None
        if for_writing:
            raise self.refuse("open for writing")
        return SnapshotHandle(stats_bytes())

    def write_order(self, handle: OrderHandle, offset: int, data: bytes) -> int:
        """Bytes written to `.pffs/preload` (kept until the handle is flushed)."""
        try:
            handle.buffer.write(offset, data)
        except TooLarge as exc:
            self.note_refusal(handle, exc)
            raise
        return len(data)

    def take_order(self, handle: OrderHandle) -> list[str]:
        """The paths written through `handle` since its last flush, one a line."""
        try:
            return handle.buffer.take()
        except TooLarge as exc:
            self.note_refusal(handle, exc)
            raise

    def note_refusal(self, handle: OrderHandle, exc: TooLarge) -> None:
        log.warning("order list from %s refused: %s", handle.sender, exc)
        self.note_report(handle, refusal(str(exc)))

    def note_report(self, handle: OrderHandle, text: bytes) -> None:
        """The report of the list `handle` handed over: its own, and its process's."""
        handle.report = text
        self.reports.note(handle.sender, text)

    def release(self, handle: OrderHandle) -> None:
        """`handle` is closed: its slot is free for another order list."""
        self.slots.give_back()

"""The hidden `.pffs` directory at the root of the tree, its `stats` and `preload` files.

`.pffs/stats` is a read-only JSON snapshot of every metric (pffs.metrics.snapshot), fresh at each
open. `.pffs/preload` is the one writable file, on read-only mounts too: a job writes tree paths
to it, one a line, and on close or fsync pffs preloads them in that order (pffs.fs.datasets);
reading it gives the report of the caller's own list (`queued N`, then one line per bad entry;
or `refused: ...` for a list over a cap, pffs.fs.orders): through the handle that wrote it, or
to a later open by the same process, never another's. `.pffs/preload.sock` takes the same
lists where no file can be written (a read-only bind of the mount): the mount's own process
binds it (pffs.mounting.ordersocket), and the kernel asks for its inode with a MKNOD that only
a thread of this process gets answered. `.pffs` is found by
lookup but never listed by readdir, so `ls`, `find` and data loaders walking the tree do not see
it; a store object of the same name at the root is shadowed. Everything else under `.pffs`
refuses changes (EROFS). The facade (pffs.fs.vfs) asks `claims_*` before handing an operation to
the rest of the file system. `.pffs/prefetch`, the control file's former name, is found by
lookup too (the same file, a log line the first time), never listed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from pffs import metrics
from pffs.backends.base import ObjectInfo
from pffs.config import OrderLimits
from pffs.errors import Exists, IsADirectory, NotADirectory, NotFound, ReadOnly, TooLarge
from pffs.fs.inodes import ROOT_INODE, FixedInode, Inode
from pffs.fs.orders import (
    UNKNOWN_SENDER,
    OrderBuffer,
    OrderSlots,
    Sender,
    SenderReports,
    refusal,
)

log = logging.getLogger(__name__)

STATS_DIR = ".pffs"
STATS_FILE = "stats"
PRELOAD_FILE = "preload"
FORMER_PRELOAD_FILE = "prefetch"  # its name before this release: deprecated
ORDER_SOCKET = "preload.sock"
# Inode numbers far above any the namespace hands out (it counts up from 2).
STATS_DIR_INO = (1 << 62) + 1
STATS_FILE_INO = (1 << 62) + 2
PRELOAD_FILE_INO = (1 << 62) + 3
ORDER_SOCKET_INO = (1 << 62) + 4


def stats_bytes() -> bytes:
    """The content of `.pffs/stats`: the metrics snapshot as indented JSON."""
    return json.dumps(metrics.snapshot(), indent=1, sort_keys=True).encode() + b"\n"


@dataclass
class OrderHandle:
    """A handle of `.pffs/preload` open for writing: the list it is given, who opened it, the
    report of its last list."""

    buffer: OrderBuffer
    sender: Sender
    report: bytes = b""


class SpecialFiles:
    """`.pffs` and `.pffs/stats`: their inodes, open stats handles and directory handles."""

    def __init__(self, mount_time: float, limits: OrderLimits | None = None) -> None:
        self.dir = FixedInode(
            STATS_DIR_INO, STATS_DIR, ObjectInfo(STATS_DIR, 0, mount_time, None, True), float("inf")
        )
        self.file = FixedInode(
            STATS_FILE_INO,
            f"{STATS_DIR}/{STATS_FILE}",
            ObjectInfo(STATS_FILE, 0, mount_time, None, False),
            float("inf"),
        )
        self.control = FixedInode(
            PRELOAD_FILE_INO,
            f"{STATS_DIR}/{PRELOAD_FILE}",
            ObjectInfo(PRELOAD_FILE, 0, mount_time, None, False),
            float("inf"),
        )
        self.socket = FixedInode(
            ORDER_SOCKET_INO,
            f"{STATS_DIR}/{ORDER_SOCKET}",
            ObjectInfo(ORDER_SOCKET, 0, mount_time, None, False),
            float("inf"),
        )
        self.socket_bound = False  # while the mount's process listens on it
        self.reads: dict[int, bytes] = {}  # open handles read from: their snapshot
        self.limits = limits or OrderLimits()
        self.orders: dict[int, OrderHandle] = {}  # `preload` handles open for writing
        self.slots = OrderSlots(self.limits)  # shared with the order socket
        self.reports = SenderReports()  # each process's last report
        self.dir_handles: set[int] = set()
        self.former_name_seen = False  # `.pffs/prefetch` was looked up: logged once

    @property
    def inodes(self) -> tuple[int, ...]:
        return (self.dir.ino, self.file.ino, self.control.ino, self.socket.ino)

    def listed(self) -> tuple[Inode, ...]:
        """The entries of `.pffs`, in readdir's order."""
        files = (self.file, self.control)
        return (*files, self.socket) if self.socket_bound else files

    def inode(self, ino: int) -> Inode | None:
        """Our inode for `ino`, with fresh attributes, or None when it is not ours."""
        if ino == STATS_DIR_INO:
            return self.dir
        if ino == STATS_FILE_INO:  # it changes all the time; its size is unknown (direct_io)
            self.file.info = ObjectInfo(STATS_FILE, 0, time.time(), None, False)
            return self.file
        if ino == PRELOAD_FILE_INO:
            return self.control
        if ino == ORDER_SOCKET_INO:  # asked for by the kernel also after it closed
            return self.socket
        return None

    @staticmethod
    def claims_name(parent_ino: int, name: str) -> bool:
        """Whether `name` in directory `parent_ino` is ours (`.pffs` or anything in it)."""
        return parent_ino == STATS_DIR_INO or (parent_ino == ROOT_INODE and name == STATS_DIR)

    @staticmethod
    def claims_path(path: str) -> bool:
        return path == STATS_DIR or path.startswith(STATS_DIR + "/")

    def is_read_only(self, path: str) -> bool:
        return self.claims_path(path) and path != self.control.path

    @staticmethod
    def refuse(what: str) -> ReadOnly:
        return ReadOnly(f"{what}: /{STATS_DIR} is read-only")

    def refuse_mkdir(self, parent_ino: int, name: str) -> Exists | ReadOnly:
        if parent_ino == ROOT_INODE and name == STATS_DIR:
            return Exists(f"/{STATS_DIR} exists")
        return self.refuse("mkdir")

    def lookup(self, parent_ino: int, name: str, root: Inode) -> Inode | None:
        """Our answer to a lookup, or None when the name is not ours."""
        if parent_ino == ROOT_INODE and name == STATS_DIR:
            return self.dir
        if parent_ino == STATS_DIR_INO:
            if name == STATS_FILE:
                return self.file
            if name == PRELOAD_FILE:
                return self.control
            if name == FORMER_PRELOAD_FILE:
                self._note_former_name()
                return self.control
            if name == ORDER_SOCKET and self.socket_bound:
                return self.socket
            if name == ".":
                return self.dir
            if name == "..":
                return root
            raise NotFound(f"/{STATS_DIR}/{name} does not exist")
        if parent_ino in (STATS_FILE_INO, PRELOAD_FILE_INO, ORDER_SOCKET_INO):
            raise NotADirectory(f"/{STATS_DIR}/{STATS_FILE} is not a directory")
        return None

    def _note_former_name(self) -> None:
        if not self.former_name_seen:
            self.former_name_seen = True
            log.warning(
                "/%s/%s is deprecated and will be removed, use /%s/%s",
                *(STATS_DIR, FORMER_PRELOAD_FILE, STATS_DIR, PRELOAD_FILE),
            )

    def check_opendir(self, ino: int) -> None:
        ours = self.inode(ino)
        if ours is not None and not ours.is_dir:
            raise NotADirectory(f"/{ours.path} is not a directory")

    def bind_socket(self, parent_ino: int, name: str, caller_tid: int) -> Inode:
        """The MKNOD of the order socket's bind(): answered for that one name, to a thread of
        this process (the kernel names the calling thread), while no socket is bound."""
        if parent_ino != STATS_DIR_INO or name != ORDER_SOCKET:
            raise self.refuse("mknod")
        if self.socket_bound or not os.path.exists(f"/proc/self/task/{caller_tid}"):
            raise self.refuse(f"mknod {ORDER_SOCKET}")
        self.socket_bound = True
        return self.socket

    def open(self, ino: int, fh: int, for_writing: bool, sender: Sender = UNKNOWN_SENDER) -> bool:
        """Open `ino` as handle `fh` if it is ours (True), with one consistent snapshot."""
        if ino == STATS_DIR_INO:
            raise IsADirectory(f"/{STATS_DIR} is a directory")
        if ino == PRELOAD_FILE_INO:
            if for_writing:
                self.slots.take()
                self.orders[fh] = OrderHandle(OrderBuffer(self.limits), sender)
            else:
                self.reads[fh] = self.reports.of(sender)
            return True
        if ino != STATS_FILE_INO:
            return False
        if for_writing:
            raise self.refuse("open for writing")
        self.reads[fh] = stats_bytes()
        return True

    def snapshot(self, fh: int) -> bytes | None:
        """What handle `fh` reads, if it is ours: a snapshot, or its own list's report."""
        order = self.orders.get(fh)
        return order.report if order is not None else self.reads.get(fh)

    def write_order(self, fh: int, offset: int, data: bytes) -> int:
        """Bytes written to `.pffs/preload` (kept until the handle is flushed)."""
        order = self.orders[fh]
        try:
            order.buffer.write(offset, data)
        except TooLarge as exc:
            self.note_refusal(fh, exc)
            raise
        return len(data)

    def take_order(self, fh: int) -> list[str]:
        """The paths written through handle `fh` since its last flush, one a line."""
        order = self.orders.get(fh)
        if order is None:
            return []
        try:
            return order.buffer.take()
        except TooLarge as exc:
            self.note_refusal(fh, exc)
            raise

    def note_refusal(self, fh: int, exc: TooLarge) -> None:
        order = self.orders[fh]
        log.warning("order list from %s refused: %s", order.sender, exc)
        self.note_report(fh, refusal(str(exc)))

    def note_report(self, fh: int, text: bytes) -> None:
        """The report of the list handle `fh` handed over: its own, and its process's."""
        order = self.orders[fh]
        order.report = text
        self.reports.note(order.sender, text)

    def release(self, fh: int) -> bool:
        """Forget handle `fh` if it is ours (True)."""
        if self.orders.pop(fh, None) is not None:
            self.slots.give_back()
            return True
        return self.reads.pop(fh, None) is not None

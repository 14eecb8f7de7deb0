"""The preload socket, `.pffs/preload.sock`: how a job's order list passes a read-only bind.

A read-only bind of the mount (how Kubernetes hands a ReadOnlyMany volume to a pod: Fluid's CSI
plugin, pffs's own csi/volumes.py) refuses every write with EROFS in the kernel, `.pffs/preload`
included, while connect() to a unix socket passes it. So once the mount serves, its process
binds a socket at `.pffs/preload.sock` (the kernel asks pffs itself for the socket's inode with
a MKNOD, answered by pffs.fs.special) and serves each connection: the client sends an order list
in the preload file's format, shuts its side down and reads the report the file would give, its
own list's (pffs.jobs is the client). Lists go to the one handling the file's go to
(Vfs.take_order).

Anyone who can connect can send a list, so each connection is held to the caps of
`OrderLimits` (pffs.fs.orders): a list over its bytes or lines is refused without reading the
rest; beyond the lists received at once a connection gets its refusal line and is closed before
a task or a buffer is spent on it; a connection has `seconds` from its accept to send its whole
list (a deadline, not an idle time: a byte a second does not keep it), and as long to read its
report. Each log line names the sender's uid and pid (SO_PEERCRED).

A socket bound through a mount pins it: `umount` answers EBUSY while it is open. So the socket
is bound through a private clone of the mount (open_tree(2), OPEN_TREE_CLONE), never through a
mount anyone sees: `umount`, `fusermount3 -u`, `pffs umount`, the CSI driver and Fluid's default
preStop unmount as they always did. The clone holds the file system itself, though, which would
outlive its last mount; so this process watches its mount namespace's table and closes the
socket once no mount of the file system is left in it. The kernel then ends the FUSE session and
the mount's process exits as after any unmount. A process that dies has its socket closed by
the kernel, and its dead mount is cleared by the next mount as before.

open_tree needs CAP_SYS_ADMIN, as a bind mount does: a mount without it has no socket, and its
preload file is the one channel (docs/notes/readonly-order.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import socket
import struct
import time

import trio

from pffs.config import OrderLimits
from pffs.errors import Busy, TooLarge
from pffs.fs.orders import UNKNOWN_SENDER, OrderBuffer, Sender, refusal, report
from pffs.fs.special import HIDDEN_DIR, PRELOAD_SOCKET
from pffs.fs.vfs import Vfs
from pffs.mounting.kernel import find_mount, mount_table
from pffs.workers import run_blocking

log = logging.getLogger("pffs.mounting.ordersocket")

# open_tree(2): the same number on every architecture (a syscall of Linux 5.2, numbered after
# the tables were unified).
_SYS_OPEN_TREE = 428
_AT_FDCWD = -100
_OPEN_TREE_CLONE = 1
# Bytes read from a client at once.
RECEIVE_CHUNK = 64 * 1024
# A connection refused for want of a slot is logged at most once in this many seconds.
LOG_EVERY = 10.0
# struct ucred of SO_PEERCRED: pid, uid, gid.
_PEERCRED = struct.Struct("3i")
# How long the watcher's thread waits for a change of the mount table before it looks anyway.
WATCH_SECONDS = 60.0


async def serve_order_socket(
    vfs: Vfs, mountpoint: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Bind `.pffs/preload.sock` of the mount at `mountpoint` and answer order lists there
    until the mount is gone or this task is cancelled; then close it. Started (nursery.start)
    once the socket is bound, or is known not to be."""
    kernel_calls = trio.CapacityLimiter(1)
    try:
        # In a thread: bind() waits for the MKNOD this very loop answers.
        listener, device = await run_blocking(kernel_calls, _bind_through_clone, mountpoint)
    except OSError as exc:
        vfs.special.socket_bound = False
        log.info(
            "no %s/%s (%s): a read-only bind of this mount cannot take an order list",
            HIDDEN_DIR,
            PRELOAD_SOCKET,
            exc.strerror or exc,
        )
        task_status.started()
        return
    log.debug("preload socket bound at %s/%s/%s", mountpoint, HIDDEN_DIR, PRELOAD_SOCKET)
    task_status.started()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_accept, listener, vfs, nursery)
            await _wait_unmounted(device)
            log.info("the last mount of this file system is gone: closing its preload socket")
            nursery.cancel_scope.cancel()
    except Exception:  # a fault of the socket's must not end the mount it serves beside
        log.exception("the preload socket failed; closing it")
    finally:
        vfs.special.socket_bound = False
        trio.lowlevel.notify_closing(listener)
        with trio.CancelScope(shield=True):
            # The last close of the socket may end the file system (above): in the kernel, in
            # the closing thread, which must not be the thread answering its requests.
            await run_blocking(kernel_calls, listener.close)


def _bind_through_clone(mountpoint: str) -> tuple[socket.socket, str]:
    """A listening socket at `.pffs/preload.sock`, bound through a clone of the mount; and
    the file system's device ("major:minor", as the mount table names it)."""
    entry = find_mount(mountpoint)
    if entry is None:
        raise OSError(errno.ENOENT, "not mounted", mountpoint)
    clone = _open_tree_clone(mountpoint)
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # Through /proc: a mountpoint's path may exceed a socket address's 107 bytes.
            listener.bind(f"/proc/self/fd/{clone}/{HIDDEN_DIR}/{PRELOAD_SOCKET}")
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
    finally:
        os.close(clone)  # the socket keeps the clone's mount, detached from everything
    return listener, entry.device


def _open_tree_clone(path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(
        libc.syscall(
            _SYS_OPEN_TREE,
            ctypes.c_int(_AT_FDCWD),
            os.fsencode(path),
            ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
        )
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"open_tree: {os.strerror(code)}", path)
    return fd


async def _wait_unmounted(device: str) -> None:
    """Return once no mount of `device` is left in this mount namespace."""
    while await trio.to_thread.run_sync(
        _mounted_after_a_change,
        device,
        # The wait has no bound (a mount table may not change for days): on shutdown its
        # thread is left to finish on its own rather than hold the shutdown up.
        abandon_on_cancel=True,
    ):
        pass


def _mounted_after_a_change(device: str) -> bool:
    """Whether `device` is mounted, looked at after the mount table next changes (poll(2)
    reports a change of /proc/self/mountinfo as POLLPRI) or WATCH_SECONDS pass."""
    with open("/proc/self/mountinfo", "rb") as table:  # a change after this open wakes poll
        if not _mounted(device):
            return False
        poller = select.poll()
        poller.register(table, select.POLLPRI)
        poller.poll(int(WATCH_SECONDS * 1000))
    return _mounted(device)


def _mounted(device: str) -> bool:
    return any(entry.device == device for entry in mount_table())


async def _accept(listener: socket.socket, vfs: Vfs, nursery: trio.Nursery) -> None:
    slots = vfs.special.slots
    turned_away = _TurnedAway()
    while True:
        await trio.lowlevel.wait_readable(listener)
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            continue
        except OSError as exc:  # out of descriptors: the client sees its connection reset
            log.warning("preload socket: cannot accept a connection: %s", exc)
            await trio.sleep(0.1)
            continue
        sender = _peer(connection)
        try:
            slots.take()
        except Busy as exc:
            # Refused at once, without a task or a buffer: its one line if the socket's
            # buffer takes it, then closed.
            turned_away.note(sender, str(exc))
            with contextlib.suppress(OSError):
                connection.setblocking(False)
                connection.send(refusal(str(exc)))
            connection.close()
            continue
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(connection))
        nursery.start_soon(_answer, stream, vfs, sender)


async def _answer(stream: trio.SocketStream, vfs: Vfs, sender: Sender) -> None:
    """One client: its list up to its end of writing, then the report back; each within the
    connection's lifetime (the list counted from its accept), never a per-chunk idle time a
    slow sender could stretch."""
    limits = vfs.special.limits
    try:
        async with stream:
            with trio.move_on_after(limits.seconds) as lifetime:
                paths = await _receive(stream, limits)
            if lifetime.cancelled_caught:
                paths = TooLarge(f"no whole list within {limits.seconds:g} s")
            if isinstance(paths, TooLarge):
                log.warning("preload socket: a list from %s refused: %s", sender, paths)
                text = refusal(str(paths))
            elif paths:
                text = await vfs.take_order(paths, sender)
            else:  # a connection that sent nothing (a probe): nothing to log
                text = report(0, [])
            with trio.fail_after(limits.seconds):
                await stream.send_all(text)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
        log.warning("preload socket: %s cut off: %s", sender, exc or "its report was not read")
    except Exception:  # ends this client's connection, not the socket
        log.exception("preload socket: a list from %s failed", sender)
    finally:
        vfs.special.slots.give_back()


async def _receive(stream: trio.SocketStream, limits: OrderLimits) -> list[str] | TooLarge:
    """The paths of the list `stream` sends up to its end of writing, or why it is refused
    (over a cap: the rest is never read)."""
    buffer = OrderBuffer(limits)
    try:
        while chunk := await stream.receive_some(RECEIVE_CHUNK):
            buffer.write(len(buffer.data), chunk)
        return buffer.take()
    except TooLarge as exc:
        return exc


def _peer(connection: socket.socket) -> Sender:
    """The connecting process's uid and pid, as the kernel saw them at connect()."""
    try:
        raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return UNKNOWN_SENDER
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return Sender(uid, pid)


class _TurnedAway:
    """Connections refused for want of a slot, logged once per `LOG_EVERY` seconds with a
    count of the others (a flood of connections must not become a flood of log lines)."""

    def __init__(self) -> None:
        self.unlogged = 0
        self.logged_at = -float("inf")

    def note(self, sender: Sender, reason: str) -> None:
        now = time.monotonic()
        if now - self.logged_at < LOG_EVERY:
            self.unlogged += 1
            return
        others = f" (and {self.unlogged} more since the last such line)" if self.unlogged else ""
        log.warning("preload socket: a connection from %s refused: %s%s", sender, reason, others)
        self.unlogged = 0
        self.logged_at = now

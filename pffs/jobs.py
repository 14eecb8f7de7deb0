"""Handing a job's read order to a pffs mount, for data loaders that know it (no torch needed).

`preload_order(mountpoint, paths)` hands the paths (relative to the mount root, or absolute
under the mountpoint) to the mount, through its `.pffs/preload.sock` socket or else its
preload file `.pffs/preload`; pffs then loads the files in that order, ahead of the readers
(pffs.fs.datasets). It returns the bad entries, one line each; the others proceed.

`PreloadOrder` wraps a sampler (any iterable of dataset indices, such as a PyTorch Sampler):
each time it is iterated, one epoch, it hands the paths of its indices over in the sampler's
order, then yields the indices. Give it to a DataLoader as its sampler:

    sampler = PreloadOrder(RandomSampler(ds), lambda i: ds.files[i], "/mnt/data")
    loader = DataLoader(ds, sampler=sampler, num_workers=8)
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized

log = logging.getLogger(__name__)

# The preload file pffs.fs.special serves at the root of every mount, and the socket beside
# it (pffs.mounting.ordersocket).
CONTROL_FILE = os.path.join(".pffs", "preload")
# Its former name, served by mounts of an older pffs (a job's pffs may be newer than the mount's).
FORMER_PRELOAD_FILE = os.path.join(".pffs", "prefetch")
PRELOAD_SOCKET = "preload.sock"
# A mount takes lists of at most so many lines and bytes (pffs.config.OrderLimits): a longer
# order goes over as several lists, one after another, which the mount loads in turn.
LIST_LINES = 64 * 1024
LIST_BYTES = 4 * 1024 * 1024


class NotAMount(ValueError):
    """The directory given is not the root of a pffs mount."""


class OrderRefused(OSError):
    """The mount refused a list (over one of its caps); `strerror` says which."""


def preload_order(mountpoint: str, paths: Iterable[str]) -> list[str]:
    """Hand `paths` to the pffs mount at `mountpoint`, to load in that order; the bad entries.

    Raises NotAMount when `mountpoint` has no preload file `.pffs/preload` (nor its former
    name, on a mount of an older pffs).
    """
    root = os.path.abspath(mountpoint)
    control = next(
        (
            os.path.join(root, name)
            for name in (CONTROL_FILE, FORMER_PRELOAD_FILE)
            if os.path.isfile(os.path.join(root, name))
        ),
        None,
    )
    if control is None:
        raise NotAMount(f"{mountpoint} is not the root of a pffs mount (no {CONTROL_FILE})")
    lines = [line for line in (_inside(root, path) for path in paths) if line]
    bad: list[str] = []
    for text in _lists(lines):
        # The socket first, where the mount has one: it passes a read-only bind, which refuses
        # the file's write. A mount without it (no CAP_SYS_ADMIN to bind it) or closing it as
        # it unmounts leaves the file. Each report is this list's own.
        report = _through_socket(control, text)
        if report is None:
            report = _through_file(control, text)
        first, *rest = report.splitlines() or [""]
        if first.startswith("refused: "):
            raise OrderRefused(errno.EFBIG, first.removeprefix("refused: "))
        bad += rest  # "queued N", then one line per bad entry
    return bad


def _lists(lines: list[str]) -> Iterator[str]:
    """The order as lists within a mount's caps of lines and bytes."""
    start, size = 0, 0
    for end, line in enumerate(lines):
        length = len(line.encode()) + 1
        if end - start >= LIST_LINES or (size + length > LIST_BYTES and end > start):
            yield "".join(f"{line}\n" for line in lines[start:end])
            start, size = end, 0
        size += length
    if start < len(lines):
        yield "".join(f"{line}\n" for line in lines[start:])


def _through_socket(control: str, text: str) -> str | None:
    """The report of `text` sent to the preload socket beside `control`; None without one."""
    directory = os.open(os.path.dirname(control), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                # Through /proc: a mountpoint's path may exceed a socket address's 107 bytes.
                sock.connect(f"/proc/self/fd/{directory}/{PRELOAD_SOCKET}")
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
                    return None
                raise
            try:
                sock.sendall(text.encode())
                sock.shutdown(socket.SHUT_WR)
            except BrokenPipeError:  # refused midway: its one line is read below
                pass
            report = bytearray()
            while chunk := sock.recv(1 << 16):
                report += chunk
    finally:
        os.close(directory)
    if not report:  # it answers every list with "queued N" at least
        raise ConnectionResetError(errno.ECONNRESET, "the mount closed its preload socket")
    return report.decode(errors="replace")


def _through_file(control: str, text: str) -> str:
    """The report of `text` written to the preload file."""
    with open(control, "w", encoding="utf-8") as handed:
        handed.write(text)
        # fsync hands the list over before close returns, also where a read-only mount has
        # the kernel's FLUSH turned off (a RELEASE is not waited for).
        handed.flush()
        os.fsync(handed.fileno())
    with open(control, encoding="utf-8") as report:
        return report.read()


def _inside(root: str, path: str) -> str:
    path = path.strip()
    if os.path.isabs(path) and (path == root or path.startswith(root + os.sep)):
        return os.path.relpath(path, root)
    return path.lstrip("/")


class PreloadOrder:
    """Yields a sampler's indices, having handed their files' paths to pffs, once per epoch."""

    def __init__(
        self, sampler: Iterable[int], path_of: Callable[[int], str], mountpoint: str
    ) -> None:
        self.sampler = sampler
        self.path_of = path_of
        self.mountpoint = mountpoint
        self.bad: list[str] = []  # the bad entries of the last epoch's list

    def __iter__(self) -> Iterator[int]:
        order: Sequence[int] = list(self.sampler)
        try:
            self.bad = preload_order(self.mountpoint, (self.path_of(i) for i in order))
        except OSError as exc:  # a hint lost, never an epoch (a read-only bind of a mount
            # without its socket refuses the list)
            log.warning("pffs preload: the order was not handed over: %s", exc)
            self.bad = []
        for line in self.bad[:10]:
            log.warning("pffs preload: %s", line)
        return iter(order)

    def __len__(self) -> int:
        if not isinstance(self.sampler, Sized):
            raise TypeError("the wrapped sampler has no length")
        return len(self.sampler)

"""Order lists as they arrive: their caps, who sent them, their reports.

A job hands its read order to a mount through `.pffs/preload` (pffs.fs.special) or its socket
(pffs.mounting.ordersocket); anyone who can reach the mount can, so each list is held to the
caps of `OrderLimits` while it arrives (`OrderBuffer`), and a list over one is refused whole:
its report is the one line `refused: ...`, which the log says too, with the sender's uid and
pid. pffs.fs.datasets holds the listing work of a list to its own cap.

A report is its list's sender's alone: the socket answers it on the connection, the control
file through the handle that wrote the list, and to a later reading open by the same process
(never to another's: a report names the paths it found bad).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from pffs.config import OrderLimits
from pffs.errors import Busy, TooLarge

log = logging.getLogger(__name__)

# Processes whose last report a reading open of `.pffs/preload` is given, at most.
REMEMBERED_SENDERS = 1024


@dataclass(frozen=True)
class Sender:
    """Who sent a list: the uid and pid the kernel names (FUSE's request, SO_PEERCRED)."""

    uid: int
    pid: int

    def __str__(self) -> str:
        return f"uid {self.uid} pid {self.pid}"


UNKNOWN_SENDER = Sender(-1, -1)


def order_lines(data: bytes | bytearray) -> list[str]:
    """The paths of an order list as handed over (the preload file's and the socket's format):
    one a line, blank lines left out."""
    return [line for line in data.decode(errors="replace").splitlines() if line.strip()]


def refusal(reason: str) -> bytes:
    """The report of a refused list: one line."""
    return f"refused: {reason}\n".encode()


def report(queued: int, errors: list[str]) -> bytes:
    """The report of a list taken: `queued N`, then one line per bad entry."""
    return "".join(f"{line}\n" for line in [f"queued {queued}", *errors]).encode()


class OrderBuffer:
    """One list as it arrives, within its caps of bytes and lines."""

    def __init__(self, limits: OrderLimits) -> None:
        self.limits = limits
        self.data = bytearray()

    def write(self, offset: int, data: bytes) -> None:
        """Bytes of the list at `offset` (the preload file's writes; the socket's at its end).
        Raises TooLarge (and holds nothing) once the list passes its byte cap."""
        end = offset + len(data)
        if end > self.limits.max_bytes:
            self.data = bytearray()
            raise TooLarge(f"the list is over {self.limits.max_bytes} bytes")
        self.data[offset:end] = data

    def take(self) -> list[str]:
        """The list's paths, and the buffer emptied. Raises TooLarge over the cap of lines
        (counted before any line is made a string)."""
        data, self.data = self.data, bytearray()
        if data.count(b"\n") > self.limits.max_lines:
            raise TooLarge(f"the list is over {self.limits.max_lines} lines")
        lines = order_lines(data)
        if len(lines) > self.limits.max_lines:  # a last line with no end
            raise TooLarge(f"the list is over {self.limits.max_lines} lines")
        return lines


class OrderSlots:
    """Lists being received at once, within `OrderLimits.connections`: the socket's and the
    preload file's together."""

    def __init__(self, limits: OrderLimits) -> None:
        self.limits = limits
        self.taken = 0

    def take(self) -> None:
        """A slot for one more list; Busy when all are taken."""
        if self.taken >= self.limits.connections:
            raise Busy(f"{self.limits.connections} lists are being received already")
        self.taken += 1

    def give_back(self) -> None:
        self.taken -= 1


class SenderReports:
    """The last report of each sending process, for its later reading opens."""

    def __init__(self) -> None:
        self._reports: OrderedDict[int, bytes] = OrderedDict()

    def note(self, sender: Sender, text: bytes) -> None:
        self._reports[sender.pid] = text
        self._reports.move_to_end(sender.pid)
        while len(self._reports) > REMEMBERED_SENDERS:
            self._reports.popitem(last=False)

    def of(self, sender: Sender) -> bytes:
        return self._reports.get(sender.pid, b"")

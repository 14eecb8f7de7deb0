"""A mount's log file: private, rotated by size, and reopened on request (SIGHUP, for logrotate).

A log file that only grows fills the disk it shares with the cache (a refusal logged per
request, a store that fails for hours). So the file rotates itself: past `max_bytes`, `x.log`
becomes `x.log.1` (`x.log.1` becomes `x.log.2`, ... up to `backups`, the oldest dropped) and a
new `x.log` is opened. For an admin's logrotate, `reopen()` (the mount calls it on SIGHUP)
opens the path again, so the file logrotate moved away is let go.

Every open goes through pffs.privatefiles (0600, never through another user's symlink); a
rotation only renames (rename(2) moves a link, never what it points to), so a link planted at
`x.log.1` is replaced, not written through. A rotation that cannot be done (a name there that
is another user's, in a sticky directory) is said once in the log, and the file goes on
growing rather than losing lines.

The daemon's stdout and stderr are its log file (a traceback or a fault dump written there
directly): with `stdio`, each new file is also put on descriptors 1 and 2.
"""

from __future__ import annotations

import logging
import os

from pffs.privatefiles import open_private_log

# Defaults: a file of at most 64 MiB (give or take a line) and three rotated ones beside it.
MAX_BYTES = 64 << 20
BACKUPS = 3


class PrivateLogFile(logging.Handler):
    """Writes each record as one line to `path` (see the module's docstring)."""

    def __init__(
        self, path: str, max_bytes: int = MAX_BYTES, backups: int = BACKUPS, stdio: bool = False
    ) -> None:
        """Opens `path` now (OSError where it cannot be)."""
        super().__init__()
        self.path = os.path.abspath(path)  # reopened later, whatever the cwd is then
        self.max_bytes = max_bytes
        self.backups = max(1, backups)
        self._stdio = stdio
        self._fd = -1
        self._size = 0
        self._rotating = True  # off after a rotation failed: said once, not every line
        self._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            if self._rotating and self._size + len(data) > self.max_bytes:
                self._rotate()
            self._write(data)
        except Exception:  # logging must never raise into the code that logs
            self.handleError(record)

    def reopen(self) -> None:
        """Open the path again (logrotate moved the file away); the old file is let go."""
        self.acquire()
        try:
            self._open()
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            if self._fd >= 0 and not self._stdio:
                os.close(self._fd)
                self._fd = -1
        finally:
            self.release()
        super().close()

    def _open(self) -> None:
        fd = open_private_log(self.path)
        if self._stdio:
            for target in (1, 2):
                os.dup2(fd, target)
            os.close(fd)
            fd = 2
        elif self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _rotate(self) -> None:
        self._size = os.fstat(self._fd).st_size  # others append too (stderr): look first
        if self._size == 0:
            return  # one line longer than the bound: written to an empty file
        try:
            for number in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{number}"
                if os.path.lexists(older):
                    os.rename(older, f"{self.path}.{number + 1}")
            os.rename(self.path, f"{self.path}.1")
            self._open()
        except OSError as exc:
            self._rotating = False
            self._write(
                f"pffs: the log file {self.path} cannot be rotated ({exc}); it grows from "
                "here\n".encode()
            )

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)


def reopen_log_files(logger: logging.Logger | None = None) -> bool:
    """Reopen every PrivateLogFile of `logger` (the root's by default); whether there was one."""
    files = [h for h in (logger or logging.getLogger()).handlers if isinstance(h, PrivateLogFile)]
    for handler in files:
        handler.reopen()
    return bool(files)

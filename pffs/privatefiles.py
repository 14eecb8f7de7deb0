"""Private directories and files (0700, 0600) made or opened without following another user's
symlink.

A process run by root that chmods, or opens for writing, a path where another local user could
have put a symlink (a log file or a cache directory under /tmp, a directory another user
owns) would chmod or write whatever the link points to. So the last component is opened with
O_NOFOLLOW and changed through its descriptor (fchmod), never by name; a symlink there is
followed only when it is this user's or root's (the kernel's own rule for sticky directories,
fs.protected_symlinks): an admin's `/var/cache/pffs -> /nvme/pffs` works, a planted link is
refused with ELOOP.
"""

from __future__ import annotations

import errno
import os
import stat


def private_dir(path: str) -> None:
    """Make `path` (and its parents) if missing and set it to 0700, through its descriptor."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = _open_own(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def open_private_log(path: str) -> int:
    """A descriptor appending to the regular file `path` (made 0600 if missing, set 0600)."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fd = _open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_own(path: str, flags: int, mode: int = 0o700) -> int:
    """Open `path`; a last symlink only when it is ours or root's."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        link = os.lstat(path)
        if not stat.S_ISLNK(link.st_mode):
            raise
        if link.st_uid not in (0, os.geteuid()):
            raise OSError(errno.ELOOP, "a symlink of another user: not followed", path) from None
        return os.open(path, flags | os.O_CLOEXEC, mode)

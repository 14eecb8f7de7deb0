"""Opening a path beneath a root directory without a race: no symlink is ever followed and no
`..` leaves it, whatever changes in the tree meanwhile.

A path resolved first (realpath) and acted on by name after is a race under a mount run by
root over a tree someone else can write to: between the check and the act, a directory of the
path becomes a symlink to anywhere (/etc), and the act lands there. So every operation of
backends/local.py opens its path here, as one walk the kernel does from the root's descriptor,
and then acts on that descriptor, or on a name in its parent's descriptor (the *at calls, which
never follow a last symlink: unlinkat, mkdirat, renameat; an open of a last name has
O_NOFOLLOW).

The walk is openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS (Linux 5.6), called through
its syscall number where Python has no wrapper; on a kernel without it, the same walk by hand:
one openat(O_NOFOLLOW) per component, each from the descriptor of the one before. A symlink on
the way is refused with ELOOP, a `..` with EXDEV.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterator

# openat2(2): the same number on every architecture that has it (the unified table). Only the
# two pffs runs on are listed; elsewhere the walk by hand is used.
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
# Whether openat2 is there: None until the first call says.
have_openat2: bool | None = None if _SYS_OPENAT2 is not None else False


def open_beneath(root: int, path: str, flags: int, mode: int = 0o644) -> int:
    """A descriptor of `path` (relative, "" for the root itself) beneath the directory `root`,
    opened with `flags`. Raises OSError: ELOOP for a symlink on the way (the last name too),
    EXDEV for a `..` or an absolute path."""
    global have_openat2
    flags |= os.O_CLOEXEC
    if not path:
        return os.open(".", flags, mode, dir_fd=root)
    if have_openat2 is not False:
        fd = _openat2(root, path, flags, mode)
        if fd >= 0:
            have_openat2 = True
            return fd
        code = ctypes.get_errno()
        if code != errno.ENOSYS or have_openat2:
            raise OSError(code, os.strerror(code), path)
        have_openat2 = False  # an older kernel: the walk by hand from now on
    return _walk(root, path, flags, mode)


def _openat2(root: int, path: str, flags: int, mode: int) -> int:
    # A mode only with a file made (O_TMPFILE includes O_DIRECTORY's bit: compare it whole).
    makes = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
    how = _OpenHow(flags, mode if makes else 0, _RESOLVE)
    assert _SYS_OPENAT2 is not None
    return int(
        _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(root),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )


def _walk(root: int, path: str, flags: int, mode: int) -> int:
    """openat2's walk by hand: each directory opened from the one before, never through a
    symlink (O_NOFOLLOW, and an O_PATH descriptor checked to be a directory)."""
    *directories, last = _components(path)
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
    try:
        for name in directories:
            following = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = following
            kind = os.fstat(fd).st_mode
            if stat.S_ISLNK(kind):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if not stat.S_ISDIR(kind):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if flags & os.O_PATH:
            # O_PATH | O_NOFOLLOW opens a last symlink itself: refuse it as openat2 would.
            opened = os.open(last, flags | os.O_NOFOLLOW, mode, dir_fd=fd)
            if stat.S_ISLNK(os.fstat(opened).st_mode):
                os.close(opened)
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            return opened
        return os.open(last, flags | os.O_NOFOLLOW, mode, dir_fd=fd)
    finally:
        os.close(fd)


def _components(path: str) -> list[str]:
    if path.startswith("/"):
        raise OSError(errno.EXDEV, "an absolute path", path)
    names = [name for name in path.split("/") if name and name != "."]
    if ".." in names:
        raise OSError(errno.EXDEV, "a path through ..", path)
    if not names:
        return ["."]
    return names


@contextlib.contextmanager
def opened(root: int, path: str, flags: int, mode: int = 0o644) -> Iterator[int]:
    """`open_beneath` as a context: the descriptor closed at its end."""
    fd = open_beneath(root, path, flags, mode)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def parent_of(root: int, path: str) -> Iterator[tuple[int, str]]:
    """(a descriptor of the directory holding `path`, the last name of `path`): for the *at
    calls that act on a name without following it."""
    directory, _, name = path.strip("/").rpartition("/")
    if name in ("", ".", ".."):
        raise OSError(errno.EXDEV, "no name to act on", path)
    with opened(root, directory, os.O_PATH | os.O_DIRECTORY) as fd:
        yield fd, name

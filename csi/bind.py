"""Bind mounts through the mount(2) / umount2(2) system calls (no util-linux needed).

A volume's one FUSE mount lives at a staging path; each pod's target path is a bind mount of
it, made read-only per target when asked. Needs CAP_SYS_ADMIN, as every CSI node plugin does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str, path: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what} {path}: {os.strerror(code)}", path)


def bind_mount(source: str, target: str, read_only: bool = False) -> None:
    """Bind `source` at `target`; read-only takes a second, remounting call (kernel rule)."""
    _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND, None), "bind", target)
    if read_only:
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        try:
            _check(_libc.mount(None, target.encode(), None, flags, None), "remount ro", target)
        except OSError:
            unmount(target)
            raise


def unmount(target: str, detach: bool = False) -> bool:
    """Unmount `target`; False when nothing was mounted there. Detach for dead or busy mounts."""
    result = _libc.umount2(target.encode(), MNT_DETACH if detach else 0)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EINVAL:  # not a mount point
        return False
    raise OSError(code, f"unmount {target}: {os.strerror(code)}", target)

"""Inodes: the numbers the kernel knows paths by, and what is known of each.

Only the inodes the kernel references (or that an open handle or a staged write pins) stay in
memory: one the kernel forgets costs nothing after. A path's number is derived from the path
itself (a 62-bit digest), so it is the same after the kernel forgets it and looks it up again,
or after a remount, and tools comparing inode numbers see one file. When that number is taken
by a live inode of another path (a digest collision, or the path's earlier file, deleted while
the kernel still holds it), a number from a counter is used instead, never a digest's.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

from pffs.backends.base import ObjectInfo
from pffs.errors import NotFound

ROOT_INODE = 1


@dataclass(eq=False, slots=True)
class Inode:
    """One known path. `info` is what the store said; `expires` when to ask again."""

    ino: int
    path: str
    info: ObjectInfo
    expires: float
    lookups: int = 0
    # The object version whose pages the kernel may still hold (see open's keep_cache).
    kernel_version: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.info.is_dir


class InodeTable:
    """Live inodes by number, and their numbers by path."""

    def __init__(self, root_info: ObjectInfo) -> None:
        root = Inode(ROOT_INODE, "", root_info, expires=float("inf"), lookups=1)
        self.inodes: dict[int, Inode] = {ROOT_INODE: root}
        self.ino_by_path: dict[str, int] = {"": ROOT_INODE}
        # Below 2**62, where no digest falls (see _number).
        self._spare_numbers = itertools.count(ROOT_INODE + 1)

    def get(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise NotFound(f"inode {ino} is not known") from None

    def known(self, path: str) -> Inode | None:
        """The live inode of `path`, if it has one."""
        ino = self.ino_by_path.get(path)
        return self.inodes.get(ino) if ino is not None else None

    def remember(self, path: str, info: ObjectInfo, expires: float) -> Inode:
        """The inode for `path`, created or refreshed with `info`."""
        ino = self.ino_by_path.get(path)
        if ino is None:
            ino = self._number(path)
            self.ino_by_path[path] = ino
            inode = Inode(ino, path, info, expires)
            self.inodes[ino] = inode
        else:
            inode = self.inodes[ino]
            inode.info = info
            inode.expires = expires
        return inode

    def _number(self, path: str) -> int:
        digest = hashlib.blake2b(path.encode(), digest_size=8).digest()
        ino = (int.from_bytes(digest, "little") >> 2) | (1 << 62)  # in [2**62, 2**63)
        return next(self._spare_numbers) if ino in self.inodes else ino

    def drop(self, inode: Inode) -> None:
        """Free `inode` if it is still the live one: nothing of it is kept."""
        if self.inodes.get(inode.ino) is inode:
            del self.inodes[inode.ino]
            if self.ino_by_path.get(inode.path) == inode.ino:
                del self.ino_by_path[inode.path]

    def forget_path(self, path: str) -> Inode | None:
        """`path` is gone: its number is released; the inode (if live) is returned."""
        ino = self.ino_by_path.pop(path, None)
        return self.inodes.get(ino) if ino is not None else None

    def move(self, old_path: str, new_path: str) -> list[tuple[str, int]]:
        """Renumber `old_path` and everything under it to `new_path`; (old path, ino) pairs."""
        moved = [
            (path, ino)
            for path, ino in self.ino_by_path.items()
            if path == old_path or path.startswith(old_path + "/")
        ]
        for path, ino in moved:
            del self.ino_by_path[path]
            renamed = new_path + path[len(old_path) :]
            self.ino_by_path[renamed] = ino
            inode = self.inodes.get(ino)
            if inode is not None:
                inode.path = renamed
                inode.expires = 0.0  # stat again: S3 copies get new times
        return moved

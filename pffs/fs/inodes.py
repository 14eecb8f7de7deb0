"""Inodes: the numbers the kernel knows paths by, stable for the life of a mount.

A path keeps its number even after the kernel forgets it and it is looked up again, so tools
comparing inode numbers see one file. Only the inodes the kernel references (or that an open
handle or a staged write pins) stay in memory; the path-to-number map keeps the numbers.
"""

from __future__ import annotations

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
    """Inodes by number, and numbers by path."""

    def __init__(self, root_info: ObjectInfo) -> None:
        root = Inode(ROOT_INODE, "", root_info, expires=float("inf"), lookups=1)
        self.inodes: dict[int, Inode] = {ROOT_INODE: root}
        self.ino_by_path: dict[str, int] = {"": ROOT_INODE}
        self._next_ino = itertools.count(ROOT_INODE + 1)

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
        inode = self.inodes.get(ino) if ino is not None else None
        if inode is None:
            if ino is None:
                ino = next(self._next_ino)
                self.ino_by_path[path] = ino
            inode = Inode(ino, path, info, expires)
            self.inodes[ino] = inode
        else:
            inode.info = info
            inode.expires = expires
        return inode

    def drop(self, inode: Inode) -> None:
        """Free `inode` (its number stays with its path) if it is still the live one."""
        if self.inodes.get(inode.ino) is inode:
            del self.inodes[inode.ino]

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

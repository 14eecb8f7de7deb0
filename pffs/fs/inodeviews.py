"""What callers hold of an inode: the `Inode` protocol, the view of a record of the inode
table (pffs.fs.inodes) that the namespace hands out, and plain inodes kept outside the table
(the hidden `.pffs` files). fuse_ops, the handles and the write side see only `Inode`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Protocol

from pffs.backends.base import ObjectInfo
from pffs.fs.names import PackedNames
from pffs.fs.packed import PackedInfos


class Records(Protocol):
    """What a view reads and writes of the inode table (pffs.fs.inodes.InodeTable)."""

    frees: int
    names: PackedNames
    infos: PackedInfos
    expiries: array[float]
    lookups: array[int]

    def slot(self, ino: int) -> int: ...
    def path_of(self, slot: int) -> str: ...
    def set_info(self, slot: int, info: ObjectInfo) -> None: ...
    def kernel_version(self, slot: int) -> str | None: ...
    def set_kernel_version(self, slot: int, version: str | None) -> None: ...


class Inode(Protocol):
    """One known path. `info` is what the store said; `expires` when to ask again; `lookups`
    the kernel's references; `kernel_version` the object version whose pages the kernel may
    still hold (see open's keep_cache)."""

    @property
    def ino(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def is_dir(self) -> bool: ...

    def stat_fields(self) -> tuple[bool, int, float]:
        """(is_dir, size, mtime): what the kernel is told, cheaper than `info` (no ObjectInfo
        is made for every lookup)."""
        ...

    info: ObjectInfo
    expires: float
    lookups: int
    kernel_version: str | None


@dataclass(eq=False, slots=True)
class FixedInode:
    """An inode kept outside the table, as plain attributes (the hidden `.pffs` files)."""

    ino: int
    path: str
    info: ObjectInfo
    expires: float
    lookups: int = 0
    kernel_version: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.info.is_dir

    def stat_fields(self) -> tuple[bool, int, float]:
        return self.info.is_dir, self.info.size, self.info.mtime


class TableInode:
    """A live inode of an InodeTable seen through its number: reads and writes go to the
    table, and raise NotFound once the inode is freed. The slot is remembered, and looked up
    again once the table has freed or moved a record since (the check is inline in the
    properties every lookup and readdir entry reads)."""

    __slots__ = ("_seen", "_slot", "_table", "ino")

    def __init__(self, table: Records, ino: int, slot: int) -> None:
        self._table = table
        self.ino = ino
        self._slot = slot
        self._seen = table.frees

    def __repr__(self) -> str:
        return f"TableInode({self.ino})"

    def slot(self) -> int:
        """The record's slot in the table now."""
        table = self._table
        if self._seen != table.frees:
            self._slot = table.slot(self.ino)
            self._seen = table.frees
        return self._slot

    @property
    def path(self) -> str:
        table = self._table
        return table.path_of(self._slot if self._seen == table.frees else self.slot())

    @property
    def is_dir(self) -> bool:
        table = self._table
        return table.infos.is_dir(self._slot if self._seen == table.frees else self.slot())

    def stat_fields(self) -> tuple[bool, int, float]:
        table = self._table
        return table.infos.stat_fields(self._slot if self._seen == table.frees else self.slot())

    @property
    def info(self) -> ObjectInfo:
        table = self._table
        slot = self._slot if self._seen == table.frees else self.slot()
        return table.infos.get(slot, table.names[slot])

    @info.setter
    def info(self, info: ObjectInfo) -> None:
        self._table.set_info(self.slot(), info)

    @property
    def expires(self) -> float:
        return self._table.expiries[self.slot()]

    @expires.setter
    def expires(self, when: float) -> None:
        self._table.expiries[self.slot()] = when

    @property
    def lookups(self) -> int:
        return self._table.lookups[self.slot()]

    @lookups.setter
    def lookups(self, count: int) -> None:
        self._table.lookups[self.slot()] = count

    @property
    def kernel_version(self) -> str | None:
        return self._table.kernel_version(self.slot())

    @kernel_version.setter
    def kernel_version(self, version: str | None) -> None:
        self._table.set_kernel_version(self.slot(), version)

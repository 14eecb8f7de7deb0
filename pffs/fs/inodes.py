"""Inodes: the numbers the kernel knows paths by, and what is known of each, in one table.

Only the inodes the kernel references (or that an open handle or a staged write pins) stay in
the table: one the kernel forgets is freed (its directory too, once nothing under it is left).
A path's number is derived from the path itself (a 62-bit digest), so it is the same after the
kernel forgets it and looks it up again, or after a remount, and tools comparing inode numbers
see one file. When that number is taken by another inode of the table (a digest collision, or
the path's earlier file, deleted while the kernel still holds it), a number from a counter is
used instead, never a digest's; so is the old number of an entry renamed.

The table is built for a million inodes: no Python object per inode. An inode is
a record in columns addressed by a slot number (the number of its parent directory, its name
packed by pffs.fs.names, its attributes packed by pffs.fs.packed, when they expire, the
kernel's references); a path is the parent's path and the name, the paths of the directories
with inodes under them being kept. So a child is found from its path's digest, the one way to
its number, with no index by path. An `Inode` handed out is a view of the record by number.

A record is found by number through an open-addressing index (pffs.fs.slotindex): an array
of slots keyed by the number's low bits, 4 to 8 bytes an inode, where a dict from number to
slot cost about 100 (the dict's entry and an int object for the number and for the slot).
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from typing import Protocol

from pffs.backends.base import ObjectInfo
from pffs.errors import NotFound
from pffs.fs.inodeviews import FixedInode, Inode, TableInode
from pffs.fs.names import PackedNames, encode
from pffs.fs.packed import PackedInfos
from pffs.fs.slotindex import SlotIndex

# The views are pffs.fs.inodeviews's; they are named here too, where callers look for inodes.
__all__ = ["ROOT_INODE", "FixedInode", "Inode", "InodeTable", "TableInode", "path_number"]

ROOT_INODE = 1
_ROOT_SLOT = 0
_DIGEST_BIT = 1 << 62  # set in every number derived from a path, in none from the counter

# A record's flags.
_BOUND = 1  # its path's current inode: a lookup of the path finds it
_RELEASED = 2  # no holder left: kept only while inodes under it are, found again by its path
_KERNEL_PAGES = 4  # the kernel may hold pages of the current version (see open's keep_cache)
_RENUMBERED = 8  # its number is not its path's digest: it is in `_renumbered`


def path_number(path: str) -> int:
    """The inode number a path has unless taken: a digest in [2**62, 2**63) (of its UTF-8,
    with surrogate escapes for a local name that is not UTF-8)."""
    digest = hashlib.blake2b(encode(path), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) | _DIGEST_BIT


class Listed(Protocol):
    """What remember_listed reads of a directory listing (pffs.fs.listings.DirListing)."""

    names: PackedNames
    infos: PackedInfos
    # The inode number last seen for each entry, 0 for none: a hint, checked before use.
    inos: array[int]


class InodeTable:
    """Live inodes by number, found by path through their number.

    Columns by slot: `names`, `infos` (pffs.fs.packed), `expiries`, `lookups`, `flags`, and the
    parent's number, the record's number, how many records name it their parent. A freed slot
    is reused; the columns shrink when three quarters of them are free (see _compact).
    """

    def __init__(self, root_info: ObjectInfo) -> None:
        self.inos: array[int] = array("q")
        # Slots by number: the numbers are the `inos` column, which the index reads.
        self._slot_of = SlotIndex(self.inos)
        self._parents: array[int] = array("q")
        self._children: array[int] = array("I")
        self.names = PackedNames()
        self.infos = PackedInfos()
        self.expiries: array[float] = array("d")
        self.lookups: array[int] = array("q")
        self.flags = bytearray()
        self._free: array[int] = array("q")
        # Records freed or moved so far: a view's slot is good while this has not changed.
        self.frees = 0
        # Paths whose inode number is not their digest (spare numbers, renamed entries).
        self._renumbered: dict[str, int] = {"": ROOT_INODE}
        # The paths of records that other records name as their parent, by number.
        self._parent_paths: dict[int, str] = {}
        # Below 2**62, where no digest falls (see path_number).
        self._spare_numbers = itertools.count(ROOT_INODE + 1)
        root = self._new_record(ROOT_INODE, 0, "")
        self.infos.set(root, root_info)
        self.expiries[root], self.lookups[root] = float("inf"), 1
        self.flags[root] |= _RENUMBERED

    def __len__(self) -> int:
        """Records in the table, released ones kept as parents included."""
        return len(self._slot_of)

    # --- by number ---------------------------------------------------------------------------

    def slot(self, ino: int) -> int:
        """The slot of live inode `ino`."""
        slot = self._slot_of.get(ino)
        if slot < 0 or self.flags[slot] & _RELEASED:
            raise NotFound(f"inode {ino} is not known")
        return slot

    def live(self, ino: int) -> bool:
        slot = self._slot_of.get(ino)
        return slot >= 0 and not self.flags[slot] & _RELEASED

    def get(self, ino: int) -> TableInode:
        return TableInode(self, ino, self.slot(ino))

    def numbers(self) -> list[int]:
        """The numbers of the live inodes."""
        return [
            self.inos[slot] for slot in self._slot_of.slots() if not self.flags[slot] & _RELEASED
        ]

    def path_of(self, slot: int) -> str:
        if slot == _ROOT_SLOT:
            return ""
        # A directory with records under it has its path kept: no name to unpack (lookups in
        # it ask for it every time).
        own = self._parent_paths.get(self.inos[slot])
        if own is not None:
            return own
        parent = self._parent_paths[self._parents[slot]]
        return f"{parent}/{self.names[slot]}" if parent else self.names[slot]

    def kernel_version(self, slot: int) -> str | None:
        if self.flags[slot] & _KERNEL_PAGES:
            return self.infos.get(slot, "").version
        return None

    def set_kernel_version(self, slot: int, version: str | None) -> None:
        # Only "the kernel may hold the current version's pages" is kept: a version other than
        # the current one is never compared equal again, so it is as good as none.
        if version is not None and version == self.infos.get(slot, "").version:
            self.flags[slot] |= _KERNEL_PAGES
        else:
            self.flags[slot] &= ~_KERNEL_PAGES

    def set_info(self, slot: int, info: ObjectInfo) -> None:
        if self.flags[slot] & _KERNEL_PAGES and not self.infos.same_version(slot, info):
            self.flags[slot] &= ~_KERNEL_PAGES
        self.infos.set(slot, info)

    # --- by path -----------------------------------------------------------------------------

    def _find(self, path: str) -> int | None:
        """The slot of the record `path` is bound to (released or not)."""
        ino = self._renumbered.get(path)
        return self._bound_at(path, self._slot_of.get(path_number(path) if ino is None else ino))

    def _bound_at(self, path: str, slot: int) -> int | None:
        """`slot` (-1 for none) if it holds the record `path` is bound to, else None."""
        if slot < 0 or not self.flags[slot] & _BOUND:
            return None
        if slot == _ROOT_SLOT:
            return slot if path == "" else None
        parent_path, _, name = path.rpartition("/")
        parent_slot = self._slot_of.get(self._parents[slot])
        if (
            not self.names.equals(slot, encode(name))
            or not self.flags[parent_slot] & _BOUND
            or self._parent_paths[self._parents[slot]] != parent_path
        ):
            return None  # a digest collision, or the number of a renamed entry
        return slot

    def ino_of(self, path: str) -> int | None:
        """The number of the live inode of `path`, if it has one."""
        slot = self._find(path)
        return None if slot is None or self.flags[slot] & _RELEASED else self.inos[slot]

    def known(self, path: str) -> TableInode | None:
        """The live inode of `path`, if it has one."""
        slot = self._find(path)
        if slot is None or self.flags[slot] & _RELEASED:
            return None
        return TableInode(self, self.inos[slot], slot)

    def remember(self, path: str, info: ObjectInfo, expires: float) -> TableInode:
        """The inode for `path`, created or refreshed with `info`."""
        slot = self._bound_slot(path, None)
        self.set_info(slot, info)
        self.expiries[slot] = expires
        return TableInode(self, self.inos[slot], slot)

    def remember_listed(
        self,
        path: str,
        listing: Listed,
        index: int,
        expires: float,
        parent: int,
    ) -> TableInode:
        """As remember, with entry `index` of a listing of directory `parent` (a number): no
        ObjectInfo is made, and the inode number the listing noted for the entry spares the
        path's digest. Lookups and readdir answered from a listing are the common case."""
        hints, flags = listing.inos, self.flags
        hint = hints[index]
        slot = self._slot_of.get(hint) if hint else -1
        if (
            slot < 0
            or self._parents[slot] != parent
            or not self.names.same(slot, listing.names, index)
            or not flags[slot] & _BOUND
        ):
            slot = self._bound_slot(path, parent)
            hints[index] = self.inos[slot]
        flags[slot] &= ~_RELEASED
        if flags[slot] & _KERNEL_PAGES and not self.infos.same_as(slot, listing.infos, index):
            flags[slot] &= ~_KERNEL_PAGES
        self.infos.copy(slot, listing.infos, index)
        self.expiries[slot] = expires
        return TableInode(self, self.inos[slot], slot)

    def _bound_slot(self, path: str, parent: int | None) -> int:
        """The slot of the record `path` is bound to, taken back if released; a new record,
        its attributes yet to be set, when there is none. `parent` is the directory's number
        when the caller has it."""
        number = path_number(path)
        taken = self._slot_of.get(number)  # the record holding the digest, if any
        renumbered = self._renumbered.get(path)
        slot = self._bound_at(path, taken if renumbered is None else self._slot_of.get(renumbered))
        if slot is not None:
            self.flags[slot] &= ~_RELEASED
            return slot
        parent_path, _, name = path.rpartition("/")
        parent = self._parent_of(parent_path) if parent is None else self._count_child(parent)
        ino = next(self._spare_numbers) if taken >= 0 else number
        slot = self._new_record(ino, parent, name)
        if ino != number:
            self._renumbered[path] = ino
            self.flags[slot] |= _RENUMBERED
        return slot

    def _parent_of(self, parent_path: str) -> int:
        """The number of the directory `parent_path`, counted as a parent once more. A directory
        the table does not hold is added as a released placeholder, found again by its path."""
        slot = self._find(parent_path)
        if slot is None:
            name = parent_path.rpartition("/")[2]
            self.remember(parent_path, ObjectInfo(name, 0, 0.0, None, True), 0.0)
            slot = self._find(parent_path)
            assert slot is not None
            self.flags[slot] |= _RELEASED
        return self._count_child(self.inos[slot])

    def _count_child(self, parent: int) -> int:
        """Count one more record under `parent` (a number), whose path is kept while any is."""
        slot = self._slot_of.get(parent)
        self._children[slot] += 1
        if self._children[slot] == 1:
            self._parent_paths[parent] = self.path_of(slot)
        return parent

    def _new_record(self, ino: int, parent: int, name: str) -> int:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.inos[slot], self._parents[slot], self._children[slot] = ino, parent, 0
        self.names.set(slot, name)
        self.expiries[slot], self.lookups[slot], self.flags[slot] = 0.0, 0, _BOUND
        self._slot_of.add(slot)
        return slot

    def _grow(self) -> None:
        """Add free slots at the end of the columns, an eighth more (new records are then
        stores into the columns, not appends to each)."""
        start = len(self.names)
        count = max(64, start // 8)
        for column in (self.inos, self._parents, self._children, self.lookups):
            column.frombytes(bytes(count * column.itemsize))  # zeros
        self.expiries.frombytes(bytes(count * self.expiries.itemsize))
        self.names.extend_blank(count)
        self.flags.extend(bytes([_RELEASED]) * count)  # free, as _free_record leaves them
        self.infos.extend_blank(count)
        self._free.extend(range(start + count - 1, start - 1, -1))  # the lowest first

    # --- letting go --------------------------------------------------------------------------

    def drop(self, inode: Inode) -> None:
        """Nothing holds `inode` any more: it is freed, or kept released while inodes under it
        are (its path is needed for theirs)."""
        slot = self._slot_of.get(inode.ino)
        if slot < 0 or slot == _ROOT_SLOT:
            return
        self.flags[slot] |= _RELEASED
        if self._children[slot] == 0:
            self._free_record(slot)

    def _free_record(self, slot: int) -> None:
        """Free a released record with nothing under it, then its parents that are the same."""
        while True:
            ino, parent, flags = self.inos[slot], self._parents[slot], self.flags[slot]
            if flags & _BOUND and flags & _RENUMBERED:
                path = self.path_of(slot)
                if self._renumbered.get(path) == ino:
                    del self._renumbered[path]
            self._slot_of.remove(slot)
            self._parent_paths.pop(ino, None)
            self.names.set(slot, "")
            self.infos.clear(slot)
            self.flags[slot] = _RELEASED  # views of it see it freed
            self._free.append(slot)
            self.frees += 1
            slot = self._slot_of.get(parent)
            self._children[slot] -= 1
            if self._children[slot] > 0:
                break
            del self._parent_paths[parent]
            if not self.flags[slot] & _RELEASED or slot == _ROOT_SLOT:
                break
        if len(self._free) > 4096 and 4 * len(self._free) > 3 * len(self.names):
            self._compact()

    def _compact(self) -> None:
        """Move the records to the lowest slots and shrink the columns: what the kernel forgot
        costs nothing afterwards (numbers, not slots, are what other records refer to)."""
        live = sorted(self._slot_of.slots())
        for target, source in enumerate(live):
            if source != target:
                self.inos[target] = self.inos[source]
                self._parents[target] = self._parents[source]
                self._children[target] = self._children[source]
                self.names.move(source, target)
                self.infos.move(source, target)
                self.expiries[target] = self.expiries[source]
                self.lookups[target] = self.lookups[source]
                self.flags[target] = self.flags[source]
        length = len(live)
        for column in (self.inos, self._parents, self._children, self.expiries, self.lookups):
            del column[length:]
        del self.flags[length:]
        self.names.truncate(length)
        self.infos.truncate(length)
        self._free = array("q")
        self._slot_of.rebuild(length)
        self.frees += 1

    def forget_path(self, path: str) -> TableInode | None:
        """`path` is gone: its number is released; the inode (if live) is returned."""
        slot = self._find(path)
        if slot is None or slot == _ROOT_SLOT:
            return None
        ino = self.inos[slot]
        if self.flags[slot] & _RENUMBERED:
            del self._renumbered[path]
        self.flags[slot] &= ~(_BOUND | _RENUMBERED)
        if self.flags[slot] & _RELEASED:
            if self._children[slot] == 0:
                self._free_record(slot)
            return None
        return TableInode(self, ino, slot)

    # --- renames -----------------------------------------------------------------------------

    def move(self, old_path: str, new_path: str) -> list[tuple[str, int]]:
        """Renumber `old_path` and everything under it to `new_path`; (old path, ino) pairs."""
        slot = self._find(old_path)
        if slot is None or slot == _ROOT_SLOT:
            return []
        moved = [(old_path, self.inos[slot])]
        if self._children[slot]:
            prefix = old_path + "/"
            for other, ino in enumerate(self.inos):
                if self.flags[other] & _BOUND and other != _ROOT_SLOT:
                    path = self.path_of(other)
                    if path.startswith(prefix):
                        moved.append((path, ino))
        new_parent_path, _, new_name = new_path.rpartition("/")
        new_parent = self._parent_of(new_parent_path)  # counted before the old one lets go
        old_parent = self._parents[slot]
        self._parents[slot] = new_parent
        self.names.set(slot, new_name)
        old_parent_slot = self._slot_of.get(old_parent)
        self._children[old_parent_slot] -= 1
        if self._children[old_parent_slot] == 0:
            del self._parent_paths[old_parent]
            if self.flags[old_parent_slot] & _RELEASED and old_parent_slot != _ROOT_SLOT:
                self._free_record(old_parent_slot)
        for path, ino in moved:
            renamed = new_path + path[len(old_path) :]
            record = self._slot_of.get(ino)
            if ino in self._parent_paths:
                self._parent_paths[ino] = renamed
            if self.flags[record] & _RENUMBERED:
                self._renumbered.pop(path, None)
            if path_number(renamed) == ino:
                self.flags[record] &= ~_RENUMBERED
            else:
                self._renumbered[renamed] = ino
                self.flags[record] |= _RENUMBERED
            self.expiries[record] = 0.0  # stat again: S3 copies get new times
        return moved

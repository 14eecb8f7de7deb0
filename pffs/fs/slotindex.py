"""The inode table's index from inode number to slot: open addressing in one array.

A dict from number to slot costs about 100 bytes an inode: its entry, and an int object for
the number (36 bytes, numbers being 62-bit digests) and for the slot. Here the numbers are not
stored again: they are the table's own `inos` column, and the index holds only slots (plus
one, 0 marking an empty place), 4 bytes each, in a power-of-two array kept at most half full:
4 to 8 bytes an inode. A number's home place is its low bits, which are random for a digest
and consecutive for the counter's numbers; collisions probe the next places (linear probing),
and a removal shifts the entries after it back, so no tombstones build up.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

_MIN_CAPACITY = 64


class SlotIndex:
    """Slots of `inos` (a column the caller owns and writes) by the number each holds."""

    __slots__ = ("_count", "_inos", "_mask", "_places")

    def __init__(self, inos: array[int]) -> None:
        self._inos = inos
        self._count = 0
        self._places: array[int] = array("I")
        self._mask = 0
        self._resize(_MIN_CAPACITY, ())

    def __len__(self) -> int:
        return self._count

    def get(self, ino: int) -> int:
        """The slot holding number `ino`, or -1."""
        places, inos, mask = self._places, self._inos, self._mask
        at = ino & mask
        while True:
            entry = places[at]
            if entry == 0:
                return -1
            if inos[entry - 1] == ino:
                return entry - 1
            at = (at + 1) & mask

    def slots(self) -> list[int]:
        """Every slot indexed, in no particular order."""
        return [entry - 1 for entry in self._places if entry]

    def add(self, slot: int) -> None:
        """Index `slot` by the number it now holds (a number not indexed yet)."""
        if 2 * (self._count + 1) > len(self._places):
            self._resize(2 * len(self._places), self.slots())
        places, mask = self._places, self._mask
        at = self._inos[slot] & mask
        while places[at]:
            at = (at + 1) & mask
        places[at] = slot + 1
        self._count += 1

    def remove(self, slot: int) -> None:
        """Drop `slot` (indexed, still holding its number) from the index."""
        places, inos, mask = self._places, self._inos, self._mask
        at = inos[slot] & mask
        while places[at] != slot + 1:
            at = (at + 1) & mask
        # Backward shift: move back each following entry whose home place is not between the
        # hole and it, so that every entry stays reachable from its home without gaps.
        hole, probe = at, at
        while True:
            probe = (probe + 1) & mask
            entry = places[probe]
            if entry == 0:
                break
            home = inos[entry - 1] & mask
            if (probe - home) & mask >= (probe - hole) & mask:
                places[hole] = entry
                hole = probe
        places[hole] = 0
        self._count -= 1

    def rebuild(self, length: int) -> None:
        """Index slots 0 to `length` - 1 afresh (after the table moved its records there)."""
        capacity = _MIN_CAPACITY
        while capacity < 2 * length:
            capacity *= 2
        self._resize(capacity, range(length))

    def _resize(self, capacity: int, slots: Iterable[int]) -> None:
        places = self._places = array("I", bytes(4 * capacity))
        mask = self._mask = capacity - 1
        inos, count = self._inos, 0
        for slot in slots:
            at = inos[slot] & mask
            while places[at]:
                at = (at + 1) & mask
            places[at] = slot + 1
            count += 1
        self._count = count

"""Names packed in one byte string: no Python object per name.

A name kept as a Python str costs 49 bytes and its length, and 8 more for each list holding
it; a million-entry tree walked once keeps one per inode. Here a name is its UTF-8
bytes in a shared `bytearray` and 6 bytes of position (start and length): a 7-character name
costs 13 bytes instead of 64. Names that are not valid UTF-8 (a local file named with other
bytes reaches Python with surrogate escapes) go through the same escapes both ways. The
directory listings (pffs.fs.listings) and the inode table's `names` column (pffs.fs.inodes)
are each one `PackedNames`; a name is made a str again only when asked. A listing finds a
name's position with a `NameIndex`, by its hash.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

_MAX_LENGTH = 0xFFFF  # a name's length is kept in 2 bytes; stores allow 1,024 for a key
# Rewrite the bytes once more than half are names since overwritten, and at least this many.
_REPACK_GARBAGE = 1 << 16


def encode(name: str) -> bytes:
    """A name as kept: UTF-8, with surrogate escapes for what was not UTF-8 to begin with."""
    return name.encode("utf-8", "surrogateescape")


def _check_length(encoded: bytes) -> None:
    if len(encoded) > _MAX_LENGTH:  # its length is kept in 2 bytes
        raise ValueError(f"a name of {len(encoded):,} bytes is too long (at most 65,535)")


class PackedNames:
    """Names by index: appended, overwritten, compared and found without making a str."""

    __slots__ = ("_bytes", "_garbage", "_lengths", "_starts")

    def __init__(self) -> None:
        self._bytes = bytearray()
        self._starts: array[int] = array("I")
        self._lengths: array[int] = array("H")
        self._garbage = 0  # bytes of names since overwritten

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[str]:
        return (self[index] for index in range(len(self._starts)))

    def __getitem__(self, index: int) -> str:
        start = self._starts[index]
        return self._bytes[start : start + self._lengths[index]].decode("utf-8", "surrogateescape")

    def encoded(self, index: int) -> bytes:
        start = self._starts[index]
        return bytes(self._bytes[start : start + self._lengths[index]])

    def equals(self, index: int, encoded: bytes) -> bool:
        """Whether the name at `index` is `encoded` (as `encode` gives it)."""
        length = self._lengths[index]
        if length != len(encoded):
            return False
        start = self._starts[index]
        return self._bytes[start : start + length] == encoded

    def same(self, index: int, other: PackedNames, other_index: int) -> bool:
        """Whether the name at `index` is the one at `other_index` of `other`."""
        length = self._lengths[index]
        if length != other._lengths[other_index]:
            return False
        start, other_start = self._starts[index], other._starts[other_index]
        return (
            self._bytes[start : start + length] == other._bytes[other_start : other_start + length]
        )

    def append(self, encoded: bytes) -> None:
        """Add a name, as `encode` gives it, at the end."""
        _check_length(encoded)
        self._starts.append(len(self._bytes))
        self._lengths.append(len(encoded))
        self._bytes += encoded

    def extend_blank(self, count: int) -> None:
        """Add `count` empty names at the end, to be set."""
        self._starts.frombytes(bytes(count * self._starts.itemsize))
        self._lengths.frombytes(bytes(count * self._lengths.itemsize))

    def set(self, index: int, name: str | bytes) -> None:
        """Overwrite the name at `index`."""
        encoded = encode(name) if isinstance(name, str) else name
        _check_length(encoded)
        self._garbage += self._lengths[index]
        self._starts[index] = len(self._bytes)
        self._lengths[index] = len(encoded)
        self._bytes += encoded
        if self._garbage > _REPACK_GARBAGE and 2 * self._garbage > len(self._bytes):
            self._repack()

    def move(self, source: int, target: int) -> None:
        """Give `target` the name at `source`, for a compaction: both hold the same bytes
        until `truncate` ends it and rewrites them."""
        self._starts[target] = self._starts[source]
        self._lengths[target] = self._lengths[source]

    def truncate(self, length: int) -> None:
        """Keep the first `length` names only, their bytes rewritten without the rest."""
        del self._starts[length:], self._lengths[length:]
        self._repack()

    def _repack(self) -> None:
        """Rewrite the bytes with only the names held."""
        data, starts, lengths = self._bytes, self._starts, self._lengths
        packed = bytearray()
        for index, start in enumerate(starts):
            starts[index] = len(packed)
            packed += data[start : start + lengths[index]]
        self._bytes, self._garbage = packed, 0


class NameIndex:
    """Positions of the names of a PackedNames by name: open addressing on the names' hashes,
    in one array of positions (plus one, 0 marking an empty place) kept at most half full,
    4 to 8 bytes a name where a dict cost about 100. A directory listing finds a name with it
    in about a microsecond, in whatever order the store listed; a bisection in Python took
    several at a thousand entries."""

    __slots__ = ("_mask", "_names", "_places")

    def __init__(self, names: PackedNames) -> None:
        self._names = names
        self._places: array[int] = array("I")
        self._mask = 0
        self._resize(64)

    def get(self, encoded: bytes) -> int | None:
        """The position of the name `encoded` (as `encode` gives it), if it is there."""
        names, places, mask = self._names, self._places, self._mask
        data, starts, lengths, length = names._bytes, names._starts, names._lengths, len(encoded)
        at = hash(encoded) & mask
        while True:
            entry = places[at]
            if entry == 0:
                return None
            position = entry - 1
            if lengths[position] == length:
                start = starts[position]
                if data[start : start + length] == encoded:
                    return position
            at = (at + 1) & mask

    def add(self, position: int, encoded: bytes) -> None:
        """Index the name at `position`, which is `encoded` and not indexed yet."""
        places = self._places
        if 2 * len(self._names) > len(places):
            self._resize(2 * len(places))  # which indexes it too
            return
        mask = self._mask
        at = hash(encoded) & mask
        while places[at]:
            at = (at + 1) & mask
        places[at] = position + 1

    def _resize(self, capacity: int) -> None:
        names = self._names
        places = self._places = array("I", bytes(4 * capacity))
        mask = self._mask = capacity - 1
        for position in range(len(names)):
            at = hash(names.encoded(position)) & mask
            while places[at]:
                at = (at + 1) & mask
            places[at] = position + 1

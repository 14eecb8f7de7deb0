"""A directory's listing as it streams in from the store: its entries in columns, by position
(names: pffs.fs.names; what the store said of each: pffs.fs.packed), and the stream's state.
The namespace (pffs.fs.namespace) streams them from the store and keeps them by path for a
TTL; a directory handle reads one (pffs.fs.handles).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from pffs.backends.base import ObjectInfo
from pffs.fs.names import NameIndex, PackedNames, encode
from pffs.fs.packed import PackedInfos


@dataclass(eq=False)
class DirListing:
    """A directory's entries as they stream in from the store, in the store's order: their
    names (pffs.fs.names), and what the store said of each (pffs.fs.packed), by position."""

    names: PackedNames = field(default_factory=PackedNames)
    complete: bool = False
    # Served as last seen because the store could not be asked: what it holds is known, what
    # it lacks is not (a name may have come since), so it never answers "no such name".
    last_seen: bool = False
    expires: float = 0.0
    source: Iterator[ObjectInfo] | None = None
    # When its first request was asked (pffs.fs.changes): a directory changed since is not kept.
    asked: int | None = None
    lock: trio.Lock = field(default_factory=trio.Lock)
    # Set once the first chunk has arrived, or the listing has failed or finished.
    first_chunk: trio.Event = field(default_factory=trio.Event)
    infos: PackedInfos = field(default_factory=PackedInfos)
    # The inode number of each entry last seen by the inode table, 0 for none (a hint it
    # checks): a lookup answered by the listing then needs no digest of the path.
    inos: array[int] = field(default_factory=lambda: array("q"))
    # Positions by name (pffs.fs.names), in whatever order the store listed.
    lookup: NameIndex = field(init=False)

    def __post_init__(self) -> None:
        self.lookup = NameIndex(self.names)

    def add(self, info: ObjectInfo) -> None:
        encoded = encode(info.name)
        position = self.lookup.get(encoded)
        if position is None:
            self.names.append(encoded)
            self.lookup.add(len(self.names) - 1, encoded)
            self.infos.append(info)
            self.inos.append(0)
        elif info.is_dir and not self.infos.is_dir(position):
            # A key that is both an object and a prefix: the directory wins.
            self.infos.set(position, info)

    def position(self, name: str) -> int | None:
        """Where `name` is in the listing, if it is."""
        return self.lookup.get(encode(name))

    def get(self, name: str) -> ObjectInfo | None:
        """What the store said of `name`, if it is in the listing."""
        position = self.position(name)
        return None if position is None else self.infos.get(position, self.names[position])

    def info_at(self, position: int) -> ObjectInfo:
        return self.infos.get(position, self.names[position])

    def take_entries(self, other: DirListing) -> None:
        """The entries of `other`, a complete listing (shared with it: neither changes)."""
        self.names, self.infos, self.lookup = other.names, other.infos, other.lookup
        self.inos = other.inos

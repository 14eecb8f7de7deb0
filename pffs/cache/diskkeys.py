"""Which entries the disk tier may hold, answered in the trio thread: a Bloom filter of its keys.

A block nobody has cached yet has no entry, and asking the tier's SQLite index whether it does
costs a worker-thread hop, once for every file of a cold epoch. The filter answers "absent"
without the hop. It holds the keys of the index rows it was given (DiskIO fills it from the
index and keeps it in step: diskio.py) and of the entries this process wrote.

"Absent" is a hint, never a reason to serve other bytes: a key the filter has not been given
yet answers absent, and its block is then fetched from the store as if it were not cached.
"Maybe" is what the index is asked about, as before the filter; about 1% of absent keys answer
maybe (10 bits and 7 probes a key). Keys deleted from the index stay in the filter (they answer
maybe); past its capacity the filter asks to be rebuilt (`full`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pffs.cache.diskindex import BatchIndex

# 10 bits and 7 probes per key: about 1% of absent keys answer "maybe" at full capacity.
_BITS_PER_KEY = 10
_PROBES = 7
_MIN_CAPACITY = 1 << 16
_U64 = (1 << 64) - 1


class DiskKeys:
    """A Bloom filter of entry keys, with the last index rowid it has read (see the module)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, _MIN_CAPACITY)
        bits = 1 << (self.capacity * _BITS_PER_KEY - 1).bit_length()
        self._mask = bits - 1
        self._bits = bytearray(bits // 8)
        self.count = 0  # keys added (a key added twice counts twice: a rebuild sizes it right)
        self.last_rowid = 0  # the highest index rowid read into the filter

    def _probes(self, key: str) -> list[int]:
        # Double hashing from the string's own hash: process-local, which is all a filter that
        # lives in one process needs, and cached on the string by Python.
        value = hash(key) & _U64
        first, step = value & 0xFFFFFFFF, (value >> 32) | 1
        return [(first + probe * step) & self._mask for probe in range(_PROBES)]

    def add(self, key: str) -> None:
        bits = self._bits
        for position in self._probes(key):
            bits[position >> 3] |= 1 << (position & 7)
        self.count += 1

    def add_rows(self, rows: Iterable[tuple[int, str]]) -> None:
        """Add index rows given as (rowid, key), in any order."""
        for rowid, key in rows:
            self.add(key)
            if rowid > self.last_rowid:
                self.last_rowid = rowid

    def might_hold(self, key: str) -> bool:
        """False only when no key the filter was given is `key`."""
        bits = self._bits
        for position in self._probes(key):  # noqa: SIM110 (no generator per lookup: hot path)
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
        return True

    @property
    def full(self) -> bool:
        """More keys than it was sized for: its "maybe" answers grow; rebuild it larger."""
        return self.count > self.capacity


def load_keys(index: BatchIndex) -> DiskKeys:
    """A filter of every key in the index, with room to grow before it is rebuilt (blocks)."""
    keys = DiskKeys(2 * index.entry_count())
    keys.add_rows(index.keys_after(0))
    return keys


def keys_after(index: BatchIndex, rowid: int) -> list[tuple[int, str]]:
    """(rowid, key) of the index rows added since `rowid`, by any process (blocks)."""
    return list(index.keys_after(rowid))

"""What a store said of many entries, packed in columns: no Python object per entry.

An `ObjectInfo` costs about 290 bytes (the object, its float, its int, its etag string); a
mount that has walked a million files keeps one per listed entry and one per inode. Here one
entry costs 17 bytes (size, mtime, a flag byte), plus 16 when its etag is an MD5 in lowercase
hex, bare or in double quotes (S3 gives `"<md5>"` for every object not uploaded in parts), kept
as raw bytes. Any other etag is kept aside as its string. Names are not kept here: the inode
table and the listings keep them (pffs.fs.names). An ObjectInfo is made on
demand for who needs one.
"""

from __future__ import annotations

from array import array

from pffs.backends.base import ObjectInfo

_IS_DIR = 1
_MD5 = 2  # the etag is the 16 bytes at the entry's place in `_md5`
_OTHER_ETAG = 4  # the etag is in `_etags`
_QUOTED = 8  # with _MD5: the etag is the hex digits in double quotes
_MD5_HEX_DIGITS = frozenset("0123456789abcdef")


# An ObjectInfo is made for every entry the kernel is told about. It is a frozen dataclass with
# slots, whose __init__ sets each field through object.__setattr__ by name; its slots' own
# setters, used here, take half the time.
_new_object = object.__new__
_set_name, _set_size, _set_mtime, _set_etag, _set_is_dir = (
    ObjectInfo.__dict__[field].__set__ for field in ("name", "size", "mtime", "etag", "is_dir")
)


def _md5_flags(etag: str) -> tuple[int, bytes | None]:
    """How an etag is packed: (_MD5, 16 bytes) for an MD5 in lowercase hex (so that hex() gives
    it back), with _QUOTED when in double quotes; (_OTHER_ETAG, None) for anything else."""
    quoted = len(etag) == 34 and etag[0] == '"' == etag[-1]
    digits = etag[1:-1] if quoted else etag
    if len(digits) == 32 and _MD5_HEX_DIGITS.issuperset(digits):
        return (_MD5 | _QUOTED if quoted else _MD5), bytes.fromhex(digits)
    return _OTHER_ETAG, None


class PackedInfos:
    """ObjectInfos without their names, by index; appended, overwritten, read back."""

    __slots__ = ("_etags", "_flags", "_md5", "_mtimes", "_sizes")

    def __init__(self) -> None:
        self._sizes: array[int] = array("q")
        self._mtimes: array[float] = array("d")
        self._flags = bytearray()
        self._md5 = bytearray()  # grown only once an MD5 etag is seen: 16 bytes an entry
        self._etags: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._flags)

    def append(self, info: ObjectInfo) -> None:
        """Add `info` at the end."""
        self._sizes.append(info.size)
        self._mtimes.append(info.mtime)
        if info.etag is None:  # the common case of local and HDFS listings, kept short
            self._flags.append(_IS_DIR if info.is_dir else 0)
        else:
            self._flags.append(0)
            self.set(len(self._flags) - 1, info)

    def extend_blank(self, count: int) -> None:
        """Add `count` entries at the end, to be set."""
        self._sizes.frombytes(bytes(count * self._sizes.itemsize))
        self._mtimes.frombytes(bytes(count * self._mtimes.itemsize))
        self._flags.extend(bytes(count))

    def set(self, index: int, info: ObjectInfo) -> None:
        """Overwrite the entry at `index` with `info`."""
        self._sizes[index] = info.size
        self._mtimes[index] = info.mtime
        flags = _IS_DIR if info.is_dir else 0
        self._etags.pop(index, None)
        if info.etag is not None:
            etag_flags, raw = _md5_flags(info.etag)
            flags |= etag_flags
            if raw is None:
                self._etags[index] = info.etag
            else:
                self._store_md5(index, raw)
        self._flags[index] = flags

    def _store_md5(self, index: int, raw: bytes | bytearray) -> None:
        if len(self._md5) < 16 * len(self._flags):
            self._md5.extend(bytes(16 * len(self._flags) - len(self._md5)))
        self._md5[16 * index : 16 * index + 16] = raw

    def get(self, index: int, name: str) -> ObjectInfo:
        """The entry at `index`, named `name`."""
        flags = self._flags[index]
        etag = self.etag(index) if flags & (_MD5 | _OTHER_ETAG) else None
        info: ObjectInfo = _new_object(ObjectInfo)
        _set_name(info, name)
        _set_size(info, self._sizes[index])
        _set_mtime(info, self._mtimes[index])
        _set_etag(info, etag)
        _set_is_dir(info, bool(flags & _IS_DIR))
        return info

    def mtime(self, index: int) -> float:
        return self._mtimes[index]

    def stat_fields(self, index: int) -> tuple[bool, int, float]:
        """(is_dir, size, mtime) of the entry at `index`, without making an ObjectInfo."""
        return bool(self._flags[index] & _IS_DIR), self._sizes[index], self._mtimes[index]

    def is_dir(self, index: int) -> bool:
        return bool(self._flags[index] & _IS_DIR)

    def etag(self, index: int) -> str | None:
        flags = self._flags[index]
        if flags & _MD5:
            digits = self._md5[16 * index : 16 * index + 16].hex()
            return f'"{digits}"' if flags & _QUOTED else digits
        if flags & _OTHER_ETAG:
            return self._etags[index]
        return None

    def same_version(self, index: int, info: ObjectInfo) -> bool:
        """Whether `info` names the same content as the entry at `index` (etag, mtime, size)."""
        return (
            self._sizes[index] == info.size
            and self._mtimes[index] == info.mtime
            and self.etag(index) == info.etag
        )

    def same_as(self, index: int, source: PackedInfos, source_index: int) -> bool:
        """Whether the entry at `index` is the one at `source_index` of `source`."""
        return (
            self._flags[index] == source._flags[source_index]
            and self._sizes[index] == source._sizes[source_index]
            and self._mtimes[index] == source._mtimes[source_index]
            and self.etag(index) == source.etag(source_index)
        )

    def copy(self, index: int, source: PackedInfos, source_index: int) -> None:
        """Overwrite the entry at `index` with the one at `source_index` of `source`."""
        flags = source._flags[source_index]
        self._etags.pop(index, None)
        if flags & _MD5:
            self._store_md5(index, source._md5[16 * source_index : 16 * source_index + 16])
        elif flags & _OTHER_ETAG:
            self._etags[index] = source._etags[source_index]
        self._sizes[index] = source._sizes[source_index]
        self._mtimes[index] = source._mtimes[source_index]
        self._flags[index] = flags

    def clear(self, index: int) -> None:
        """Release what the entry at `index` keeps aside (its slot is free for reuse)."""
        self._etags.pop(index, None)

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries only."""
        for index in [i for i in self._etags if i >= length]:
            del self._etags[index]
        del self._sizes[length:], self._mtimes[length:], self._flags[length:]
        del self._md5[16 * length :]

    def move(self, source: int, target: int) -> None:
        """Copy the entry at `source` over the one at `target` (for compaction)."""
        self._sizes[target] = self._sizes[source]
        self._mtimes[target] = self._mtimes[source]
        self._flags[target] = self._flags[source]
        if self._flags[source] & _MD5:
            self._md5[16 * target : 16 * target + 16] = self._md5[16 * source : 16 * source + 16]
        self._etags.pop(target, None)
        other = self._etags.pop(source, None)
        if other is not None:
            self._etags[target] = other

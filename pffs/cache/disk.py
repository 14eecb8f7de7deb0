"""The disk tier: blocks in a diskcache directory, checksummed, lz4-compressed when it pays.

Each block is one entry in the format of entries.py (a header with the raw length, a CRC32C of
each 64 KiB and a digest of its key; written with O_DIRECT). A read verifies it; an entry that
fails (bit rot, a truncated file after a crash, a file from another key) is deleted and reported
as a miss, never as an error to the reader. The directory outlives the mount, so a remount
reuses what is there.

All methods block (SQLite, file I/O, CRC, lz4); callers run them in worker threads. diskcache is
thread- and process-safe, so several mounts and `pffs warmup` can share one directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import diskcache

from pffs.cache.entries import encode, read_entry, read_entry_range, write_entry

log = logging.getLogger("pffs.cache.disk")


def entry_key(source: str, path: str, version: str, block_size: int, index: int) -> str:
    """The diskcache key of a block: a digest of what identifies the bytes, plus the index."""
    identity = "\0".join((source, path, version, str(block_size))).encode()
    return f"{hashlib.blake2b(identity, digest_size=16).hexdigest()}:{index}"


@dataclass(frozen=True)
class _Entry:
    """A block's entry on its way into diskcache (see _BlockDisk)."""

    header: bytes
    payload: bytes | memoryview


class _BlockDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache has no type hints
    """diskcache's file store, writing block entries with `write_entry` (O_DIRECT)."""

    def store(
        self, value: object, read: bool, key: object = diskcache.core.UNKNOWN
    ) -> tuple[object, ...]:
        if isinstance(value, _Entry):
            filename, full_path = self.filename(key, value)
            size = write_entry(full_path, value.header, value.payload)
            return size, diskcache.core.MODE_BINARY, filename, None
        stored: tuple[object, ...] = super().store(value, read, key)
        return stored


@dataclass(frozen=True)
class SourceUsage:
    source: str
    blocks: int
    bytes: int


class DiskTier:
    def __init__(self, directory: str, capacity: int, free_ratio: float, compress: bool) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # blocks are the user's data: no one else may read them
        self.directory = directory
        self.free_ratio = free_ratio
        self.compress = compress
        self._cache = diskcache.Cache(
            directory,
            size_limit=capacity,
            # Recording every read in SQLite would cost a write per hit; epochs read every
            # block once per pass, where least-recently-stored evicts as well as LRU.
            eviction_policy="least-recently-stored",
            tag_index=True,  # per-source usage for `pffs cache info` and the scheduler
            cull_limit=16,
            disk=_BlockDisk,
        )

    def get(self, key: str) -> tuple[bytes | None, bool]:
        """(bytes, corrupt): bytes on a valid hit; corrupt when a bad entry was dropped."""
        return self._read(key, read_entry)

    def get_range(self, key: str, start: int, length: int) -> tuple[bytes | None, bool]:
        """Like `get`, for part of a block (random reads)."""
        return self._read(key, lambda k, f: read_entry_range(k, f, start, length))

    def _read(
        self, key: str, reader: Callable[[str, BinaryIO], bytes | None]
    ) -> tuple[bytes | None, bool]:
        try:
            handle = self._cache.get(key, read=True)
            if handle is None:
                return None, False
            with handle:  # read straight into the block's buffer: no 4 MiB intermediate copy
                data = reader(key, handle)
        except Exception as exc:  # an unreadable entry or database hiccup is a miss
            log.warning("disk cache read of %s failed: %s", key, exc)
            return None, False
        if data is None:
            log.warning("dropping corrupt disk cache entry %s", key)
            self.delete(key)
            return None, True
        return data, False

    def __contains__(self, key: str) -> bool:
        try:
            return key in self._cache
        except Exception:
            return False

    def present(self, keys: list[str]) -> list[bool]:
        """Which of the keys have an entry (one worker-thread hop for a readahead window)."""
        return [key in self for key in keys]

    def put(self, key: str, data: bytes, source: str) -> bool:
        """Store a block; False when skipped (free-space floor, full disk, any I/O error)."""
        if not self._has_room(len(data)):
            return False
        try:
            self._cache.set(key, _Entry(*encode(key, data, self.compress)), tag=source)
        except Exception as exc:
            log.warning("disk cache write of %s skipped: %s", key, exc)
            return False
        return True

    def delete(self, key: str) -> None:
        try:
            self._cache.delete(key)
        except Exception as exc:
            log.warning("disk cache delete of %s failed: %s", key, exc)

    def _has_room(self, size: int) -> bool:
        try:
            usage = shutil.disk_usage(self.directory)
        except OSError:
            return False
        return usage.free - size > self.free_ratio * usage.total

    def volume(self) -> int:
        """Bytes the tier occupies on disk (entries plus the database)."""
        return int(self._cache.volume())

    def usage_by_source(self) -> Iterator[SourceUsage]:
        """Blocks and bytes per source (the entries' tag), largest first.

        diskcache has no API for totals per tag, so they are read from its SQLite index in the
        directory (`diskcache.core.DBNAME`), over a read-only connection of our own: the rows
        diskcache wrote, committed (it commits every change). A second diskcache.Cache is no
        way in: opening one writes its settings into the database.
        """
        database = os.path.join(str(self._cache.directory), diskcache.core.DBNAME)
        uri = f"{pathlib.Path(database).absolute().as_uri()}?mode=ro"
        with contextlib.closing(
            sqlite3.connect(uri, uri=True, timeout=float(self._cache.timeout))
        ) as connection:
            rows = connection.execute(
                "SELECT tag, COUNT(*), SUM(size) FROM Cache GROUP BY tag ORDER BY SUM(size) DESC"
            ).fetchall()
        for tag, blocks, size in rows:
            yield SourceUsage(str(tag), int(blocks), int(size or 0))

    def clear(self, source: str | None = None) -> int:
        """Remove every block (or one source's); returns how many were removed."""
        if source is None:
            return int(self._cache.clear())
        return int(self._cache.evict(source))

    def close(self) -> None:
        self._cache.close()

"""The disk tier: blocks in a diskcache directory, checksummed, lz4-compressed when it pays.

Each block is one entry in the format of entries.py (a header with the raw length, a CRC32C of
each 64 KiB and a digest of its key; written with O_DIRECT). A read verifies it; an entry that
fails (bit rot, a truncated file after a crash, a file from another key) is deleted and reported
as a miss, never as an error to the reader. The directory outlives the mount, so a remount
reuses what is there.

Writes come in batches (`put_batch`): the entry files first, then their rows in diskcache's
index in one transaction (diskindex.py). Nothing is fsynced; what a crash or a power loss can
leave (files no row names, an entry short or zeroed) is never served, because every read
verifies the entry; files no row names are removed by the orphan sweep (orphans.py), at
mount start and by `pffs cache clear`.

diskcache is the index (rows, eviction, `pffs cache info`); reads go through entries kept
open (openentries.py): after the first read of an entry, a read is an fstat, a pread and the
CRC of the chunks it touches, with no SQLite lookup, open or header parse. An open entry is
trusted only as long as it is still the file diskcache holds: an entry this process evicts or
deletes is closed (diskcache removes its file through `_BlockDisk.remove`); one another process
(a mount or `pffs warmup` sharing the directory) evicts, deletes or replaces has no link left
(st_nlink 0 at the per-read fstat) and is dropped; a truncated entry gives a short read and a
damaged one a CRC mismatch, both dropped and deleted. The CRC runs on every read, not once per
open: bytes verified once can still rot on disk and be read again once the page cache lets them
go, and another process can write the file; CRC32C in hardware is cheap beside the read.

All methods but `get_range_nowait` block (SQLite, file I/O, CRC, lz4); callers run them in
worker threads. `get_range_nowait` serves a part of an entry already open whose bytes the page
cache holds, and gives up on anything else: it costs less than a worker-thread hop, so trio
tasks call it first. diskcache is thread- and process-safe, so several mounts and `pffs warmup`
can share one directory.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import diskcache

from pffs.cache.diskindex import BatchIndex, IndexRow, usage_by_tag
from pffs.cache.disklayout import check_layout
from pffs.cache.entries import entry_size, read_block, read_layout, read_range, write_entry
from pffs.cache.keys import BlockKey
from pffs.cache.openentries import OpenEntries, OpenEntry, descriptor_share
from pffs.cache.orphans import Swept, sweep_in_background, sweep_orphans
from pffs.privatefiles import private_dir

log = logging.getLogger("pffs.cache.disk")


def entry_key(key: BlockKey, block_size: int) -> str:
    """The diskcache key of a block: a digest of what identifies the bytes (the principal that
    read them among it), plus the index."""
    return (
        f"{_file_digest(key.source, key.principal, key.path, key.version, block_size)}:{key.block}"
    )


@functools.lru_cache(maxsize=4096)
def _file_digest(source: str, principal: str, path: str, version: str, block_size: int) -> str:
    """The digest of a file version's blocks, kept for the files read lately: the read path
    asks for a block's entry key several times per READ (whether the tier may hold it, its
    lookup, its write), each a hash of the same few strings."""
    identity = "\0".join((source, principal, path, version, str(block_size)))
    identity_bytes = identity.encode("utf-8", "surrogateescape")
    return hashlib.blake2b(identity_bytes, digest_size=16).hexdigest()


class _BlockDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache has no type hints
    """diskcache's file store for block entries, which the tier writes and indexes itself.

    A read with `read=True` gives the entry's path, not an open file: the disk tier opens it
    itself (to keep it open, and to see EMFILE, which diskcache would take for a missing file).
    Removing a file (eviction, delete, replace, clear) first tells `on_remove`, which closes the
    entry if it is held open.
    """

    on_remove: Callable[[str], None] | None = None

    def filename(
        self, key: object = diskcache.core.UNKNOWN, value: object = diskcache.core.UNKNOWN
    ) -> tuple[str, str]:
        # One level of 256 directories, made with the tier and never removed. diskcache's own
        # two levels (65,536 directories, each removed once empty) cost a mkdir for most of the
        # first tens of thousands of writes, a third of a small block's write on ext4.
        name = os.urandom(16).hex()
        filename = os.path.join(name[:2], name[2:] + ".val")
        return filename, os.path.join(self._directory, filename)

    def fetch(self, mode: int, filename: str, value: object, read: bool) -> object:
        if read and mode == diskcache.core.MODE_BINARY:
            return os.path.join(self._directory, filename)
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: str) -> None:
        full_path = os.path.join(self._directory, file_path)
        if self.on_remove is not None:
            self.on_remove(full_path)
        # Another mount sharing the directory may have removed it first. Unlike diskcache's
        # own remove, the emptied directory stays: the next write will want it.
        with contextlib.suppress(OSError):
            os.remove(full_path)


class DiskRead(NamedTuple):
    """What a read of the tier found."""

    data: bytes | None  # None: a miss
    corrupt: bool = False  # a damaged entry was dropped
    whole: bool = False  # data is the whole block (a compressed entry is read whole)


MISS = DiskRead(None)  # what a read finds of a block the tier does not hold
_CORRUPT = DiskRead(None, corrupt=True)
# An entry that vanished between the index and the read is looked up once more: another
# process may have replaced it with a fresh copy.
_ATTEMPTS = 2
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
# What a read knows of a key's row before it opens the entry: (file, size) from a batch's
# lookup, None when the index has none, or _LOOK_UP when it was not asked yet.
_LOOK_UP: Literal["look up"] = "look up"
IndexEntry = tuple[str, int] | None | Literal["look up"]


def _read_whole(entry: OpenEntry) -> bytes | None:
    return read_block(entry.layout, entry.fd)


@dataclass(frozen=True)
class SourceUsage:
    source: str
    blocks: int
    bytes: int


class DiskTier:
    def __init__(
        self,
        directory: str,
        capacity: int,
        free_ratio: float,
        compress: bool,
        open_entries: int | None = None,
    ) -> None:
        private_dir(directory)  # blocks are the user's data: no one else may read them
        check_layout(directory)  # a directory of another layout is cleared (disklayout.py)
        for index in range(256):  # where _BlockDisk.filename puts entries
            os.makedirs(os.path.join(directory, f"{index:02x}"), exist_ok=True)
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
        self.open_entries = OpenEntries(
            descriptor_share() if open_entries is None else open_entries
        )
        # diskcache builds its Disk itself, from settings it stores in SQLite (no place for a
        # function there): the one hook set after construction.
        self._cache.disk.on_remove = self.open_entries.drop_path
        self.index = BatchIndex(directory, capacity, float(self._cache.timeout))
        self._nowait = hasattr(os, "RWF_NOWAIT")  # off once the file system refuses it
        # Bytes of entries being written by batches now, taken from the room above the floor.
        self._reserved = 0
        self._room_lock = threading.Lock()
        self._stop_sweep: Callable[[], None] | None = None

    def get(self, key: str) -> DiskRead:
        """The whole block on a valid hit (verified); a miss otherwise."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[DiskRead]:
        """The whole blocks of several keys, each as `get` gives it, for one worker-thread hop:
        the keys are looked up in the index in one SELECT, and the entries not yet open are
        opened ahead of their reads. Entries held open need no lookup (one dropped meanwhile is
        looked up alone)."""
        unopened = {key for key in keys if key not in self.open_entries}
        try:
            rows = self.index.lookup(list(unopened)) if unopened else {}
        except Exception as exc:  # a database hiccup is a miss
            log.warning("disk cache lookup of %d blocks failed: %s", len(unopened), exc)
            return [MISS] * len(keys)
        opened = self._open_ahead(rows) if len(rows) > 1 else {}
        try:
            return [
                self._read(
                    key, _read_whole, True, rows.get(key) if key in unopened else _LOOK_UP, opened
                )
                for key in keys
            ]
        finally:
            for fd in opened.values():  # not used: the entry was held open meanwhile
                os.close(fd)

    def _open_ahead(self, rows: dict[str, tuple[str, int]]) -> dict[str, int]:
        """Open the entries of a batch not open yet and ask the kernel to read them ahead
        (POSIX_FADV_WILLNEED), so that their reads from the disk, one after another in this
        thread, find them under way together rather than wait for each in turn."""
        opened: dict[str, int] = {}
        for key, (filename, size) in rows.items():
            if key in self.open_entries:
                continue
            fd = self._open_file(os.path.join(self.directory, filename))
            if fd is None:
                continue
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            opened[key] = fd
        return opened

    def get_range(self, key: str, start: int, length: int) -> DiskRead:
        """Bytes [start, start+length) of a block (random reads), reading only the chunks they
        touch. A compressed entry is read whole: `whole` is set and `data` is the block, for the
        caller to keep (decompressing 4 MiB for each 4 KiB read would cost far more than the
        read)."""

        def reader(entry: OpenEntry) -> bytes | None:
            if entry.layout.compressed:
                return read_block(entry.layout, entry.fd)
            return read_range(entry.layout, entry.fd, start, length)

        return self._read(key, reader, False)

    def get_range_nowait(self, key: str, start: int, length: int) -> bytes | None:
        """Like `get_range`, without blocking: the bytes when the key's entry is open, still
        linked, uncompressed, its chunks in the page cache and verified; else None, and the
        caller asks `get_range` in a worker thread (which also drops what is damaged: deleting
        an entry takes SQLite, not for the caller's thread)."""
        if not self._nowait:
            return None
        entry = self.open_entries.acquire(key)
        if entry is None:
            return None
        try:
            if entry.layout.compressed or os.fstat(entry.fd).st_nlink == 0:
                return None
            return read_range(entry.layout, entry.fd, start, length, nowait=True)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:  # a file system without RWF_NOWAIT reads
                self._nowait = False
            return None
        finally:
            self.open_entries.release(entry)

    def _read(
        self,
        key: str,
        reader: Callable[[OpenEntry], bytes | None],
        whole: bool,
        row: IndexEntry = _LOOK_UP,
        opened_ahead: dict[str, int] | None = None,
    ) -> DiskRead:
        """Read the key's entry with `reader` (`whole`: it gives the whole block), through its
        open entry, else opening it: at `row` when the caller looked the key up already,
        through its descriptor in `opened_ahead` (taken from it) when it was opened ahead."""
        for _attempt in range(_ATTEMPTS):
            entry = self.open_entries.acquire(key)
            if entry is None:
                fd = None if opened_ahead is None else opened_ahead.pop(key, None)
                opened = self._open(key, row, fd)
                row = _LOOK_UP  # a second attempt asks the index again
                if not isinstance(opened, OpenEntry):
                    return opened  # a miss, or a damaged entry dropped
                entry = opened
            try:
                if os.fstat(entry.fd).st_nlink == 0:
                    # Evicted, deleted or replaced by another process: not ours to serve.
                    self.open_entries.drop(key)
                    continue
                data = reader(entry)
            except OSError as exc:  # an unreadable entry is a miss
                log.warning("disk cache read of %s failed: %s", key, exc)
                self.open_entries.drop(key)
                return MISS
            finally:
                self.open_entries.release(entry)
            if data is None:
                return self._drop_corrupt(key)
            return DiskRead(data, whole=whole or entry.layout.compressed)
        return MISS

    def _open(self, key: str, row: IndexEntry, fd: int | None = None) -> OpenEntry | DiskRead:
        """Open the key's entry (unless `fd` is it, opened at `row`) and parse its header (held
        for a read); a miss, or a damaged entry dropped."""
        if isinstance(row, str):  # not looked up yet
            try:
                row = self.index.lookup([key]).get(key)
            except Exception as exc:  # a database hiccup is a miss
                log.warning("disk cache lookup of %s failed: %s", key, exc)
                row = None
        if row is None:
            if fd is not None:
                os.close(fd)
            return MISS
        path = os.path.join(self.directory, row[0])
        if fd is None:
            fd = self._open_file(path)
        if fd is None:
            return MISS
        try:
            layout = read_layout(key, fd)
        except OSError as exc:  # unreadable now (EIO...): a miss, the entry left to decide later
            log.warning("disk cache read of %s failed: %s", key, exc)
            os.close(fd)
            return MISS
        if layout is None:
            os.close(fd)
            return self._drop_corrupt(key)
        return self.open_entries.add(key, OpenEntry(fd, path, layout))

    def _open_file(self, path: str) -> int | None:
        """A descriptor of the entry's file; None when it is gone or none can be had.

        Out of descriptors, the open entries shrink (half of them closed) and the open is tried
        once more, so reads go on, opening and closing each entry when no bound is left.
        """
        for attempt in range(2):
            try:
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None  # evicted between the lookup and the open
            except OSError as exc:
                if exc.errno not in _OUT_OF_DESCRIPTORS or attempt:
                    log.warning("disk cache open of %s failed: %s", path, exc)
                    return None
                self._shrink()
        return None

    def _shrink(self) -> None:
        bound = self.open_entries.shrink()
        log.warning("out of file descriptors: the disk tier keeps at most %d entries open", bound)

    def _drop_corrupt(self, key: str) -> DiskRead:
        log.warning("dropping corrupt disk cache entry %s", key)
        self.delete(key)
        return _CORRUPT

    def __contains__(self, key: str) -> bool:
        try:
            return key in self._cache
        except Exception:
            return False

    def present(self, keys: list[str]) -> list[bool]:
        """Which of the keys have an entry (one worker-thread hop and one SELECT for a
        readahead window, or a dataset's files)."""
        try:
            found = self.index.lookup(keys)
        except Exception as exc:  # a database hiccup: nothing is known to be there
            log.warning("disk cache lookup of %d blocks failed: %s", len(keys), exc)
            return [False] * len(keys)
        return [key in found for key in keys]

    def put(self, key: str, data: bytes, source: str) -> bool:
        """Store a block; False when skipped (free-space floor, full disk, any I/O error)."""
        return self.put_batch([(key, data, source)])[0]

    def put_batch(self, blocks: Sequence[tuple[str, bytes, str]]) -> list[bool]:
        """Store blocks given as (key, data, source); for each, False when it was skipped.

        Each block's entry file is written first, then the index rows of all of them go into
        diskcache's index in one SQLite transaction (diskindex.py: a few statements for the
        batch instead of seven per block, and the write lock is not held while files are
        written). A crash before the commit leaves files no row names, never a row naming a
        file not fully written; entries are verified on every read anyway, so a crash never
        serves a bad block. Nothing is fsynced: after a power loss an entry may be short or
        zeroed, and its read drops it. If the transaction fails, no row of the batch is stored
        and its files are removed. Files of rows the batch replaces or evicts are removed only
        once it has committed.
        """
        # The free-space floor: the blocks whose entries fit above it, the rest skipped. Batches
        # run in several threads at once, each writing what one statvfs saw room for: each
        # takes its entries' bytes from that room until its files are written.
        with self._room_lock:
            room = self._room() - self._reserved
            fitting = reserved = 0
            for _key, data, _source in blocks:
                size = entry_size(len(data))
                if reserved + size >= room:
                    break
                fitting, reserved = fitting + 1, reserved + size
            self._reserved += reserved
        written: list[tuple[int, IndexRow]] = []  # (position in blocks, its row)
        try:
            for position, (key, data, source) in enumerate(blocks[:fitting]):
                row = self._write(key, data, source)
                if row is not None:
                    written.append((position, row))
        finally:
            with self._room_lock:
                self._reserved -= reserved
        stored = [False] * len(blocks)
        if not written:
            return stored
        try:
            released = self.index.add([row for _position, row in written])
        except Exception as exc:  # the database is locked past its timeout, or failed
            log.warning("disk cache index update of %d blocks skipped: %s", len(written), exc)
            released = [row.filename for _position, row in written]
        else:
            for position, _row in written:
                stored[position] = True
        for filename in released:
            self._cache.disk.remove(filename)
        return stored

    def _write(self, key: str, data: bytes, source: str) -> IndexRow | None:
        """Write a block's entry file (not yet in the index); None when that failed."""
        filename = self._cache.disk.filename()[0]
        try:
            size = write_entry(os.path.join(self.directory, filename), key, data, self.compress)
        except Exception as exc:  # a full disk, an I/O error...: this block is not cached
            log.warning("disk cache write of %s skipped: %s", key, exc)
            if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
                self._shrink()  # so that the next write finds a descriptor
            return None
        return IndexRow(key, filename, size, source)

    def delete(self, key: str) -> None:
        self.open_entries.drop(key)
        try:
            self._cache.delete(key)
        except Exception as exc:
            log.warning("disk cache delete of %s failed: %s", key, exc)

    def _room(self) -> int:
        """Bytes that can be written before the disk's free space falls to its floor."""
        try:
            usage = shutil.disk_usage(self.directory)
        except OSError:
            return -1
        return int(usage.free - self.free_ratio * usage.total)

    def volume(self) -> int:
        """Bytes the tier occupies on disk (entries plus the database)."""
        return int(self._cache.volume())

    def usage_by_source(self) -> Iterator[SourceUsage]:
        """Blocks and bytes per source (the entries' tag), largest first (diskindex.py)."""
        for tag, blocks, size in usage_by_tag(self.directory, float(self._cache.timeout)):
            yield SourceUsage(tag, blocks, size)

    def clear(self, source: str | None = None) -> int:
        """Remove every block (or one source's); returns how many were removed."""
        if source is None:
            self.open_entries.close_all()
            return int(self._cache.clear())
        return int(self._cache.evict(source))

    def sweep(self) -> Swept:
        """Remove the entry files no row names that a crash left (orphans.py)."""
        return sweep_orphans(self.directory)

    def sweep_in_background(self) -> None:
        """Start that sweep in a thread of its own (a mount starting); `close` stops it."""
        self._stop_sweep = sweep_in_background(self.directory)

    def close(self) -> None:
        if self._stop_sweep is not None:
            self._stop_sweep()
        self.open_entries.close_all()
        self.index.close()
        self._cache.close()

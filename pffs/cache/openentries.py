"""Disk-tier entries kept open: a bounded LRU of file descriptors with their parsed headers.

A random read of a cached block then costs one pread and one CRC of the 64 KiB chunks it
touches, instead of a diskcache (SQLite) lookup, an open and a header parse. The disk tier
(disk.py) decides what is valid; this module only holds descriptors and closes them safely:

- Worker threads read through a descriptor while another thread may evict it, so each entry
  counts its readers: evicting or dropping an entry retires it, and the last reader closes it.
  Closing a descriptor under a pread could let the number be reused by another open and the
  read land in the wrong file.
- The bound is a share of RLIMIT_NOFILE (`descriptor_share`). Running out of descriptors
  anyway (EMFILE/ENFILE: other parts of the process, or a lower limit) makes the disk tier call
  `shrink`, which halves the bound and closes the least recently used. The bound then grows
  back by one for every `_REGROW` entries opened, up to where it started: a spike of
  descriptors elsewhere does not cost the cache for good, and a real shortage halves it again.

Thread-safe (one lock, held for dictionary updates only, never for I/O).
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from dataclasses import dataclass

from pffs.cache.entries import Layout

# The share of the process's descriptor limit the disk tier may keep open: the rest is for
# FUSE, sockets to the store, staging files and the kernel's own needs.
_SHARE = 4
# 64 GiB of 4 MiB blocks. Each open entry holds its CRC table, path and bookkeeping in the
# process and pins an inode and a file in the kernel: about 13 MiB at most in all.
_MAX_OPEN = 16384
_REGROW = 16


def descriptor_share() -> int:
    """How many entries to keep open: a quarter of the soft RLIMIT_NOFILE, at most 16,384."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_OPEN
    return max(0, min(_MAX_OPEN, soft // _SHARE))


@dataclass(eq=False, slots=True)
class OpenEntry:
    """One open, verified entry. `users` and `retired` are guarded by the cache's lock."""

    fd: int
    path: str
    layout: Layout
    users: int = 0
    retired: bool = False


class OpenEntries:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self.limit = self.capacity  # what `shrink` lowers the bound from, and regrowth ends at
        self._opened_since_shrink = 0
        self._entries: OrderedDict[str, OpenEntry] = OrderedDict()
        self._keys_by_path: dict[str, str] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str) -> OpenEntry | None:
        """The key's open entry, held for a read until `release`; None when none is open."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            entry.users += 1
            return entry

    def release(self, entry: OpenEntry) -> None:
        """A read is done with the entry; the last reader of a retired entry closes it."""
        with self._lock:
            entry.users -= 1
            close = entry.retired and entry.users == 0
        if close:
            os.close(entry.fd)

    def add(self, key: str, entry: OpenEntry) -> OpenEntry:
        """Keep a freshly opened entry (held for the caller's read, to `release`).

        Over the bound the least recently used are retired; with a bound of 0 (after
        descriptors ran out) the entry is only lent: closed when the caller releases it.
        """
        closing: list[OpenEntry] = []
        with self._lock:
            entry.users = 1
            if self.capacity < self.limit:
                self._opened_since_shrink += 1
                if self._opened_since_shrink % _REGROW == 0:
                    self.capacity += 1
            if self.capacity == 0:
                entry.retired = True
                return entry
            old = self._entries.pop(key, None)  # another thread opened it at the same time
            if old is not None:
                closing += self._retire(key, old)
            self._entries[key] = entry
            self._keys_by_path[entry.path] = key
            closing += self._trim()
        self._close(closing)
        return entry

    def drop(self, key: str) -> None:
        """Forget the key's entry (damaged, deleted or replaced); closed once unused."""
        with self._lock:
            entry = self._entries.pop(key, None)
            closing = [] if entry is None else self._retire(key, entry)
        self._close(closing)

    def drop_path(self, path: str) -> None:
        """Forget the entry open at `path` (diskcache is removing the file: eviction, delete)."""
        with self._lock:
            key = self._keys_by_path.get(path)
            entry = None if key is None else self._entries.get(key)
            if key is None or entry is None or entry.path != path:
                return
            del self._entries[key]
            closing = self._retire(key, entry)
        self._close(closing)

    def shrink(self) -> int:
        """Halve the bound and close the least recently used (descriptors ran out); the
        bound it leaves."""
        with self._lock:
            self.capacity = len(self._entries) // 2
            self._opened_since_shrink = 0
            closing = self._trim()
        self._close(closing)
        return self.capacity

    def close_all(self) -> None:
        with self._lock:
            closing = []
            while self._entries:
                key, entry = self._entries.popitem(last=False)
                closing += self._retire(key, entry)
        self._close(closing)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> list[OpenEntry]:
        """Retire the least recently used beyond the bound (the lock is held)."""
        closing: list[OpenEntry] = []
        while len(self._entries) > self.capacity:
            key, entry = self._entries.popitem(last=False)
            closing += self._retire(key, entry)
        return closing

    def _retire(self, key: str, entry: OpenEntry) -> list[OpenEntry]:
        """Mark a removed entry retired; it, when no read holds it (the lock is held)."""
        if self._keys_by_path.get(entry.path) == key:
            del self._keys_by_path[entry.path]
        entry.retired = True
        return [entry] if entry.users == 0 else []

    @staticmethod
    def _close(entries: list[OpenEntry]) -> None:
        for entry in entries:  # outside the lock: close can take a while on some file systems
            os.close(entry.fd)

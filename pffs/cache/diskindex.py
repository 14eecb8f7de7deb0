"""Batches of disk-tier entries into and out of diskcache's index, by its SQL.

diskcache's `Cache.set` costs seven statements and a transaction per entry (a lookup, the row,
an expiry scan, the page count and the size for its eviction check, BEGIN and COMMIT), and it
removes the files of rows it replaces or evicts before its caller's transaction commits. A
write-behind batch instead costs a handful of statements in all: the keys it replaces, one
DELETE and one INSERT of every row (executemany), one eviction check, and its files removed
once the transaction has committed (a rollback or a crash then leaves no row naming a removed
file). A batch of reads looks its keys up in one SELECT (`lookup`).

The rows are diskcache's own (its schema 5.x: `Cache` with its triggers keeping the count and
size in `Settings`, the tag index, least-recently-stored eviction by `store_time`), so
diskcache reads, evicts and deletes them as its own, `pffs cache info` counts them, and several
processes share the directory through SQLite's locking (BEGIN IMMEDIATE, as diskcache does).
Connections come from a small pool (one per call running at once, whatever its thread), each
set like diskcache's (WAL, synchronous NORMAL, its busy timeout).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import diskcache

_Execute = Callable[..., sqlite3.Cursor]
# diskcache culls at most this many entries per write; a batch may evict as many per block.
_CULL_PER_ROW = 16


@dataclass(frozen=True)
class IndexRow:
    """One entry of a batch: its key, its file (relative to the directory), size and tag."""

    key: str
    filename: str
    size: int
    tag: str


class BatchIndex:
    """Writes batches of rows into the diskcache index of `directory` (see the module doc)."""

    def __init__(self, directory: str, size_limit: int, timeout: float) -> None:
        self._database = os.path.join(directory, diskcache.core.DBNAME)
        self._size_limit = size_limit
        self._timeout = timeout
        self._connections: list[sqlite3.Connection] = []  # all made, for `close`
        self._idle: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A connection for one call, from a pool: as many are made as calls ever ran at once,
        whichever threads ran them (trio's worker threads come and go; one connection per
        thread would leave one open behind each thread gone)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's are not its to use
                self._connections, self._idle, self._pid = [], [], os.getpid()
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            # autocommit mode: the transaction is ours (BEGIN IMMEDIATE ... COMMIT)
            connection = sqlite3.connect(
                self._database,
                timeout=self._timeout,
                isolation_level=None,
                check_same_thread=False,  # one call at a time, from any thread
            )
            connection.execute("PRAGMA synchronous = NORMAL")  # diskcache's setting
            with self._lock:
                self._connections.append(connection)
        try:
            yield connection
        finally:
            with self._lock:
                self._idle.append(connection)

    def lookup(self, keys: Sequence[str]) -> dict[str, tuple[str, int]]:
        """The entries of those keys the index holds: key -> (file, size), in one SELECT (a
        batch of reads pays one SQLite round trip, not one `Cache.get` per key). Rows read
        as diskcache's `get` reads them: raw keys, not expired. Raises sqlite3.Error."""
        if not keys:
            return {}
        marks = ",".join("?" * len(keys))
        with self._connection() as connection:
            rows = connection.execute(
                f"SELECT key, filename, size FROM Cache WHERE key IN ({marks}) AND raw = 1"
                " AND (expire_time IS NULL OR expire_time > ?)",
                [*keys, time.time()],
            ).fetchall()
        return {key: (filename, int(size)) for key, filename, size in rows if filename}

    def add(self, rows: Sequence[IndexRow]) -> list[str]:
        """Index the rows (replacing rows of the same keys), evicting the least recently
        stored entries beyond the size limit, in one transaction; the files of the rows it
        replaced or evicted, for the caller to remove (they are unreferenced once this returns).
        Raises sqlite3.Error when the transaction fails; then nothing changed."""
        with self._connection() as connection:
            return self._add(connection, rows)

    def _add(self, connection: sqlite3.Connection, rows: Sequence[IndexRow]) -> list[str]:
        sql = connection.execute
        latest = {row.key: row for row in rows}  # a key twice in a batch: its last row stays
        released = [row.filename for row in rows if latest[row.key] is not row]
        keys = list(latest)
        now = time.time()
        sql("BEGIN IMMEDIATE")
        try:
            marks = ",".join("?" * len(keys))
            where = f"key IN ({marks}) AND raw = 1"
            replaced = [name for (name,) in sql(f"SELECT filename FROM Cache WHERE {where}", keys)]
            if replaced:
                sql(f"DELETE FROM Cache WHERE {where}", keys)
            connection.executemany(
                "INSERT INTO Cache(key, raw, store_time, expire_time, access_time,"
                " access_count, tag, size, mode, filename, value)"
                " VALUES (?, 1, ?, NULL, ?, 0, ?, ?, ?, ?, NULL)",
                [
                    (row.key, now, now, row.tag, row.size, diskcache.core.MODE_BINARY, row.filename)
                    for row in latest.values()
                ],
            )
            released += replaced + self._cull(sql, len(latest))
            sql("COMMIT")
        except BaseException:
            if connection.in_transaction:
                sql("ROLLBACK")
            raise
        return [name for name in released if name is not None]

    def entry_count(self) -> int:
        """Rows in the index (diskcache's own count in `Settings`, kept by its triggers)."""
        with self._connection() as connection:
            rows = connection.execute("SELECT value FROM Settings WHERE key = 'count'")
            ((count,),) = rows.fetchall()
        return int(count)

    def keys_after(self, rowid: int) -> Iterator[tuple[int, str]]:
        """(rowid, key) of every row above `rowid`, streamed in rowid order (the connection is
        held until the iteration ends: consume it whole)."""
        with self._connection() as connection:
            yield from connection.execute(
                "SELECT rowid, key FROM Cache WHERE rowid > ? ORDER BY rowid", (rowid,)
            )

    def _cull(self, sql: _Execute, added: int) -> list[str]:
        """Delete the oldest rows until the index is within its size limit (as diskcache
        measures it: the database's pages plus the entries' sizes); their files."""
        ((page_count,),) = sql("PRAGMA page_count").fetchall()
        ((page_size,),) = sql("PRAGMA page_size").fetchall()
        ((size,),) = sql("SELECT value FROM Settings WHERE key = 'size'").fetchall()
        excess = page_count * page_size + int(size) - self._size_limit
        if excess < 0:
            return []
        victims: list[tuple[int, str]] = []
        oldest = sql(
            "SELECT rowid, filename, size FROM Cache ORDER BY store_time LIMIT ?",
            (_CULL_PER_ROW * added,),
        )
        for rowid, filename, entry_size in oldest:
            victims.append((rowid, filename))
            excess -= int(entry_size)
            if excess < 0:
                break
        sql(
            f"DELETE FROM Cache WHERE rowid IN ({','.join('?' * len(victims))})",
            [rowid for rowid, _filename in victims],
        )
        return [filename for _rowid, filename in victims if filename is not None]

    def close(self) -> None:
        with self._lock:
            connections, self._connections, self._idle = self._connections, [], []
        for connection in connections:
            connection.close()


def read_only(directory: str, timeout: float) -> contextlib.closing[sqlite3.Connection]:
    """A read-only connection of our own to the diskcache index in `directory`, closed on
    exit: it sees the rows diskcache and the batches committed (both commit every change) and
    writes nothing. A second diskcache.Cache is no way in: opening one writes its settings."""
    database = os.path.join(directory, diskcache.core.DBNAME)
    uri = f"{pathlib.Path(database).absolute().as_uri()}?mode=ro"
    return contextlib.closing(sqlite3.connect(uri, uri=True, timeout=timeout))


def usage_by_tag(directory: str, timeout: float) -> list[tuple[str, int, int]]:
    """(tag, entries, bytes) of the index in `directory`, largest first (diskcache has no API
    for totals per tag)."""
    with read_only(directory, timeout) as connection:
        rows = connection.execute(
            "SELECT tag, COUNT(*), SUM(size) FROM Cache GROUP BY tag ORDER BY SUM(size) DESC"
        ).fetchall()
    return [(str(tag), int(count), int(size or 0)) for tag, count, size in rows]

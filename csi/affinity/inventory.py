"""What a node's disk cache holds, per source, kept current without rescanning blocks.

Cached bytes and blocks per source come from the disk tier's own SQLite index (diskcache's
`cache.db` in the cache directory). Once, `CacheInventory` adds a small table `PffsTagUsage`
(tag, blocks, bytes) to that database, filled by one GROUP BY over the blocks and from then on
kept current by SQLite triggers on insert, update and delete of blocks. Every writer (each
mount, `pffs warmup`, eviction and `pffs cache clear`, in any process) therefore keeps the totals
right inside its own transaction, and reading them costs one query over a table of one row per
source, however many blocks there are. The tier's code is untouched: the triggers live in the
database, and diskcache ignores tables it does not know.

The database is opened with plain sqlite3, never through diskcache.Cache: opening a Cache
writes its settings (size limit, eviction policy) into the database and would override the
mounts' own.

A source's total size comes from listing it once through its backend (in the background, with
the node plugin's credentials), remembered in `pffs-sources.json` in the cache directory and
listed again after `refresh` seconds (datasets change rarely; a stale total only skews a ratio).
Whoever already knows a total (the mount or warmup after a full listing) can record it with
`SourceTotals.record`. Listing was chosen over recording it in the mount because a mount never
lists the whole tree, and over summing object sizes from the cache because the cache holds only
what was read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pffs.csi.affinity.labels import DatasetCache, source_url_of

log = logging.getLogger("pffs.csi.inventory")

DB_NAME = "cache.db"  # diskcache's index file
TOTALS_NAME = "pffs-sources.json"
DEFAULT_BLOCK_SIZE = 4 << 20  # the cache's default block (CacheConfig.block_size)

_TABLE = "PffsTagUsage"
_SCHEMA = (
    f"CREATE TABLE {_TABLE} "
    "(tag TEXT PRIMARY KEY, blocks INTEGER NOT NULL, bytes INTEGER NOT NULL)",
    # COALESCE: an untagged block counts under '' (a NULL primary key would not be unique).
    f"""CREATE TRIGGER {_TABLE}_insert AFTER INSERT ON Cache FOR EACH ROW BEGIN
        INSERT INTO {_TABLE} (tag, blocks, bytes) VALUES (COALESCE(NEW.tag, ''), 1, NEW.size)
        ON CONFLICT(tag) DO UPDATE SET blocks = blocks + 1, bytes = bytes + NEW.size; END""",
    f"""CREATE TRIGGER {_TABLE}_delete AFTER DELETE ON Cache FOR EACH ROW BEGIN
        UPDATE {_TABLE} SET blocks = blocks - 1, bytes = bytes - OLD.size
        WHERE tag = COALESCE(OLD.tag, ''); END""",
    # diskcache replaces an existing key with an UPDATE of its row: move the old row's share.
    f"""CREATE TRIGGER {_TABLE}_update AFTER UPDATE OF tag, size ON Cache FOR EACH ROW BEGIN
        UPDATE {_TABLE} SET blocks = blocks - 1, bytes = bytes - OLD.size
        WHERE tag = COALESCE(OLD.tag, '');
        INSERT INTO {_TABLE} (tag, blocks, bytes) VALUES (COALESCE(NEW.tag, ''), 1, NEW.size)
        ON CONFLICT(tag) DO UPDATE SET blocks = blocks + 1, bytes = bytes + NEW.size; END""",
)
_OBJECTS = (f"{_TABLE}", f"{_TABLE}_insert", f"{_TABLE}_delete", f"{_TABLE}_update")
# What diskcache makes last of a cache's index, with the tag index the disk tier asks for.
_MADE_LAST = "Cache_tag_rowid"


@dataclass(frozen=True)
class SourceTotal:
    """A source's size as measured by listing it."""

    bytes: int
    objects: int
    blocks: int  # blocks of `block_size` its objects occupy in the cache
    block_size: int
    listed_at: float


class CacheInventory:
    """Per-source usage of one cache directory's disk tier (read-only apart from the triggers)."""

    def __init__(self, cache_dir: str, timeout: float = 10.0) -> None:
        self.cache_dir = cache_dir
        self.db_path = os.path.join(cache_dir, DB_NAME)
        self._timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is not None:
            return self._conn
        if not os.path.exists(self.db_path):
            return None  # no mount has used this cache yet
        conn = sqlite3.connect(
            self.db_path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        try:
            # A mount creating the cache right now: the tables and triggers installed while
            # diskcache makes its own would fail its last step ("database is locked"), and the
            # mount with it. Its tag index (DiskTier asks for one) is made last.
            made = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (_MADE_LAST,)
            ).fetchone()
            if made is None:
                conn.close()
                return None
            self._install(conn)
        except Exception:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _install(self, conn: sqlite3.Connection) -> None:
        """Add the usage table and triggers once, seeded in the same transaction."""
        names = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE ?", (f"{_TABLE}%",)
            )
        }
        if names.issuperset(_OBJECTS):
            return
        # IMMEDIATE takes the write lock first, so no block is added between seeding the table
        # from the blocks and the triggers taking over.
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "Cache" not in tables:
                conn.execute("ROLLBACK")
                raise sqlite3.OperationalError("not a diskcache database (no Cache table)")
            for name in _OBJECTS[1:]:
                conn.execute(f"DROP TRIGGER IF EXISTS {name}")
            conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {_TABLE} (tag, blocks, bytes) "
                "SELECT COALESCE(tag, ''), COUNT(*), COALESCE(SUM(size), 0) FROM Cache "
                "GROUP BY COALESCE(tag, '')"
            )
            conn.execute("COMMIT")
        except sqlite3.OperationalError:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        log.info("per-source usage tracking installed in %s", self.db_path)

    def usage(self) -> dict[str, tuple[int, int]]:
        """{source id: (blocks, bytes)} of the sources with blocks on disk; {} without a cache."""
        with self._lock:
            conn = self._connect()
            if conn is None:
                return {}
            rows = conn.execute(f"SELECT tag, blocks, bytes FROM {_TABLE} WHERE blocks > 0")
            return {str(tag): (int(blocks), int(size)) for tag, blocks, size in rows if tag}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _blocks_of(size: int, block_size: int) -> int:
    return max(1, -(-size // block_size))  # an empty object still gets its (empty) block


def list_source_total(source_id: str, block_size: int = DEFAULT_BLOCK_SIZE) -> SourceTotal:
    """Walk a source through its backend and add up its files (blocking; minutes for huge trees)."""
    from pffs.backends import open_backend
    from pffs.backends.base import join
    from pffs.config import SourceConfig

    url, endpoint = source_url_of(source_id)
    backend = open_backend(SourceConfig(url=url, endpoint_url=endpoint))
    total = objects = blocks = 0
    pending = [""]
    while pending:
        directory = pending.pop()
        for info in backend.list(directory):
            if info.is_dir:
                pending.append(join(directory, info.name))
            else:
                total += info.size
                objects += 1
                blocks += _blocks_of(info.size, block_size)
    return SourceTotal(total, objects, blocks, block_size, time.time())


class SourceTotals:
    """Totals per source in `<cache_dir>/pffs-sources.json`, listed in the background on demand."""

    def __init__(
        self,
        cache_dir: str,
        block_size: int = DEFAULT_BLOCK_SIZE,
        refresh: float = 6 * 3600.0,
        retry_after: float = 600.0,
        lister: Callable[[str, int], SourceTotal] = list_source_total,
    ) -> None:
        self.path = os.path.join(cache_dir, TOTALS_NAME)
        self.block_size = block_size
        self.refresh = refresh
        self.retry_after = retry_after
        self._lister = lister
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._failed_at: dict[str, float] = {}
        # One listing at a time: a node plugin should not hammer the stores.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pffs-list")

    def load(self) -> dict[str, SourceTotal]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.path, exc)
            return {}
        out: dict[str, SourceTotal] = {}
        for sid, entry in (doc.get("sources") or {}).items() if isinstance(doc, dict) else ():
            try:
                out[sid] = SourceTotal(
                    int(entry["bytes"]),
                    int(entry["objects"]),
                    int(entry["blocks"]),
                    int(entry["block_size"]),
                    float(entry["listed_at"]),
                )
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def record(self, source_id: str, total: SourceTotal) -> None:
        """Remember a total (atomically replacing the file; a concurrent writer's entry is kept)."""
        with self._lock:
            current = self.load()
            current[source_id] = total
            doc = {"sources": {sid: t.__dict__ for sid, t in sorted(current.items())}}
            directory = os.path.dirname(self.path)
            fd, tmp = tempfile.mkstemp(prefix=".pffs-sources.", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=1)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def request(self, source_ids: list[str], known: dict[str, SourceTotal]) -> None:
        """Queue listings of sources with no total, or one older than `refresh`."""
        now = time.time()
        for sid in source_ids:
            have = known.get(sid)
            if have is not None and now - have.listed_at < self.refresh:
                continue
            with self._lock:
                if (
                    sid in self._in_flight
                    or now - self._failed_at.get(sid, -1e18) < self.retry_after
                ):
                    continue
                self._in_flight.add(sid)
            self._pool.submit(self._list, sid)

    def _list(self, source_id: str) -> None:
        try:
            total = self._lister(source_id, self.block_size)
            self.record(source_id, total)
            log.info("%s: %d objects, %d bytes", source_id, total.objects, total.bytes)
        except Exception as exc:  # no credentials here, store down, source gone: retry later
            log.warning("cannot list %s for its total size: %s", source_id, exc)
            with self._lock:
                self._failed_at[source_id] = time.time()
        finally:
            with self._lock:
                self._in_flight.discard(source_id)

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def summarize(
    usage: dict[str, tuple[int, int]], totals: dict[str, SourceTotal]
) -> dict[str, DatasetCache]:
    """Join usage and totals into DatasetCache records (ratio by blocks, else by bytes)."""
    out: dict[str, DatasetCache] = {}
    for sid, (blocks, size) in usage.items():
        total = totals.get(sid)
        ratio: float | None = None
        if total is not None:
            # Blocks are counted, not bytes, where possible: lz4 shrinks what is on disk.
            if total.blocks > 0:
                ratio = min(1.0, blocks / total.blocks)
            elif total.bytes > 0:
                ratio = min(1.0, size / total.bytes)
            else:
                ratio = 1.0
        out[sid] = DatasetCache(sid, size, blocks, total.bytes if total else None, ratio)
    return out

"""Per-source usage of a real disk tier, kept by SQLite triggers, and source totals (inventory).

Uses the real DiskTier (diskcache on disk) as the mounts do, and real backends for listing:
a directory (file://) and moto's S3 server over HTTP.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import time
from pathlib import Path

import diskcache
import pytest

from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey
from pffs.csi.affinity.inventory import (
    DB_NAME,
    CacheInventory,
    SourceTotal,
    SourceTotals,
    list_source_total,
    summarize,
)
from pffs.testing.servers import MotoServer
from tests.waiting import eventually

A, B = "s3://bucket-a/train", "file:///srv/b"


def _tier(path: Path) -> DiskTier:
    return DiskTier(str(path), capacity=1 << 30, free_ratio=0.0, compress=True)


def _put(tier: DiskTier, source: str, path: str, index: int, data: bytes) -> str:
    key = entry_key(BlockKey(source, "u", path, "v1", index), 4 << 20)
    assert tier.put(key, data, source)
    return key


def _expected(tier: DiskTier) -> dict[str, tuple[int, int]]:
    return {u.source: (u.blocks, u.bytes) for u in tier.usage_by_source() if u.blocks}


def test_usage_follows_puts_replacements_deletes_and_clears(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    inventory = CacheInventory(str(tmp_path))
    assert inventory.usage() == {}  # empty cache, tables installed
    keys = [_put(tier, A, "f", i, os.urandom(1000 + i)) for i in range(5)]
    _put(tier, B, "g", 0, b"x" * 50_000)  # compressible: fewer bytes on disk than data
    assert inventory.usage() == _expected(tier)
    assert inventory.usage()[A][0] == 5

    _put(tier, A, "f", 0, os.urandom(3000))  # the same key again: an UPDATE of the row
    tier.delete(keys[1])
    assert inventory.usage() == _expected(tier)
    assert inventory.usage()[A][0] == 4

    tier.clear(A)
    assert inventory.usage() == _expected(tier)
    assert A not in inventory.usage()
    tier.clear()
    assert inventory.usage() == {}
    tier.close()
    inventory.close()


def test_installing_on_a_used_cache_counts_what_is_there(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    for i in range(7):
        _put(tier, A, "f", i, os.urandom(2048))
    inventory = CacheInventory(str(tmp_path))
    assert inventory.usage() == {A: _expected(tier)[A]}
    inventory.close()
    again = CacheInventory(str(tmp_path))  # a second install finds the triggers in place
    _put(tier, A, "f", 7, os.urandom(2048))
    assert again.usage()[A][0] == 8
    again.close()
    tier.close()


def _fill(directory: str, source: str, count: int) -> None:
    tier = DiskTier(directory, capacity=1 << 30, free_ratio=0.0, compress=False)
    for i in range(count):
        tier.put(entry_key(BlockKey(source, "u", "p", "v", i), 4 << 20), os.urandom(4096), source)
    tier.close()


def test_a_cache_being_made_is_left_alone_until_it_is_whole(tmp_path: Path) -> None:
    """A mount creating its cache while the publisher looks: the tables and triggers installed
    before diskcache has made its index ended the mount ("database is locked" at its last
    step). Until the index is whole (its tag index, made last), nothing is installed."""
    diskcache.Cache(str(tmp_path)).close()  # diskcache's steps but the last (no tag index)
    inventory = CacheInventory(str(tmp_path))
    assert inventory.usage() == {}
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'Pffs%'").fetchall()
    tier = _tier(tmp_path)  # the mount's cache, whole
    _put(tier, A, "f", 0, os.urandom(2048))
    assert inventory.usage() == _expected(tier)
    tier.close()
    inventory.close()


def test_blocks_written_by_another_process_are_counted(tmp_path: Path) -> None:
    _tier(tmp_path).close()
    inventory = CacheInventory(str(tmp_path))
    assert inventory.usage() == {}
    # A mount or `pffs warmup` in another process: the triggers run inside its transactions.
    proc = multiprocessing.get_context("spawn").Process(target=_fill, args=(str(tmp_path), B, 6))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert inventory.usage()[B][0] == 6
    inventory.close()


def test_eviction_by_the_size_bound_is_counted(tmp_path: Path) -> None:
    # The bound counts the SQLite file too (some 100 KiB here), so a few 32 KiB blocks stay.
    tier = DiskTier(str(tmp_path), capacity=512 * 1024, free_ratio=0.0, compress=False)
    inventory = CacheInventory(str(tmp_path))
    for i in range(40):
        _put(tier, A, "big", i, os.urandom(32768))
    usage = inventory.usage()
    assert usage == _expected(tier)
    assert 0 < usage[A][0] < 40  # diskcache culled the oldest blocks and the table followed
    tier.close()
    inventory.close()


def test_listing_a_local_source(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"x" * 10)
    (root / "sub" / "b.bin").write_bytes(b"x" * (5 << 20))  # two 4 MiB blocks
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    total = list_source_total(f"file://{root}", 4 << 20)
    assert (total.bytes, total.objects, total.blocks) == (10 + (5 << 20), 3, 4)


def test_listing_an_s3_source_with_its_endpoint(moto: MotoServer, s3, bucket: str) -> None:
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"ds/part-{i}", Body=b"y" * 1000)
    s3.put_object(Bucket=bucket, Key="ds/nested/x", Body=b"z" * 24)
    s3.put_object(Bucket=bucket, Key="elsewhere", Body=b"not counted")
    total = list_source_total(f"s3://{bucket}/ds@{moto.endpoint_url}", 4 << 20)
    assert (total.bytes, total.objects, total.blocks) == (3024, 4, 4)


def test_totals_are_listed_in_the_background_and_remembered(tmp_path: Path) -> None:
    calls: list[str] = []

    def lister(sid: str, block_size: int) -> SourceTotal:
        calls.append(sid)
        if sid == B:
            raise OSError("no credentials on this node")
        return SourceTotal(100, 2, 3, block_size, time.time())

    totals = SourceTotals(str(tmp_path), refresh=3600, retry_after=3600, lister=lister)
    totals.request([A, B], {})
    eventually(totals.idle, 10, "the totals listed")
    known = totals.load()
    assert set(known) == {A} and known[A].blocks == 3
    totals.request([A, B], known)  # A is fresh, B failed recently: nothing to do
    time.sleep(0.1)
    assert sorted(calls) == sorted([A, B])
    # Another instance (a restarted node plugin) reads the file.
    assert SourceTotals(str(tmp_path)).load()[A].bytes == 100
    totals.close()


def test_summary_ratio_counts_blocks_not_compressed_bytes() -> None:
    usage = {A: (3, 1000), B: (2, 500), "s3://c/d": (1, 10)}
    totals = {
        A: SourceTotal(12 << 20, 3, 3, 4 << 20, 0.0),
        B: SourceTotal(40 << 20, 1, 10, 4 << 20, 0.0),
    }
    summary = summarize(usage, totals)
    assert summary[A].ratio == 1.0 and summary[A].total == 12 << 20
    assert summary[B].ratio == pytest.approx(0.2)
    assert summary[B].cached_bytes == 8 << 20
    assert summary["s3://c/d"].ratio is None and summary["s3://c/d"].cached_bytes == 10

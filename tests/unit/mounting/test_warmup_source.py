"""Warmup through a mount's parts (pffs.mounting.warmup), on a real directory source and a
real disk cache: it fills the cache, a second run finds every block there, its requests go
through the source's breaker, and a nested tree is found whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from pffs import metrics
from pffs.backends import open_backend
from pffs.config import CacheConfig, SourceConfig
from pffs.mounting import warmup
from pffs.mounting.warmup import WarmupTally, warm_source

MIB = 1 << 20


def tree(root: Path) -> int:
    """Files in nested directories (one empty); their total size."""
    sizes = {"a/1.bin": 3 * MIB, "a/b/2.bin": 100, "a/b/c/3.bin": MIB + 1, "top.bin": 0}
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([len(name)]) * size)
    return sum(sizes.values())


def warm(source: SourceConfig, cache: CacheConfig) -> WarmupTally:
    tally = WarmupTally()
    trio.run(warm_source, source, cache, [""], 4, tally)
    return tally


def test_warmup_fills_the_cache_then_finds_it_full(tmp_path: Path) -> None:
    data = tmp_path / "data"
    total = tree(data)
    source = SourceConfig(url=f"file://{data}")
    cache = CacheConfig(disk_dir=str(tmp_path / "cache"), block_size=1 * MIB, free_ratio=0.0)

    first = warm(source, cache)
    assert (first.files_total, first.files_done, first.bytes_total) == (4, 4, total)
    assert (first.bytes_fetched, first.bytes_cached, first.failures) == (total, 0, [])

    second = warm(source, cache)
    assert (second.bytes_fetched, second.bytes_cached) == (0, total)


def test_warmup_goes_through_the_sources_breaker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tree(data)
    source = SourceConfig(url=f"file://{data}")
    warm(source, CacheConfig(disk_dir=str(tmp_path / "cache"), block_size=1 * MIB, free_ratio=0.0))
    # Opened as a mount opens its sources: with the source's breaker (pffs.store.fetching.Store
    # takes it from the Mounted; before, warmup's source had none), which shows it up.
    up = metrics.REGISTRY.get_sample_value(
        "pffs_source_up", {"source": open_backend(source).source_id}
    )
    assert up == 1


def test_a_listing_taken_in_chunks_finds_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 2 over directories of 4 and 5 entries: a full last chunk and a short one
    lose nothing."""
    monkeypatch.setattr(warmup, "LIST_CHUNK", 2)
    data = tmp_path / "data"
    for name in ["a", "b", "c", "d/v", "d/w", "d/x", "d/y", "d/z"]:
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(b"z" * 10)
    tally = warm(
        SourceConfig(url=f"file://{data}"),
        CacheConfig(disk_dir=str(tmp_path / "c"), free_ratio=0.0),
    )
    assert (tally.files_total, tally.bytes_fetched, tally.failures) == (8, 80, [])

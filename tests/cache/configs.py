"""Small cache configurations for the cache's own tests: 16 KiB blocks, a memory tier of 64."""

from __future__ import annotations

from pathlib import Path

from pffs.config import CacheConfig

KIB = 1024


def cache_config(tmp_path: Path | None, block: int = 16 * KIB, **kwargs) -> CacheConfig:
    settings_ = {
        "block_size": block,
        "memory_bytes": 64 * block,
        "disk_dir": str(tmp_path / "cache") if tmp_path else None,
        "readahead_max": 8 * block,
        "ahead_budget": 16 * block,
        **kwargs,
    }
    return CacheConfig(**settings_)

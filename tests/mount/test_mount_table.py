"""One tree over several sources: the table file's validation, routing, and a real mount."""

from __future__ import annotations

import errno
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from pffs.backends import open_backend
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, FuseConfig, MetaConfig, SourceConfig
from pffs.errors import CrossDevice, NotFound, ReadOnly, UsageError
from pffs.fs.vfs import Vfs
from pffs.routing.table import Mounted, MountTable
from pffs.routing.tablefile import parse_table
from tests.conftest import mounted, run_pffs

DEFAULTS = SourceConfig(url="")


def entries(*raw: dict[str, Any]) -> dict[str, Any]:
    return {"mount": list(raw)}


def test_table_file_is_parsed_with_defaults_and_overrides(tmp_path: Path) -> None:
    defaults = SourceConfig(url="", endpoint_url="http://default:9000", max_concurrency=8)
    table = parse_table(
        entries(
            {"path": "/imagenet/", "source": "s3://bucket/imagenet", "read_only": True},
            {"path": "/logs", "source": f"file://{tmp_path}", "cache": "memory"},
            {"path": "/h", "source": "hdfs://nn:9000/x", "user": "u", "replication": 2},
            {"path": "/", "source": "s3://other", "endpoint": "http://e:1", "max_concurrency": 4},
        ),
        defaults,
        "pffs.toml",
    )
    by_path = {entry.path: entry for entry in table}
    assert set(by_path) == {"imagenet", "logs", "h", ""}
    assert by_path["imagenet"].source.read_only
    assert by_path["imagenet"].source.endpoint_url == "http://default:9000"
    assert by_path["logs"].cache == "memory"
    assert (by_path["h"].source.hdfs_user, by_path["h"].source.replication) == ("u", 2)
    assert by_path[""].source.endpoint_url == "http://e:1"
    assert by_path[""].source.max_concurrency == 4


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"mount": [], "extra": 1}, "unknown key 'extra'"),
        ({}, "no [[mount]] entries"),
        (entries({"path": "/a", "source": "s3://bkt", "colour": "red"}), "entry 1: unknown key"),
        (entries({"path": "/a"}), "entry 1: 'source' is missing"),
        (entries({"source": "s3://bkt"}), "entry 1: 'path' is missing"),
        (entries({"path": "a", "source": "s3://bkt"}), "must start with '/'"),
        (entries({"path": "/a/../b", "source": "s3://bkt"}), "'.' or '..'"),
        (entries({"path": "/a", "source": "s3://bkt", "read_only": "yes"}), "read_only must be"),
        (entries({"path": "/a", "source": "s3://bkt", "max_concurrency": 0}), "must not be 0"),
        (entries({"path": "/a", "source": "s3://bkt", "cache": "ssd"}), "cache must not be 'ssd'"),
        (entries({"path": "/a", "source": "gs://b"}), "entry 1 (/a): unknown scheme"),
        (entries({"path": "/a", "source": "s3://Bad_Bucket"}), "entry 1 (/a): malformed URL"),
        (
            entries({"path": "/a", "source": "s3://bkt/x"}, {"path": "/a/", "source": "s3://ccc"}),
            "entry 2 (/a): path /a is already used",
        ),
        (
            entries(
                {"path": "/a", "source": "s3://bkt/x"}, {"path": "/c", "source": "s3://bkt/x/y"}
            ),
            "entry 2 (/c): source s3://bkt/x/y overlaps s3://bkt/x",
        ),
    ],
)
def test_table_file_errors_name_the_entry(document: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)) as caught:
        parse_table(document, DEFAULTS, "pffs.toml")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("pffs.toml")


def test_same_bucket_on_two_endpoints_does_not_overlap() -> None:
    table = parse_table(
        entries(
            {"path": "/a", "source": "s3://bkt", "endpoint": "http://one:1"},
            {"path": "/b", "source": "s3://bkt", "endpoint": "http://two:2"},
        ),
        DEFAULTS,
        "pffs.toml",
    )
    assert len(table) == 2


# --- routing through the VFS, no kernel ------------------------------------------------------


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    local, arrow, nested = tmp_path / "local", tmp_path / "arrow", tmp_path / "nested"
    for root, files in (
        (local, {"x.txt": b"local x", "sub/y.txt": b"local y", "data": b"hidden by mount"}),
        (arrow, {"a.bin": bytes(range(256)) * 40, "d/e.txt": b"arrow e"}),
        (nested, {"n.txt": b"nested n"}),
    ):
        for name, data in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
    return local, arrow, nested


def _vfs(tmp_path: Path, cache_dir: Path | None = None) -> Vfs:
    local, arrow, nested = _tree(tmp_path)

    def backend(url: str) -> Any:
        return open_backend(SourceConfig(url=url))

    table = MountTable(
        [
            Mounted("", backend(f"file://{local}")),
            Mounted("data/arrow", backend(f"arrow+file://{arrow}"), read_only=True),
            Mounted("data/arrow/d/deeper", backend(f"file://{nested}"), disk_cache=False),
        ]
    )
    meta = MetaConfig(attr_ttl=60, entry_ttl=60, dir_ttl=60, negative_ttl=60)
    fuse = FuseConfig(mountpoint="/unused")
    # The cache as a mount opens it: its memory-only sources from the table, at construction.
    cache = (
        None
        if cache_dir is None
        else BlockCache(
            CacheConfig(disk_dir=str(cache_dir), free_ratio=0.0),  # no floor (tests/conftest.py)
            memory_only=table.memory_only,
        )
    )
    return Vfs(table, meta, fuse, cache, staging_dir=str(tmp_path / "staging"))


async def _walk(vfs: Vfs, path: str) -> int:
    ino = 1
    for name in [p for p in path.split("/") if p]:
        ino = (await vfs.lookup(ino, name)).ino
    return ino


async def _names(vfs: Vfs, path: str) -> list[str]:
    fh = await vfs.opendir(await _walk(vfs, path))
    names: list[str] = []

    def emit(name: str, inode: object, next_id: int) -> bool:
        names.append(name)
        return True

    await vfs.readdir(fh, 0, emit)
    vfs.releasedir(fh)
    return names


async def _read(vfs: Vfs, path: str) -> bytes:
    fh, _ = await vfs.open(await _walk(vfs, path), os.O_RDONLY)
    data = bytes(await vfs.read(fh, 0, 1 << 20))
    await vfs.release(fh)
    return data


def test_routing_longest_prefix_and_synthesised_directories(tmp_path: Path) -> None:
    async def main() -> None:
        vfs = _vfs(tmp_path)
        # The root source's own "data" file is hidden by the directory leading to a mount.
        assert sorted(await _names(vfs, "")) == ["data", "sub", "x.txt"]
        assert await _names(vfs, "data") == ["arrow"]  # synthesised: in no source
        assert sorted(await _names(vfs, "data/arrow")) == ["a.bin", "d"]
        assert sorted(await _names(vfs, "data/arrow/d")) == ["deeper", "e.txt"]
        assert await _names(vfs, "data/arrow/d/deeper") == ["n.txt"]
        assert await _read(vfs, "x.txt") == b"local x"
        assert await _read(vfs, "data/arrow/a.bin") == bytes(range(256)) * 40
        assert await _read(vfs, "data/arrow/d/e.txt") == b"arrow e"
        assert await _read(vfs, "data/arrow/d/deeper/n.txt") == b"nested n"
        with pytest.raises(NotFound):
            await _walk(vfs, "data/nothing")
        assert (await vfs.getattr(await _walk(vfs, "data"))).is_dir

    trio.run(main)


def test_per_entry_read_only_and_cross_source_rename(tmp_path: Path) -> None:
    async def main() -> None:
        vfs = _vfs(tmp_path)
        assert vfs.is_read_only("data/arrow/a.bin")
        assert not vfs.is_read_only("x.txt")
        assert not vfs.is_read_only("data/arrow/d/deeper/n.txt")  # its own entry is writable
        arrow_d = await _walk(vfs, "data/arrow/d")
        with pytest.raises(CrossDevice) as caught:
            await vfs.rename(1, "x.txt", arrow_d, "x.txt")
        assert caught.value.errno == errno.EXDEV
        with pytest.raises(ReadOnly):
            await vfs.rename(arrow_d, "e.txt", arrow_d, "f.txt")

    trio.run(main)


def test_memory_only_entry_never_reaches_the_disk_tier(tmp_path: Path) -> None:
    vfs = _vfs(tmp_path, tmp_path / "cache")
    cache = vfs.cache

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            assert await _read(vfs, "data/arrow/d/deeper/n.txt") == b"nested n"
            assert await _read(vfs, "x.txt") == b"local x"
            await vfs.drain()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert cache.disk is not None
    sources = {usage.source for usage in cache.disk.usage_by_source()}
    assert sources == {f"file://{tmp_path / 'local'}"}
    cache.close()


# --- a real mount: moto S3 + a local directory + the arrow backend ---------------------------


@pytest.mark.mount
@pytest.mark.mount
def test_one_tree_over_s3_local_and_arrow(moto, s3, bucket, tmp_path: Path) -> None:
    rng = random.Random(11)
    s3_objects = {"train/part-0.bin": rng.randbytes(5 << 20), "train/labels.csv": b"a,b\n1,2\n"}
    for key, data in s3_objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    local, arrow, nested = _tree(tmp_path)
    big = rng.randbytes(3 << 20)
    (arrow / "big.bin").write_bytes(big)
    config = tmp_path / "pffs.toml"
    config.write_text(
        f"""
[[mount]]
path = "/datasets/s3"
source = "s3://{bucket}"
endpoint = "{moto.endpoint_url}"
read_only = true

[[mount]]
path = "/datasets/s3/train/extra"
source = "file://{nested}"

[[mount]]
path = "/local"
source = "file://{local}"

[[mount]]
path = "/arrow"
source = "arrow+file://{arrow}"
cache = "memory"
"""
    )
    mnt = tmp_path / "mnt"
    with mounted(f"--config={config}", mnt, "--cache-dir", str(tmp_path / "cache")):
        assert sorted(os.listdir(mnt)) == ["arrow", "datasets", "local"]
        assert os.listdir(mnt / "datasets") == ["s3"]
        assert sorted(os.listdir(mnt / "datasets/s3/train")) == [
            "extra",
            "labels.csv",
            "part-0.bin",
        ]
        for key, data in s3_objects.items():
            assert (mnt / "datasets/s3" / key).read_bytes() == data
        assert (mnt / "datasets/s3/train/extra/n.txt").read_bytes() == b"nested n"
        assert (mnt / "local/sub/y.txt").read_bytes() == b"local y"
        assert (mnt / "arrow/big.bin").read_bytes() == big
        assert (mnt / "arrow/d/e.txt").read_bytes() == b"arrow e"
        # The read-only entry shows no write bits; the others do.
        assert (mnt / "datasets/s3/train/labels.csv").stat().st_mode & 0o222 == 0
        assert (mnt / "local/x.txt").stat().st_mode & 0o200
        with pytest.raises(OSError) as caught:
            os.rename(mnt / "local/x.txt", mnt / "arrow/x.txt")
        assert caught.value.errno == errno.EXDEV
        with open("/proc/self/mounts", encoding="utf-8") as f:
            assert any(line.startswith(f"{config} {mnt} fuse.pffs") for line in f)


def test_cli_table_errors_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "pffs.toml"
    config.write_text('[[mount]]\npath = "/a"\nsource = "s3://bkt"\nregoin = "x"\n')
    (tmp_path / "mnt").mkdir()
    result = run_pffs("mount", "--config", str(config), str(tmp_path / "mnt"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "entry 1: unknown key 'regoin'" in result.stderr
    result = run_pffs("mount", "s3://bkt", str(tmp_path / "mnt"), "--config", str(config))
    assert result.returncode == 2 and "not both" in result.stderr
    config.write_text("[[mount]\n")
    result = run_pffs("mount", "--config", str(config), str(tmp_path / "mnt"))
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    result = run_pffs("mount", "--config", str(tmp_path / "nope.toml"), str(tmp_path / "mnt"))
    assert result.returncode == 2 and "cannot read the mount table" in result.stderr

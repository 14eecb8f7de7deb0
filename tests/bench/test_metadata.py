"""The metadata-at-scale and remount scenarios on small sizes: the tree put in the store, `ls -lR`
and stat after a listing through a real pffs mount, and the remounted epoch with its request
count. They check that each figure comes from real work, never how large it is."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from bench.data import Dataset, Sizes, epoch_names
from bench.metadata import (
    TREE_MARKER,
    create_tree,
    ls_recursive,
    put_tiny_objects,
    stat_after_listing,
    tree_names,
)
from bench.remount import remount_epoch
from bench.servers import Server
from bench.systems import Pffs, rss_bytes, unmount
from pffs.testing.servers import MotoServer
from tests.conftest import NO_FREE_FLOOR

TREE_FILES = 300


@pytest.fixture
def near_moto(moto: MotoServer) -> Server:
    env = os.environ
    return Server("moto", moto.endpoint_url, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])


def dataset_of(bucket: str, tree_files: int = 0, epoch_keys: list[str] | None = None) -> Dataset:
    keys = epoch_keys or []
    sizes = Sizes(
        large=0, parallel=0, small_files=0, wide_files=0, write=0,
        epoch_files=len(keys), epoch_size=10_000, tree_files=tree_files,
    )  # fmt: skip
    return Dataset(bucket, sizes, "", "", [], [], keys)


def test_the_tree_spreads_its_objects_evenly_over_its_directories() -> None:
    names = tree_names(1000, dirs=100)
    assert len(set(names)) == 1001 and names[-1] == TREE_MARKER
    per_dir = Counter(name.rsplit("/", 1)[0] for name in names[:-1])
    assert len(per_dir) == 100 and set(per_dir.values()) == {10}


def test_the_tree_is_put_and_checked_in_the_store(near_moto: Server, s3, bucket: str) -> None:
    create_tree(near_moto, dataset_of(bucket, TREE_FILES))
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="tree/")
    keys = [item["Key"] for page in pages for item in page["Contents"]]
    assert sorted(keys) == sorted(tree_names(TREE_FILES))
    assert s3.get_object(Bucket=bucket, Key=keys[-1])["Body"].read() == b"t"


def test_a_put_the_store_refuses_is_an_error(near_moto: Server) -> None:
    with pytest.raises(RuntimeError, match="PUT tree/d000/o000000 failed even when signed"):
        put_tiny_objects(near_moto, "no-such-bucket-here", tree_names(5))


@pytest.mark.mount
def test_ls_recursive_and_stat_after_listing_through_a_mount(
    near_moto: Server, bucket: str, tmp_path: Path
) -> None:
    create_tree(near_moto, dataset_of(bucket, TREE_FILES))
    mnt, cache = tmp_path / "mnt", tmp_path / "cache"
    mnt.mkdir()
    cache.mkdir()
    pid = Pffs([]).mount(near_moto, bucket, str(mnt), str(cache))
    try:
        assert rss_bytes(pid) is not None
        seconds, per_entry = ls_recursive(str(mnt / "tree"), TREE_FILES + 1, 100, pid)
        assert seconds > 0 and per_entry is not None
        with pytest.raises(RuntimeError, match=f"listed {TREE_FILES + 1} files of {TREE_FILES}"):
            ls_recursive(str(mnt / "tree"), TREE_FILES, 100, pid)
        with pytest.raises(RuntimeError, match="ls -lR failed"):
            ls_recursive(str(mnt / "no-such-dir"), 1, 1, pid)
        directory = mnt / "tree" / "d007"
        paths = sorted(str(p) for p in directory.iterdir())
        forgotten = []
        assert stat_after_listing(str(directory), paths, wait=0) > 0
        assert stat_after_listing(str(directory), paths, 0.1, lambda: forgotten.append(1)) > 0
        assert forgotten == [1]
        with pytest.raises(RuntimeError, match="ls listed 3 of 4"):
            stat_after_listing(str(directory), [*paths, "missing"], wait=0)
    finally:
        unmount(str(mnt))


@pytest.mark.mount
def test_pffs_serves_the_remounted_epoch_from_its_disk_tier(
    near_moto: Server, s3, bucket: str, tmp_path: Path
) -> None:
    keys = epoch_names(30)
    for index, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=bytes([index]) * 10_000)
    results, peaks = remount_epoch(
        Pffs(list(NO_FREE_FLOOR)), near_moto, dataset_of(bucket, epoch_keys=keys), str(tmp_path)
    )
    files_per_s = results["epoch2_remount_files_per_s"]
    assert isinstance(files_per_s, float) and files_per_s > 0
    kinds = dict(
        part.split(" ") for part in str(results["epoch2_remount_requests_by_kind"]).split(", ")
    )
    # The bytes come from the disk tier: no GET; what the remount asks is counted all the same.
    assert kinds["GET"] == "0"
    assert results["epoch2_remount_requests"] == sum(int(n) for n in kinds.values())
    assert len(peaks) == 2 and all(peak > 0 for peak in peaks)
    assert os.listdir(tmp_path) == []  # the scenario's mountpoint and cache are gone

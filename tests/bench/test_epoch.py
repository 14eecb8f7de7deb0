"""The training-epoch scenario end to end on a tiny training set: moto behind the bench's delay
proxy, a real pffs mount, two epochs and the store's own files/s. It checks that each figure is
produced from real reads, never how large it is (speed is the bench's business)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cli import parse_args, parse_latencies
from bench.data import EPOCH_DIRECTORY, Dataset, Sizes, client, epoch_names, upload
from bench.epoch import read_epoch, shuffled, store_files_per_s
from bench.scenarios import Scenarios
from bench.servers import Server, far
from bench.systems import Pffs, cpu_seconds, mount_pid, unmount
from pffs.testing.servers import MotoServer

FILES, SIZE = 40, 10_000


@pytest.fixture
def training_set(moto: MotoServer, s3, bucket: str) -> Dataset:
    keys = epoch_names(FILES)
    for index, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=bytes([index]) * SIZE)
    sizes = Sizes(
        large=0, parallel=0, small_files=0, wide_files=0, write=0,
        epoch_files=FILES, epoch_size=SIZE,
    )  # fmt: skip
    return Dataset(bucket, sizes, "", "", [], [], keys)


@pytest.fixture
def far_moto(moto: MotoServer, tmp_path: Path) -> Iterator[Server]:
    env = os.environ
    near = Server("moto", moto.endpoint_url, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    server = far(near, 10, str(tmp_path / "delay.log"))
    yield server
    server.stop()


@pytest.mark.mount
def test_two_epochs_and_the_store_figure_on_a_far_store(
    far_moto: Server, training_set: Dataset, tmp_path: Path
) -> None:
    mountpoint, cache = tmp_path / "mnt", tmp_path / "cache"
    mountpoint.mkdir()
    cache.mkdir()
    pid = Pffs([]).mount(far_moto, training_set.bucket, str(mountpoint), str(cache))
    try:
        pid = pid or mount_pid(str(mountpoint))
        scenarios = Scenarios(str(mountpoint), training_set, far_moto, quick=True, pid=pid)
        results: dict[str, float | str] = {}
        epoch1 = scenarios.epoch(1, results)
        epoch2 = scenarios.epoch(2, results)
    finally:
        unmount(str(mountpoint))
    assert epoch1 > 0 and epoch2 > 0
    rss = results["epoch_peak_rss_mib"]
    assert isinstance(rss, float) and rss > 0
    assert store_files_per_s(far_moto, training_set, clients=8) > 0


@pytest.mark.mount
def test_a_short_read_fails_the_epoch(training_set: Dataset, mount_s3) -> None:
    with (
        mount_s3(f"s3://{training_set.bucket}") as mnt,
        pytest.raises(RuntimeError, match="read 10000 bytes of 10001"),
    ):
        read_epoch(str(mnt), training_set.epoch_keys, SIZE + 1, seed=1)


def test_epochs_read_every_file_once_in_different_orders() -> None:
    keys = epoch_names(100)
    first, second = shuffled(keys, seed=1), shuffled(keys, seed=2)
    assert sorted(first) == sorted(second) == keys
    assert first != second and first != keys


def test_cpu_seconds_counts_this_process_work() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after > before
    assert cpu_seconds(None) is None


def test_latencies_parse_and_bad_ones_are_named() -> None:
    assert parse_latencies("0,20ms") == [0.0, 20.0]
    assert parse_latencies("35") == [35.0]
    with pytest.raises(ValueError, match="'fast' is not a round trip like 20ms"):
        parse_latencies("0,fast")
    with pytest.raises(ValueError, match="'-5ms' must be 0 or more"):
        parse_latencies("-5ms")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--latency", "0,x"], "--latency: 'x' is not a round trip like 20ms"),
        (["--epoch-files", "0"], "--epoch-files: 0 must be 1 or more"),
        (["--epoch-size", "12q"], "--epoch-size: '12q' is not a size like 4M"),
        (["--servers", "s3rver,rgw,minio,nope"], "unknown server 'nope': one of moto"),
    ],
)
def test_bad_bench_options_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_no_object_of_the_bench_lies_beside_the_training_set(
    moto: MotoServer, tmp_path: Path
) -> None:
    # The bench no longer rests after the epochs: pffs's dataset preload would take opens in a
    # directory beside the training set, within its trigger window, for one dataset with it,
    # and load the whole parent behind the scenarios that follow. So no directory the bench
    # uploads to may share the training set's parent (a file in the parent itself is no
    # sibling: s3rver needs one there to list the parent): checked on what `upload` put.
    env = os.environ
    near = Server("moto", moto.endpoint_url, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    sizes = Sizes(
        large=4096, parallel=4096, small_files=2, wide_files=2, write=0, epoch_files=3,
        epoch_size=100, checkpoint=4096, shard_files=2, shard_size=4096, lazy_tensors=2,
    )  # fmt: skip
    dataset = upload(near, sizes, str(tmp_path), bucket="layout")
    pages = client(near).get_paginator("list_objects_v2").paginate(Bucket="layout")
    keys = {item["Key"] for page in pages for item in page.get("Contents", [])}
    assert set(dataset.epoch_keys) <= keys
    parent = EPOCH_DIRECTORY.rpartition("/")[0]
    assert parent, "the training set must not be a directory at the bucket's top"
    beside = [
        key
        for key in keys - set(dataset.epoch_keys)
        if key.startswith(f"{parent}/") and "/" in key[len(parent) + 1 :]
    ]
    assert beside == []
    assert f"{parent}/about" in keys  # what s3rver needs to list the parent at the top

"""Dataset preload on a real mount: three files of a directory opened, the rest loaded ahead
(the stats say so, and reading them asks the store for nothing), and `pffs preload --order`
with bad entries, on writable and read-only mounts and through a read-only bind of one."""

from __future__ import annotations

import errno
import os
import random
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pffs.jobs import PreloadOrder
from tests.conftest import metric_value, run_pffs, stats_snapshot
from tests.waiting import eventually

FILES = 50
SIZE = 100 * 1024  # ImageNet's mean file size
# An order list is handed over on read-only mounts too. There the first close turns the kernel's
# FLUSH off (pffs.fuse_ops), so each test closes a file (the stats) before handing one over.
WRITABLE_AND_READ_ONLY = pytest.mark.parametrize(
    "options", [(), ("--read-only",)], ids=["writable", "read-only"]
)


@pytest.fixture
def dataset(s3, bucket: str) -> dict[str, bytes]:
    rng = random.Random(17)
    files = {f"train/{i:03}.jpg": rng.randbytes(SIZE) for i in range(FILES)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    return files


def wait_for(mnt: Path, name: str, wanted: float, timeout: float = 60.0) -> dict[str, Any]:
    """`.pffs/stats` once its metric `name` has reached `wanted`."""

    def reached() -> dict[str, Any] | None:
        snapshot = stats_snapshot(mnt)
        return snapshot if metric_value(snapshot, name) >= wanted else None

    snapshot = eventually(reached, timeout, f"{name} at {wanted:g}")
    assert snapshot is not None
    return snapshot


@pytest.mark.mount
def test_three_opens_load_the_rest_of_the_directory(
    mount_s3, bucket: str, dataset: dict[str, bytes]
) -> None:
    names = list(dataset)
    random.Random(3).shuffle(names)
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none") as mnt:
        for name in names[:3]:
            assert (mnt / name).read_bytes() == dataset[name]
        loaded = wait_for(mnt, "pffs_preload_files_fetched_total", FILES - 3)
        assert metric_value(loaded, "pffs_preload_files_fetched_total") == FILES - 3
        assert metric_value(loaded, "pffs_preload_files_fetched_bytes_total") == (FILES - 3) * SIZE
        gets = metric_value(loaded, "pffs_backend_requests_total", request="GET")
        for name in names[3:]:
            assert (mnt / name).read_bytes() == dataset[name]
        after = stats_snapshot(mnt)
        assert metric_value(after, "pffs_backend_requests_total", request="GET") == gets
        assert metric_value(after, "pffs_preload_files_used_total") == FILES - 3


@pytest.mark.mount
@WRITABLE_AND_READ_ONLY
def test_preload_order_command_reports_bad_entries(
    mount_s3, bucket: str, dataset: dict[str, bytes], tmp_path: Path, options: tuple[str, ...]
) -> None:
    order = tmp_path / "order.txt"
    preload = ("--preload", "on")
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none", *preload, *options) as mnt:
        stats_snapshot(mnt)
        wanted = ["train/007.jpg", str(mnt / "train/003.jpg"), "train/nope.jpg", "nowhere/x"]
        order.write_text("\n".join(wanted) + "\n")
        result = run_pffs("preload", "--order", str(order), str(mnt))
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            "train/nope.jpg: no such file",
            "nowhere/x: no such file",
        ]
        assert "2 files queued, 2 bad entries" in result.stdout
        loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 2)
        assert metric_value(loaded, "pffs_preload_files_fetched_total") == 2
        gets = metric_value(loaded, "pffs_backend_requests_total", request="GET")
        for name in ("train/007.jpg", "train/003.jpg"):
            assert (mnt / name).read_bytes() == dataset[name]
        assert (
            metric_value(stats_snapshot(mnt), "pffs_backend_requests_total", request="GET") == gets
        )


@pytest.mark.mount
def test_the_former_command_and_preload_file_name_still_work(
    mount_s3, bucket: str, dataset: dict[str, bytes], tmp_path: Path
) -> None:
    """`pffs prefetch --order` and `.pffs/prefetch` (names before this release) hand lists over
    as `pffs preload --order` and `.pffs/preload` do; the command says it is deprecated."""
    order = tmp_path / "order.txt"
    order.write_text("train/011.jpg\ntrain/nope.jpg\n")
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none") as mnt:
        result = run_pffs("prefetch", "--order", str(order), str(mnt))
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            "pffs: pffs prefetch is deprecated and will be removed, use pffs preload",
            "train/nope.jpg: no such file",
        ]
        assert "1 files queued, 1 bad entries" in result.stdout
        (mnt / ".pffs" / "prefetch").write_text("train/012.jpg\n")
        assert (mnt / ".pffs" / "prefetch").read_text() == "queued 1\n"
        assert (mnt / ".pffs" / "preload").read_text() == "queued 1\n"  # one file, two names
        loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 2)
        assert metric_value(loaded, "pffs_preload_files_fetched_total") == 2
        assert "prefetch" not in os.listdir(mnt / ".pffs")


def test_preload_command_refuses_a_directory_that_is_not_a_mount(tmp_path: Path) -> None:
    order = tmp_path / "order.txt"
    order.write_text("a\n")
    result = run_pffs("preload", "--order", str(order), str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "not the root of a pffs mount" in result.stderr


@pytest.mark.mount
@WRITABLE_AND_READ_ONLY
def test_sampler_wrapper_hands_each_epoch_over(
    mount_s3, bucket: str, dataset: dict[str, bytes], options: tuple[str, ...]
) -> None:
    names = [*dataset, "train/gone.jpg"]
    epoch_order = [4, 50, 9, 4, 1]  # a sampler's indices (with a repeat and a bad one)
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none", *options) as mnt:
        stats_snapshot(mnt)
        sampler = PreloadOrder(epoch_order, names.__getitem__, str(mnt))
        assert list(sampler) == epoch_order and len(sampler) == 5
        assert sampler.bad == ["train/gone.jpg: no such file"]
        loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 3)
        assert metric_value(loaded, "pffs_preload_files_fetched_total") == 3


@pytest.mark.mount
@WRITABLE_AND_READ_ONLY
def test_a_read_only_bind_takes_the_list_through_the_order_socket(
    mount_s3,
    bucket: str,
    dataset: dict[str, bytes],
    tmp_path: Path,
    options: tuple[str, ...],
) -> None:
    """A pod's ReadOnlyMany volume is a read-only bind: the kernel refuses the preload file's
    write there, and the list goes through `.pffs/preload.sock` (docs/notes/readonly-order.md),
    from the sampler and from `pffs preload`."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    bind = tmp_path / "bind"
    bind.mkdir()
    order = tmp_path / "order.txt"
    preload = ("--preload", "on")
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none", *preload, *options) as mnt:
        subprocess.run(["mount", "--bind", "-o", "ro", str(mnt), str(bind)], check=True)
        try:
            assert stat.S_ISSOCK(os.stat(bind / ".pffs" / "preload.sock").st_mode)
            with pytest.raises(OSError) as refused:
                open(bind / ".pffs" / "preload", "w").close()
            assert refused.value.errno == errno.EROFS

            names = [*dataset, "train/gone.jpg"]
            sampler = PreloadOrder([4, 50, 9, 4], names.__getitem__, str(bind))
            assert list(sampler) == [4, 50, 9, 4]
            assert sampler.bad == ["train/gone.jpg: no such file"]
            # The report went to its sender on the socket alone: the file shows it to no one.
            assert (bind / ".pffs" / "preload").read_text() == ""
            loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 2)
            assert metric_value(loaded, "pffs_preload_files_fetched_total") == 2

            order.write_text(f"train/011.jpg\n{bind}/train/012.jpg\nnowhere/x\n")
            result = run_pffs("preload", "--order", str(order), str(bind))
            assert result.returncode == 1, result.stderr
            assert result.stderr.splitlines() == ["nowhere/x: no such file"]
            assert "2 files queued, 1 bad entries" in result.stdout
            assert (bind / ".pffs" / "preload").read_text() == ""
            loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 4)
            assert metric_value(loaded, "pffs_preload_files_fetched_total") == 4

            gets = metric_value(loaded, "pffs_backend_requests_total", request="GET")
            # One of each list: three opens in a directory would start its dataset's preload.
            for name in ("train/009.jpg", "train/012.jpg"):
                assert (bind / name).read_bytes() == dataset[name]
            after = stats_snapshot(bind)
            assert metric_value(after, "pffs_backend_requests_total", request="GET") == gets
        finally:
            subprocess.run(["umount", str(bind)], check=True)


@pytest.mark.mount
def test_files_read_by_ranges_hold_the_preload_until_one_is_read_through(
    mount_s3, s3, bucket: str
) -> None:
    """A column projection on a real mount (docs/notes/clients-parquet.md): each file's footer
    and a few chunks in its middle, a tenth of it. The directory is a dataset, but no other
    file is loaded whole until one is read through; then the rest are."""
    size, chunk = 8 << 20, 460 << 10
    rng = random.Random(23)
    files = {f"columns/part-{i}.parquet": rng.randbytes(size) for i in range(8)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    names = list(files)
    footer = (size - (64 << 10), 64 << 10)
    ranges = [footer] + [(offset, chunk) for offset in (1_400_000, 3_700_000, 6_000_000)]
    with mount_s3(f"s3://{bucket}", "--cache-dir", "none") as mnt:
        for name in names[:5]:
            fd = os.open(mnt / name, os.O_RDONLY)
            try:
                for offset, length in ranges:
                    assert os.pread(fd, length, offset) == files[name][offset : offset + length]
            finally:
                os.close(fd)
        time.sleep(0.5)  # a moment for a listing and loads, were any started
        held = stats_snapshot(mnt)
        assert metric_value(held, "pffs_preload_files_queued_total") == 0
        assert (mnt / names[5]).read_bytes() == files[names[5]]  # a scan now
        loaded = wait_for(mnt, "pffs_preload_files_fetched_total", 2)
        assert metric_value(loaded, "pffs_preload_files_fetched_bytes_total") == 2 * size

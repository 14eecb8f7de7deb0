"""The shared tier (`--shared-cache`, pffs.group.shared) with real mounts: the origin is a moto
server behind a FaultProxy, the tier a second moto server. Small files, 1 MiB blocks."""

from __future__ import annotations

import contextlib
from pathlib import Path

import boto3
import pytest

from pffs.testing.servers import MotoServer
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.mount.test_group import MIB, proxy, put_files, read_everywhere
from tests.waiting import eventually

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount


def tier_secret(root: Path) -> Path:
    """The file of the tier's secret (every mount of a test shares one)."""
    path = root / "tier-secret"
    path.write_text("the-shared-tier-secret-0123")
    return path


def test_a_shared_tier_serves_blocks_the_origin_sent_once(s3, bucket, proxy, tmp_path) -> None:
    """--shared-cache on a second moto server: the first mount's blocks are written there in
    the background, a second mount reads them from there and not from the origin, and a block
    object corrupted there is a miss: exact bytes from the origin, one log line."""
    files = put_files(s3, bucket, 5, MIB + 77)
    blocks = sum(-(-len(data) // MIB) for data in files.values())
    origin = f"s3://{bucket}@{proxy.endpoint_url}"
    with MotoServer() as near:
        shared = boto3.client("s3", endpoint_url=near.endpoint_url)
        shared.create_bucket(Bucket="shared")

        def objects() -> list[str]:
            listed = shared.list_objects_v2(Bucket="shared", Prefix="blocks/")
            keys = [item["Key"] for item in listed.get("Contents", [])]
            return [key for key in keys if ".claim-" not in key]

        tier = (
            "--shared-cache",
            "s3://shared/blocks",
            "--shared-cache-endpoint",
            near.endpoint_url,
            "--shared-cache-secret-file",
            str(tier_secret(tmp_path)),
        )

        def mount(name: str) -> contextlib.AbstractContextManager[Path]:
            return mounted(
                f"s3://{bucket}", tmp_path / name,
                "--endpoint-url", proxy.endpoint_url, "--block-size", "1M",
                "--cache-dir", str(tmp_path / f"cache-{name}"), *tier,
            )  # fmt: skip

        with mount("first") as mnt:
            assert read_everywhere({"first": mnt}, files) == []
            # Written behind the readers.
            eventually(lambda: len(objects()) >= blocks, 10, "every block in the shared cache")
            assert len(objects()) == blocks
        with mount("second") as mnt:
            assert read_everywhere({"second": mnt}, files) == []
            snapshot = stats_snapshot(mnt)
            assert metric_value(snapshot, "pffs_backend_received_bytes_total", source=origin) == 0
        for key in objects()[:2]:  # one corrupted, one cut short
            body = shared.get_object(Bucket="shared", Key=key)["Body"].read()
            damaged = body[:-1] + bytes([body[-1] ^ 1]) if key == objects()[0] else body[:100]
            shared.put_object(Bucket="shared", Key=key, Body=damaged)
        with mount("third") as mnt:
            assert read_everywhere({"third": mnt}, files) == []
            snapshot = stats_snapshot(mnt)
            assert (
                metric_value(snapshot, "pffs_group_fallbacks_total", reason="CRC32C mismatch") == 1
            )
            assert metric_value(snapshot, "pffs_group_fallbacks_total", reason="wrong length") == 1
    log = (tmp_path / "third.log").read_text()
    assert log.count("shared cache:") >= 2 and "CRC32C mismatch" in log, log[-3000:]


def test_mounts_missing_blocks_at_once_fetch_each_from_the_origin_once(
    s3, bucket, proxy, tmp_path
) -> None:
    """Three mounts over one shared tier (a second moto server, which honours If-None-Match)
    read the same files at once, each in its own order: the first to miss a block claims it,
    the others wait for it in the tier, so the origin sends about the dataset once (each mount
    alone would take it whole: 3x)."""
    files = put_files(s3, bucket, 12, MIB + 4321, seed=4)
    dataset = sum(len(data) for data in files.values())
    origin = f"s3://{bucket}@{proxy.endpoint_url}"
    with MotoServer() as near, contextlib.ExitStack() as stack:
        boto3.client("s3", endpoint_url=near.endpoint_url).create_bucket(Bucket="shared")
        mounts = {
            name: stack.enter_context(
                mounted(
                    f"s3://{bucket}", tmp_path / name,
                    "--endpoint-url", proxy.endpoint_url, "--block-size", "1M",
                    "--cache-dir", str(tmp_path / f"cache-{name}"),
                    "--shared-cache", "s3://shared/blocks",
                    "--shared-cache-endpoint", near.endpoint_url,
                    "--shared-cache-secret-file", str(tier_secret(tmp_path)),
                )
            )
            for name in ("m0", "m1", "m2")
        }  # fmt: skip
        assert read_everywhere(mounts, files) == []
        from_origin = sum(
            metric_value(stats_snapshot(mnt), "pffs_backend_received_bytes_total", source=origin)
            for mnt in mounts.values()
        )
    # Each block about once (a mount that waited past the bound fetches it too: rare).
    assert dataset <= from_origin <= 1.5 * dataset, from_origin / dataset
    for name in mounts:
        assert "claims with If-None-Match" in (tmp_path / f"{name}.log").read_text()

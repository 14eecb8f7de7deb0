"""The shared tier is tamper-evident, with real mounts: the origin a moto server behind a
FaultProxy, the tier a second moto server. Someone who can write the tier's bucket but holds no
tier secret replaces two block objects: one with other bytes and their CRC32C recomputed in the
header (the MAC left as it was), one packed whole under another secret. A mount reading them
refuses both, serves exact bytes from the origin, and writes them back with the tier's MAC."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import boto3
import crc32c
import pytest

from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import shared
from pffs.testing.servers import MotoServer
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.mount.test_group import MIB, proxy, put_files, read_everywhere
from tests.waiting import eventually

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount
TIER_SECRET = b"the-shared-tier-secret-0123"


def test_a_tampered_block_object_is_refused_and_fetched_from_the_origin(
    s3, bucket, proxy, tmp_path: Path
) -> None:
    files = put_files(s3, bucket, 2, MIB)  # one block each
    (path_a, data_a), (path_b, data_b) = files.items()
    secret = tmp_path / "tier-secret"
    secret.write_bytes(TIER_SECRET)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=proxy.endpoint_url))
    source = f"s3://{bucket}@{proxy.endpoint_url}"
    origin = source

    def blocks_of(path: str, data: bytes) -> ObjectBlocks:
        version = s3.head_object(Bucket=bucket, Key=path)["ETag"]
        return ObjectBlocks(source, backend.principal, path, version, len(data), MIB)

    a, b = blocks_of(path_a, data_a), blocks_of(path_b, data_b)
    name_a, name_b = (f"blocks/{shared.object_name(x, 0)}" for x in (a, b))
    key = shared.tier_key(TIER_SECRET)
    with MotoServer() as near:
        tier = boto3.client("s3", endpoint_url=near.endpoint_url)
        tier.create_bucket(Bucket="shared")

        def mount(name: str):
            return mounted(
                f"s3://{bucket}", tmp_path / name,
                "--endpoint-url", proxy.endpoint_url, "--block-size", "1M",
                "--cache-dir", str(tmp_path / f"cache-{name}"),
                "--shared-cache", "s3://shared/blocks",
                "--shared-cache-endpoint", near.endpoint_url,
                "--shared-cache-secret-file", str(secret),
            )  # fmt: skip

        def body(name: str) -> bytes | None:
            try:
                return bytes(tier.get_object(Bucket="shared", Key=name)["Body"].read())
            except tier.exceptions.NoSuchKey:
                return None

        def wait_for(name: str, good: bool) -> bytes:
            def written() -> bytes | None:  # behind the readers
                raw = body(name)
                blocks = a if name == name_a else b
                if raw is None or (shared.unpack(key, blocks, 0, raw)[0] is not None) != good:
                    return None
                return raw

            raw = eventually(written, 10, f"{name} {'right' if good else 'there'}")
            assert raw is not None
            return raw

        with mount("first") as mnt:
            assert read_everywhere({"first": mnt}, files) == []
        raw_a = wait_for(name_a, True)
        wait_for(name_b, True)
        # Other bytes, their CRC32C recomputed; the MAC is the one thing the writer cannot redo.
        forged = os.urandom(MIB)
        header = bytearray(raw_a[: shared.HEADER.size])
        struct.pack_into(">I", header, 8, crc32c.crc32c(forged))
        tier.put_object(Bucket="shared", Key=name_a, Body=bytes(header) + forged)
        # A whole object packed under another secret.
        other = shared.tier_key(b"a-secret-the-mounts-do-not-hold")
        tier.put_object(Bucket="shared", Key=name_b, Body=shared.pack(other, b, 0, os.urandom(MIB)))
        with mount("second") as mnt:
            assert read_everywhere({"second": mnt}, files) == []
            snapshot = stats_snapshot(mnt)
        assert metric_value(snapshot, "pffs_group_fallbacks_total", reason="not authenticated") == 2
        assert metric_value(snapshot, "pffs_backend_received_bytes_total", source=origin) == 2 * MIB
        # Fetched from the origin, and written back with the tier's MAC.
        assert shared.unpack(key, a, 0, wait_for(name_a, True))[0] == data_a
        assert shared.unpack(key, b, 0, wait_for(name_b, True))[0] == data_b

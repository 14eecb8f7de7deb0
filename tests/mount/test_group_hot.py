"""A hot block's second copy (pffs.group.hot) with real mounts: three `pffs mount` processes on
127.0.0.2-4 over moto behind a FaultProxy. The test process stands in for many more members,
asking the block's owner for it with the group's own client (pffs.group.client) and secret;
once the block is hot, every second request is sent to its second rendezvous choice, which
gets the block from the owner once and serves it from its cache. Nothing here is timed."""

from __future__ import annotations

import pytest
import trio

from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import hot
from pffs.group.client import PeerAskSecond, PeerClient
from pffs.group.members import Member
from pffs.group.placement import Placement
from pffs.group.protocol import BlockRequest
from tests.conftest import metric_value, stats_snapshot
from tests.mount.test_group import (
    MIB,
    SECRET,
    Cluster,
    group_mounts,
    peer_bytes,
    proxy,
    put_files,
    read_everywhere,
)

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount


def test_a_hot_block_gets_a_second_copy(s3, bucket, proxy, tmp_path) -> None:
    files = put_files(s3, bucket, 1, MIB + 5)
    ((path, data),) = files.items()
    cluster = Cluster(tmp_path, 3)
    members = [Member(name, url) for name, url in cluster.urls.items()]
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=proxy.endpoint_url))
    principal = backend.principal
    version = s3.head_object(Bucket=bucket, Key=path)["ETag"]
    blocks = ObjectBlocks(
        f"s3://{bucket}@{proxy.endpoint_url}", principal, path, version, len(data), MIB
    )
    placement = Placement(members)
    first, second = placement.owner(blocks.key(0)), placement.second(blocks.key(0))
    assert first is not None and second is not None
    # It reads with the mounts' keys, so it proves their principal as they do.
    client = PeerClient(SECRET.encode(), "stand-in", proof_key=lambda _: backend.principal_key)

    async def ask_owner() -> int:
        sent_away = 0
        for _ in range(2 * hot.ASKS):  # many members asking the owner at once
            try:
                assert await client.get(first, BlockRequest(blocks, 0)) == data[:MIB]
            except PeerAskSecond:
                sent_away += 1
        return sent_away

    async def ask_second() -> None:
        for _ in range(3):
            assert await client.get(second, BlockRequest(blocks, 0)) == data[:MIB]

    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        assert trio.run(ask_owner) >= hot.ASKS // 2 - 1
        # A member sent away asks the second copy: it gets the block from the owner once.
        served_by_owner = peer_bytes({first.name: mounts[first.name]}, "served")
        trio.run(ask_second)
        snapshot = stats_snapshot(mounts[second.name])
        assert metric_value(snapshot, "pffs_group_peer_bytes_total", way="received") == MIB
        assert metric_value(snapshot, "pffs_group_peer_bytes_total", way="served") == 3 * MIB
        assert peer_bytes({first.name: mounts[first.name]}, "served") == served_by_owner + MIB
        assert read_everywhere(mounts, files) == []
    client.close()

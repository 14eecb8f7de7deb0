"""A cache group of real mounts, the faults test_group.py leaves out and the `k8s://` member
list: several `pffs mount` processes on 127.0.0.2, .3 over one moto server behind a FaultProxy.

- an object overwritten in the store while members hold its old blocks: after the TTL, no
  reader gets an old byte, even through an owner whose own metadata still names the old version;
- a member whose cache disk is full: it serves peers what it holds, and everyone reads exact
  bytes;
- `k8s://NAMESPACE/SERVICE` members, read from EndpointSlices on tests/csi/kube_apiserver.py,
  a stand-in for the Kubernetes API server (none can run here), given to the mounts through
  $PFFS_KUBE_API as `kubectl proxy` would be.

Small files and 1 MiB blocks keep it quick; nothing here is timed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from pffs.testing.servers import free_port
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.csi.kube_apiserver import FakeApiServer
from tests.mount.test_crash_and_disk import fill, requires_root
from tests.mount.test_group import (
    MIB,
    Cluster,
    log_of,
    peer_bytes,
    proxy,
    put_files,
    read_everywhere,
    store_bytes,
)
from tests.waiting import eventually

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount


def members_seen(mnt: Path, count: int) -> bool:
    """Whether the member mounted at `mnt` counts `count` members in its group."""
    return metric_value(stats_snapshot(mnt), "pffs_group_members") == count


@contextlib.contextmanager
def members_mounted(
    cluster: Cluster, bucket: str, endpoint: str, extra: Mapping[str, tuple[str, ...]]
) -> Iterator[dict[str, Path]]:
    """Every member of `cluster` mounted, `extra` options of its own last (they win)."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(
                mounted(
                    f"s3://{bucket}", cluster.root / name, "--endpoint-url", endpoint,
                    *cluster.options(name), *extra.get(name, ()),
                )
            )
            for name in cluster.names
        }  # fmt: skip


def test_an_overwritten_object_gives_no_old_bytes_after_the_ttl(
    s3, bucket, proxy, tmp_path
) -> None:
    """Both members read every file (each owner holds its blocks), then every object is
    overwritten. node0 (1 s TTL) then reads only new bytes, the blocks node1 owns included:
    node1 still trusts its listing for an hour, but a peer's request names the version, and
    node1 fetches that one, pinned, from the store. Nothing fails, so nothing is logged."""
    old = put_files(s3, bucket, 8, MIB + 4321)
    cluster = Cluster(tmp_path, 2)
    ttl = {"node0": ("--metadata-ttl", "1"), "node1": ("--metadata-ttl", "3600")}
    with members_mounted(cluster, bucket, proxy.endpoint_url, ttl) as mounts:
        assert read_everywhere(mounts, old) == []
        new = put_files(s3, bucket, 8, MIB + 4321, seed=99)
        assert all(new[name] != old[name] for name in old)
        served = peer_bytes({"node1": mounts["node1"]}, "served")
        time.sleep(1.5)
        assert read_everywhere({"node0": mounts["node0"]}, new) == []
        # node1 served node0 the new version of blocks it owns (their old ones it held).
        assert peer_bytes({"node1": mounts["node1"]}, "served") > served
        assert read_everywhere({"node1": mounts["node1"]}, old) == []  # its TTL: an hour
    for name in cluster.names:
        assert "group: refused" not in log_of(cluster, name)
        assert "broken" not in log_of(cluster, name)


@requires_root
def test_a_member_with_a_full_cache_disk_serves_what_it_holds(
    s3, bucket, proxy, small_disk, tmp_path
) -> None:
    """node1's cache directory is on a full tmpfs: one line says it caches in memory only; it
    still owns and serves its blocks (from memory, fetched once for the group), and both
    members read exact bytes."""
    files = put_files(s3, bucket, 8, MIB + 99)
    dataset = sum(len(data) for data in files.values())
    fill(small_disk)
    cluster = Cluster(tmp_path, 2)
    full = {"node1": ("--cache-dir", str(small_disk / "cache"), "--cache-free-ratio", "0")}
    with members_mounted(cluster, bucket, proxy.endpoint_url, full) as mounts:
        assert read_everywhere(mounts, files) == []
        assert peer_bytes({"node1": mounts["node1"]}, "served") > 0
        assert peer_bytes({"node0": mounts["node0"]}, "served") > 0
        assert store_bytes(mounts) <= 1.3 * dataset
        assert read_everywhere(mounts, files) == []  # again, from memory and peers
    log = log_of(cluster, "node1")
    assert log.count("disk full, caching in memory only") == 1, log[-3000:]


def test_k8s_members_from_endpoint_slices(s3, bucket, proxy, tmp_path) -> None:
    """Two mounts whose members are the ready endpoints of a headless Service's EndpointSlice
    (named by node, port `peer`), on the stand-in API server: blocks are served by the peer."""
    files = put_files(s3, bucket, 8, MIB + 777)
    cluster = Cluster(tmp_path, 2)
    port = free_port()
    endpoints = [
        {"addresses": [f"127.0.0.{n + 2}"], "nodeName": name, "conditions": {"ready": True}}
        for n, name in enumerate(cluster.names)
    ]
    with FakeApiServer() as api:
        api.set_endpoint_slice("pffs", "pffs-group-abc", "pffs-group", port, endpoints)
        with contextlib.ExitStack() as stack:
            mounts = {}
            for n, name in enumerate(cluster.names):
                options = list(cluster.options(name))
                options[1] = "k8s://pffs/pffs-group"
                options[3] = f"127.0.0.{n + 2}:{port}"
                mounts[name] = stack.enter_context(
                    mounted(
                        f"s3://{bucket}", tmp_path / name,
                        "--endpoint-url", proxy.endpoint_url, *options,
                        env={**os.environ, "PFFS_KUBE_API": api.url},
                    )
                )  # fmt: skip
            for mnt in mounts.values():  # the first list comes with the first poll
                eventually(functools.partial(members_seen, mnt, 2), 10, f"two members at {mnt}")
            assert read_everywhere(mounts, files) == []
            assert peer_bytes(mounts, "received") > 0
            assert peer_bytes(mounts, "served") == peer_bytes(mounts, "received")
        assert api.count("GET", "/apis/discovery.k8s.io/v1/namespaces/pffs/endpointslices") >= 2
    for name in cluster.names:
        assert log_of(cluster, name).count("group: 2 members; joined node0, node1") == 1


def test_a_bad_kube_api_url_is_one_line(tmp_path: Path) -> None:
    from tests.mount.test_cli_errors import assert_one_line_error

    cluster = Cluster(tmp_path, 1)
    options = list(cluster.options("node0"))
    options[1] = "k8s://pffs/pffs-group"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "PFFS_KUBE_API": "127.0.0.1:8001"}
    args = ("mount", "s3://b", str(mnt), *options)
    assert_one_line_error(args, 2, "PFFS_KUBE_API=127.0.0.1:8001: expected", env=env)

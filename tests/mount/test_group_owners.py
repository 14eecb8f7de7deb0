"""An owner's side of a cache group, with real mounts: `pffs mount` processes on 127.0.0.x over one
moto server behind a FaultProxy, 1 MiB blocks.

- a peer asking for a block its owner's own reader is fetching from the store streams the
  bytes as they arrive: the store's reply is held after its first 256 KiB, and the asker gets
  them through a relay that counts what the owner sends it before the rest is let through
  (the order is the signal: nothing here is timed);
- a member's preload asks the blocks' owners, not the store;
- a member whose peer port resets every connection, or answers 500: its breaker opens at
  every asker, and its blocks are read through one stand-in each, fetched from the store once
  for all.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from pathlib import Path

import pytest

from pffs.testing.faults import FaultProxy, any_request
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.mount.test_dataset_preload import wait_for
from tests.mount.test_group import (
    MIB,
    Cluster,
    group_mounts,
    log_of,
    peer_bytes,
    proxy,
    put_files,
    read_all,
    read_everywhere,
    store_bytes,
    write_members,
)
from tests.waiting import eventually

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount
PIECE = 256 * 1024


class Relay:
    """A TCP relay to `upstream` on 127.0.0.1 counting the bytes it sends back to its clients
    (a peer's replies: their heads are a few hundred bytes, the rest is block)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.returned = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream)
                for ends in ((client, server, False), (server, client, True)):
                    threading.Thread(target=self._pipe, args=ends, daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
                if counted:
                    with self._lock:
                        self.returned += len(data)
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def returned_at_least(self, count: int) -> bool:
        with self._lock:
            return self.returned >= count

    def close(self) -> None:
        self._listener.close()


def read_into(path: Path, results: dict[str, bytes | str]) -> None:
    try:
        results[path.parent.name] = path.read_bytes()
    except OSError as exc:
        results[path.parent.name] = str(exc)


def mount_with_members(
    stack: contextlib.ExitStack,
    cluster: Cluster,
    bucket: str,
    endpoint_url: str,
    tmp_path: Path,
    lists: dict[str, dict[str, str]],
) -> dict[str, Path]:
    """Each member of `lists` mounted with its own member list (what it believes the group is),
    unmounted when `stack` closes."""
    mounts = {}
    for name, members in lists.items():
        member_file = tmp_path / f"members-{name}"
        write_members(member_file, members)
        options = list(cluster.options(name))
        options[1] = f"file://{member_file}"
        mounts[name] = stack.enter_context(
            mounted(f"s3://{bucket}", tmp_path / name, "--endpoint-url", endpoint_url, *options)
        )
    return mounts


def test_a_peer_joining_an_owners_own_fetch_gets_bytes_as_they_arrive(
    s3, bucket, proxy, tmp_path
) -> None:
    """node0 owns every block (its member list names only itself); node1 owns none and asks
    node0 for all, through a relay. node0's reader starts the store GET of a one-block file,
    whose reply the proxy holds after 256 KiB; node1 then reads the file: node0 streams it the
    first piece while the rest is still held, and both get exact bytes, the block fetched from
    the store once."""
    data = random.Random(11).randbytes(MIB)
    s3.put_object(Bucket=bucket, Key="one.bin", Body=data)
    cluster = Cluster(tmp_path, 2)
    host, port = cluster.addresses["node0"]
    relay = Relay((host, port))
    lists = {"node0": {"node0": cluster.urls["node0"]}, "node1": {"node0": relay.url}}
    with contextlib.ExitStack() as stack:
        stack.callback(relay.close)
        mounts = mount_with_members(stack, cluster, bucket, proxy.endpoint_url, tmp_path, lists)
        results: dict[str, bytes | str] = {}
        proxy.hold_tail(PIECE)
        owner = threading.Thread(target=read_into, args=(mounts["node0"] / "one.bin", results))
        owner.start()
        try:
            assert proxy.holding.wait(10), "node0's reader never reached the store"
            asker = threading.Thread(target=read_into, args=(mounts["node1"] / "one.bin", results))
            asker.start()
            eventually(
                lambda: relay.returned_at_least(PIECE),
                10,
                "node1 streamed while node0's fetch held",
            )
        finally:
            proxy.release()
        owner.join()
        asker.join()
        assert results == {"node0": data, "node1": data}
        assert (
            metric_value(stats_snapshot(mounts["node1"]), "pffs_backend_received_bytes_total") == 0
        )
        assert peer_bytes({"node1": mounts["node1"]}, "received") == len(data)
    assert "broken" not in log_of(cluster, "node1")


@pytest.mark.parametrize("fault", ["reset", "500"])
def test_a_broken_members_blocks_come_through_one_stand_in(
    fault: str, s3, bucket, proxy, tmp_path
) -> None:
    """Three mounts; node2's peer port, as the member list names it, is a proxy that resets
    every connection, or answers each request 500. node0 and node1 read everything: node2's
    breaker opens at both, and each of its blocks is fetched from the store once, by the
    stand-in both askers agree on, which serves the other. Exact bytes, no reader error,
    node2 serves nothing."""
    files = put_files(s3, bucket, 12, 2 * MIB + 4321)
    dataset = sum(len(data) for data in files.values())
    cluster = Cluster(tmp_path, 3)
    host, port = cluster.addresses["node2"]
    rates = {"500": 1.0} if fault == "500" else {}
    with FaultProxy(port, rates=rates, match=any_request, upstream_host=host) as broken:
        if fault == "reset":
            broken.down()
        write_members(cluster.member_file, {**cluster.urls, "node2": broken.endpoint_url})
        with contextlib.ExitStack() as stack:
            mounts = {
                name: stack.enter_context(
                    mounted(
                        f"s3://{bucket}",
                        tmp_path / name,
                        "--endpoint-url",
                        proxy.endpoint_url,
                        *cluster.options(name),
                    )
                )
                for name in cluster.names
            }
            readers = {name: mounts[name] for name in ("node0", "node1")}
            assert read_everywhere(readers, files) == []
            from_store = store_bytes(readers)
            received, served = peer_bytes(readers, "received"), peer_bytes(readers, "served")
            snapshots = {name: stats_snapshot(mnt) for name, mnt in mounts.items()}
        # Each asker tried node2 and found it broken.
        assert broken.injected["down" if fault == "reset" else "500"] >= 2
    for name in readers:
        assert metric_value(snapshots[name], "pffs_group_member_up", member="node2") == 0
        assert log_of(cluster, name).count("peer node2 broken") == 1, log_of(cluster, name)[-3000:]
    assert metric_value(snapshots["node2"], "pffs_group_peer_bytes_total", way="served") == 0
    # Had each asker fetched node2's blocks itself (no common stand-in), the store would send
    # about 4/3 of the dataset; one stand-in for both sends each block once. (A first read
    # of a block may add a reader's own small range: a few percent at most.)
    assert dataset <= from_store <= 1.12 * dataset, from_store / dataset
    assert served == received
    assert received >= dataset * 0.9, received / dataset  # every block but one copy via a peer


def test_preload_asks_the_owners(s3, bucket, proxy, tmp_path) -> None:
    """node0 opens three files of a directory, so its preload loads the rest: the blocks node1
    owns come from node1 (which fetches them from the store for it), not from the store; then
    node0 reads everything with no more store traffic, exact bytes."""
    files = put_files(s3, bucket, 16, MIB)
    cluster = Cluster(tmp_path, 2)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        node0 = {"node0": mounts["node0"]}
        names = sorted(files)
        for name in names[:3]:
            assert (mounts["node0"] / name).read_bytes() == files[name]
        loaded = wait_for(mounts["node0"], "pffs_preload_files_fetched_total", len(files) - 3)
        assert metric_value(loaded, "pffs_preload_files_fetched_total") == len(files) - 3
        # 13 blocks preloaded, each owned by node1 half the time: some came from it. The three
        # files read brought at most their own bytes from node1 (the preload may be done before
        # a count taken after them, so the bound is theirs, not a count).
        assert peer_bytes(node0, "received") > 3 * MIB
        # node1 counts a block served after its last byte is written, so node0 may count it
        # received a moment before node1 counts it served.
        served = peer_bytes(node0, "received")
        eventually(
            lambda: peer_bytes({"node1": mounts["node1"]}, "served") == served,
            10,
            "node1's served bytes at node0's received",
        )
        assert store_bytes({"node1": mounts["node1"]}) == served  # fetched for node0 alone
        before = store_bytes(node0)
        assert store_bytes(node0) + served <= 1.1 * sum(map(len, files.values()))
        errors: list[str] = []
        read_all(mounts["node0"], files, 0, errors)
        assert errors == []
        assert store_bytes(node0) == before


def store_gets(mnt: Path) -> float:
    return metric_value(stats_snapshot(mnt), "pffs_backend_requests_total", request="GET")


def test_a_cold_small_read_is_one_request_for_its_block(s3, bucket, proxy, tmp_path) -> None:
    """node0 owns every block (its member list names only itself); node1 asks node0 for all.
    A cold 4 KiB read starts its block's load and takes its bytes from that load (the one
    registry of blocks on their way): at the owner, one store GET (the block's, streamed in
    pieces), not a ranged GET beside it; at the asker, one ask of the owner and no store
    request. Both get exact bytes."""
    data = random.Random(12).randbytes(4 * MIB)
    s3.put_object(Bucket=bucket, Key="four.bin", Body=data)
    cluster = Cluster(tmp_path, 2)
    lists = {"node0": {"node0": cluster.urls["node0"]}, "node1": {"node0": cluster.urls["node0"]}}
    with contextlib.ExitStack() as stack:
        mounts = mount_with_members(stack, cluster, bucket, proxy.endpoint_url, tmp_path, lists)
        node0, node1 = mounts["node0"], mounts["node1"]

        def cold_read(mnt: Path, offset: int) -> bytes:
            with (mnt / "four.bin").open("rb") as file:
                return os.pread(file.fileno(), 4096, offset)

        # The owner's own cold small read (block 1): one GET of the block.
        (node0 / "four.bin").stat()
        gets, fetched = store_gets(node0), proxy.body_bytes
        offset = MIB + 300 * 1024
        assert cold_read(node0, offset) == data[offset : offset + 4096]
        # The block lands in the background; a ranged GET beside it would come before.
        eventually(lambda: proxy.body_bytes - fetched >= MIB, 10, "the owner's block fetched")
        eventually(lambda: store_gets(node0) - gets >= 1, 10, "the owner's GET counted")
        assert store_gets(node0) - gets == 1
        assert proxy.body_bytes - fetched == MIB  # the block, no ranged read beside it
        # The asker's cold small read (block 2): one ask of the owner, which fetches it once.
        (node1 / "four.bin").stat()
        gets, fetched = store_gets(node0), proxy.body_bytes
        offset = 2 * MIB + 300 * 1024
        assert cold_read(node1, offset) == data[offset : offset + 4096]
        # The owner counts a block served after its last byte is written.
        eventually(lambda: peer_bytes({"node0": node0}, "served") >= MIB, 10, "the block served")
        eventually(lambda: store_gets(node0) - gets >= 1, 10, "the owner's GET counted")
        assert peer_bytes({"node0": node0}, "served") == MIB  # one ask
        assert store_gets(node0) - gets == 1
        assert proxy.body_bytes - fetched == MIB
        assert store_gets(node1) == 0
        assert peer_bytes({"node1": node1}, "received") == MIB

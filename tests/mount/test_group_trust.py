"""Who a grouped mount trusts, with real `pffs mount` processes and real sockets:

- a listener without the group's secret at a member's address (a stand-in for a local user on
  that port once the member is down, a forged member list, a DNS answer) answers every block
  with its own bytes and a right CRC32C: every reader gets exact bytes, the forged replies are
  counted, and nothing of them stays in memory or on disk (read again after a remount without
  the group);
- with the group's secret alone, a request for a principal the asker does not prove is refused
  (403), as is a request with an absolute or `..` path (400); a principal with no key of its
  own (local files here) is served only to a proof made with --group-principal-secret-file.
"""

from __future__ import annotations

import http.server
import os
import random
import threading

import crc32c
import pytest

from pffs.backends import open_backend
from pffs.backends.principal import local_principal
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import protocol
from pffs.group.principals import PrincipalKeys
from pffs.group.protocol import FOOTER, BlockRequest
from pffs.testing.servers import free_port
from tests.conftest import metric_value, mounted, stats_snapshot
from tests.mount.groupasker import Asker, one_object
from tests.mount.test_group import (
    MIB,
    SECRET,
    Cluster,
    group_mounts,
    proxy,
    put_files,
    read_everywhere,
    write_members,
)
from tests.waiting import eventually

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount


class ForgingListener:
    """Answers every block request with random bytes of the right length, the version asked,
    a right CRC32C and the only tag it can make without the secret (a stand-in for an
    impostor: a real member never answers so), on plain http.server."""

    def __init__(self, host: str, port: int) -> None:
        self.answered = 0
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                request = protocol.parse_target(self.path)
                body = random.randbytes(request.length)
                footer = protocol.FOOTER.pack(crc32c.crc32c(body), bytes(16))
                self.send_response(200)
                self.send_header("content-length", str(len(body) + len(footer)))
                self.send_header(protocol.VERSION, request.blocks.version)
                self.end_headers()
                self.wfile.write(body + footer)
                listener.answered += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_listener_without_the_secret_poisons_nothing(s3, bucket, proxy, tmp_path) -> None:
    files = put_files(s3, bucket, 12, MIB + 777)
    cluster = Cluster(tmp_path, 1)  # node0, mounted
    impostor_host, impostor_port = "127.0.0.3", free_port()
    members = {**cluster.urls, "node1": f"http://{impostor_host}:{impostor_port}"}
    write_members(cluster.member_file, members)
    impostor = ForgingListener(impostor_host, impostor_port)
    try:
        with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
            assert read_everywhere(mounts, files) == []
            snapshot = stats_snapshot(mounts["node0"])
            # Read again: from this member's memory now, still exact.
            assert read_everywhere(mounts, files) == []
    finally:
        impostor.close()
    assert impostor.answered >= 1
    assert metric_value(snapshot, "pffs_group_unauthenticated_replies_total") >= 1
    assert metric_value(snapshot, "pffs_group_peer_bytes_total", way="received") == 0
    # The disk tier: the same cache directory mounted without the group serves what it holds.
    cache = tmp_path / "cache-node0"
    with mounted(
        f"s3://{bucket}",
        tmp_path / "again",
        "--endpoint-url",
        proxy.endpoint_url,
        "--block-size",
        "1M",
        "--cache-dir",
        str(cache),
    ) as again:
        assert read_everywhere({"again": again}, files) == []
        held = metric_value(stats_snapshot(again), "pffs_cache_served_bytes_total", tier="disk")
    assert held > 0  # what was read came from the disk tier, exact


def test_the_secret_alone_proves_no_principal_and_no_path_escapes(
    s3, bucket, proxy, tmp_path
) -> None:
    obj = one_object(s3, bucket, proxy.endpoint_url, MIB + 5, MIB)
    path, data, source, blocks = obj.path, obj.data, obj.source, obj.blocks
    principal, version = blocks.principal, blocks.version
    cluster = Cluster(tmp_path, 1)
    host, port = cluster.addresses["node0"]
    proven = Asker("node0", host, port, SECRET.encode(), blocks, obj.proof_key)
    unproven = Asker("node0", host, port, SECRET.encode(), blocks, None)
    wrong = Asker("node0", host, port, SECRET.encode(), blocks, b"a guess at the key")
    target = BlockRequest(blocks, 0).target()
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        assert unproven.ask(target)[0] == 403
        assert wrong.ask(target)[0] == 403
        assert proven.block(0) == data[:MIB]
        for bad in ("/" + path, f"../{path}", f"data/../{path}", f"data//{path[5:]}"):
            outside = ObjectBlocks(source, principal, bad, version, len(data), MIB)
            assert proven.ask(BlockRequest(outside, 0).target())[0] == 400, bad
        # A size that is not the object's: nothing cut to it is cached. (Its real
        # block may be on its way already, loaded ahead after block 0: a request joining that
        # flight is streamed the real bytes up to the length it named, which only the asker,
        # who can read them anyway, gets.)
        shorter = ObjectBlocks(source, principal, path, version, MIB + 1, MIB)
        status, body, _ = proven.ask(BlockRequest(shorter, 1).target())
        served = body[: len(body) - FOOTER.size]
        assert status != 200 or data[MIB:].startswith(served), (status, body)
        # The refused load fails whoever joined it (503: that asker reads the store), but only
        # it: the block's own size is served once it has ended.
        real = BlockRequest(blocks, 1).target()
        eventually(lambda: proven.ask(real)[0] == 200, 10, "block 1 served again")
        assert proven.block(1) == data[MIB:]
        snapshot = stats_snapshot(mounts["node0"])
    assert metric_value(snapshot, "pffs_group_refusals_total", reason="principal not proven") == 2


def test_a_principal_without_a_key_is_served_only_with_the_principal_secret(tmp_path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    data = os.urandom(MIB + 11)
    (source / "f.bin").write_bytes(data)
    info = open_backend(SourceConfig(url=f"file://{source}")).stat("f.bin")
    cluster = Cluster(tmp_path, 1)
    principal_secret = tmp_path / "principal-secret"
    principal_secret.write_text("the-volume-principal-secret")
    principal = local_principal()
    blocks = ObjectBlocks(f"file://{source}", principal, "f.bin", info.version, len(data), MIB)
    host, port = cluster.addresses["node0"]
    volume_key = PrincipalKeys(b"the-volume-principal-secret").key(principal, None)
    proven = Asker("node0", host, port, SECRET.encode(), blocks, volume_key)
    unproven = Asker("node0", host, port, SECRET.encode(), blocks, None)
    target = BlockRequest(blocks, 0).target()
    options = cluster.options("node0")
    with mounted(f"file://{source}", tmp_path / "plain", *options):
        # No principal secret given to the member: its local principal is never served.
        assert proven.ask(target)[0] == 403
    with mounted(
        f"file://{source}",
        tmp_path / "with-secret",
        *options,
        "--group-principal-secret-file",
        str(principal_secret),
    ) as mnt:
        assert unproven.ask(target)[0] == 403
        assert proven.block(0) == data[:MIB]
        assert proven.block(1) == data[MIB:]
        snapshot = stats_snapshot(mnt)
    assert metric_value(snapshot, "pffs_group_peer_bytes_total", way="served") == len(data)

"""The owner's side of a peer's ask (pffs.group.server) runs its load under the mount's
nursery: when the mount stops, a load started for a peer ends with it, its flight given up and
its pieces failed, and the requests it made are closed. Real parts: an S3 source on moto, the
block cache, the group's client, and a member that accepts the owner's request and never
answers (a real socket), which keeps the load waiting until the mount stops."""

from __future__ import annotations

import random

import trio

from pffs.backends import open_backend
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import signing
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.peers import Group
from pffs.group.principals import PrincipalKeys
from pffs.group.protocol import BlockRequest
from pffs.group.server import PeerBlocks
from pffs.routing.table import MountTable
from tests.cache.configs import cache_config

SECRET = b"the-group-secret-of-the-owner-test"
PRINCIPAL_SECRET = b"the-principal-secret-of-the-owner-test"


def test_a_load_started_for_a_peer_ends_when_the_mount_stops(s3, bucket, moto) -> None:
    data = random.Random(5).randbytes(10_000)
    s3.put_object(Bucket=bucket, Key="p.bin", Body=data)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    version = backend.stat("p.bin").version
    cache = BlockCache(cache_config(None))
    blocks = ObjectBlocks(
        backend.source_id, backend.principal, "p.bin", version, len(data), cache.block_size
    )
    keys = PrincipalKeys(PRINCIPAL_SECRET)
    proof_key = keys.key(backend.principal, backend.principal_key)
    assert proof_key is not None
    request = BlockRequest(blocks, 0)
    target = request.target()
    signed = signing.Verifier(SECRET, "me").check(
        "GET", target, signing.sign(SECRET, "GET", target, "me", proof_key)
    )
    assert isinstance(signed, signing.Signed)
    requests_in: list[trio.SocketStream] = []
    closed = trio.Event()

    async def hung_member(stream: trio.SocketStream) -> None:
        """Reads the owner's request, never answers; sees the connection closed."""
        requests_in.append(stream)
        while await stream.receive_some(65536):
            pass
        closed.set()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        client = PeerClient(SECRET, "me", proof_key=lambda _: proof_key)
        group = Group("me", client, handover=600.0)
        # This member's first list: the block is either "old"'s, or this member's with "old"
        # its previous owner (a handover): either way the owner's load asks "old" first.
        group.update(
            [Member("me", "http://127.0.0.1:1"), Member("old", f"http://127.0.0.1:{port}")]
        )
        owner = PeerBlocks(group, MountTable.single(backend), cache, keys)
        async with trio.open_nursery() as outside:  # the test's, not the mount's
            outside.start_soon(trio.serve_listeners, hung_member, listeners)
            async with trio.open_nursery() as mount:
                cache.attach(mount)
                pieces = await owner.serve(request, signed)
                assert not isinstance(pieces, bytes | None)
                flight = cache.flights.get(blocks.key(0))  # its flight: on its way here
                assert flight is not None and flight.pieces is pieces
                while not requests_in:  # the load is under way, waiting on the member
                    await trio.sleep(0.01)
                mount.cancel_scope.cancel()  # the mount stops
            # The load ended with the mount: nobody is left waiting on its pieces, its flight
            # is over, and the member's connection was closed.
            assert pieces.error is not None
            assert cache.flights.get(blocks.key(0)) is None
            with trio.fail_after(5):
                await closed.wait()
            outside.cancel_scope.cancel()
        group.close()

    trio.run(main)
    cache.close()

"""Who an asker asks (pffs.group.peers over real HTTP on 127.0.0.1, real PeerServers with block
handlers of their own, no cache): a member that refuses connections (SIGKILLed, still listed)
has its blocks asked of a stand-in, the next member in their rendezvous order, the same at every
asker; a member that does not serve a source (421) is left out of that source's owners, not of
others; a handover lasts its time while previous owners hit, and ends early after a run of
misses."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from pffs.cache.keys import ObjectBlocks
from pffs.group import peers
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.peers import Group
from pffs.group.protocol import BlockRequest
from pffs.group.server import NotServed, PeerServer
from pffs.group.signing import Signed, Verifier

SECRET = b"a-shared-secret-of-the-group"
BLOCK = 4096
BLOCKS = ObjectBlocks("s3://bucket", "alice", "d/f.bin", '"v1"', 200 * BLOCK, BLOCK)
OTHER = ObjectBlocks("s3://other", "alice", "d/f.bin", '"v1"', 200 * BLOCK, BLOCK)
Handler = Callable[[BlockRequest, Signed], Awaitable[bytes | None]]
# The askers prove the principal with this key (the handlers here check nothing of it).
PROVEN = b"alice-principal-key"


def client(name: str) -> PeerClient:
    return PeerClient(SECRET, name, proof_key=lambda blocks: PROVEN)


def data(request: BlockRequest) -> bytes:
    return bytes([request.index % 256]) * request.length


def serving(asked: Counter[str], name: str, sources: set[str]) -> Handler:
    async def handler(request: BlockRequest, signed: Signed) -> bytes | None:
        asked[name] += 1
        if request.blocks.source not in sources:
            raise NotServed("a source this member does not mount")
        return data(request)

    return handler


def dead_url() -> str:
    """A port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def start(nursery: trio.Nursery, handler: Handler, name: str) -> str:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    await nursery.start(PeerServer(handler, Verifier(SECRET, name)).serve, listener)
    return f"http://127.0.0.1:{listener.socket.getsockname()[1]}"


def test_a_dead_members_blocks_go_to_one_stand_in() -> None:
    asked: Counter[str] = Counter()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            members = [Member("dead", dead_url())]
            for name in ("b", "c", "a1", "a2"):
                url = await start(nursery, serving(asked, name, {BLOCKS.source}), name)
                members.append(Member(name, url))
            askers = [Group(name, client(name), members) for name in ("a1", "a2")]
            dead_blocks = [
                i for i in range(200) if askers[0].placement.ranked(BLOCKS.key(i))[0].name == "dead"
            ]
            assert len(dead_blocks) > 10
            for asker in askers:
                for index in dead_blocks:
                    got = await asker.fetch_block(BLOCKS, index)
                    ranked = [m.name for m in asker.placement.ranked(BLOCKS.key(index))]
                    stand_in = ranked[1]
                    if stand_in == asker.self_name:
                        assert got is None  # it stands in itself: the store, once
                    else:
                        assert got == data(BlockRequest(BLOCKS, index))
                    chosen = asker.peer_owner(BLOCKS, index)  # the same stand-in at both
                    assert (chosen.name if chosen else asker.self_name) == stand_in
            for asker in askers:
                assert not asker.breakers["dead"].up
                asker.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert sum(asked.values()) > 0


def test_a_member_without_the_source_is_left_out_of_its_owners() -> None:
    asked: Counter[str] = Counter()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            other_only = await start(nursery, serving(asked, "o", {OTHER.source}), "o")
            both = await start(nursery, serving(asked, "b", {BLOCKS.source, OTHER.source}), "b")
            members = [Member("o", other_only), Member("b", both), Member("me", "x")]
            group = Group("me", client("me"), members)
            owned_by_o = [
                i for i in range(200) if group.placement.ranked(BLOCKS.key(i))[0].name == "o"
            ]
            assert len(owned_by_o) > 10
            for index in owned_by_o:
                got = await group.fetch_block(BLOCKS, index)
                expected = data(BlockRequest(BLOCKS, index))
                second = [m.name for m in group.placement.ranked(BLOCKS.key(index))][1]
                assert got == (expected if second == "b" else None)
            assert asked["o"] == 1  # refused once, then left out of that source's owners
            assert group.breakers["o"].up  # a refusal is no failure
            other_blocks = [
                i for i in range(200) if group.placement.ranked(OTHER.key(i))[0].name == "o"
            ]
            for index in other_blocks:  # still the owner of the source it serves
                assert group.peer_owner(OTHER, index) == members[0]
                assert await group.fetch_block(OTHER, index) == data(BlockRequest(OTHER, index))
            assert asked["o"] == 1 + len(other_blocks)
            group.close()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_handover_lasts_while_previous_owners_hit() -> None:
    holding = {"yes": True}

    async def previous_owner(request: BlockRequest, signed: Signed) -> bytes | None:
        return data(request) if holding["yes"] else None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await start(nursery, previous_owner, "old")
            group = Group("new", client("new"), [Member("old", url)])
            group.update([Member("old", url), Member("new", "x")])
            mine = [i for i in range(200) if group.peer_owner(BLOCKS, i) is None]
            assert len(mine) > peers.HANDOVER_PROBES + 20
            for index in mine[:20]:  # handed over
                assert await group.fetch_block(BLOCKS, index) == data(BlockRequest(BLOCKS, index))
            holding["yes"] = False
            rest = mine[20:]
            for index in rest[: peers.HANDOVER_PROBES - 1]:
                assert await group.fetch_block(BLOCKS, index) is None
            assert group.previous_owner(BLOCKS, rest[peers.HANDOVER_PROBES]) is not None
            await group.fetch_block(BLOCKS, rest[peers.HANDOVER_PROBES - 1])  # a run of misses
            assert all(group.previous_owner(BLOCKS, i) is None for i in mine)
            group.close()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_handover_ends_after_its_time_though_previous_owners_hit() -> None:
    asked: Counter[str] = Counter()
    now = [0.0]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await start(nursery, serving(asked, "old", {BLOCKS.source}), "old")
            group = Group("new", client("new"), [Member("old", url)], 60.0, lambda: now[0])
            group.update([Member("old", url), Member("new", "x")])
            mine = [i for i in range(200) if group.peer_owner(BLOCKS, i) is None]
            assert len(mine) > peers.HANDOVER_PROBES * 2
            for index in mine[: peers.HANDOVER_PROBES * 2]:  # hits: the handover goes on
                now[0] += 59.0 / (peers.HANDOVER_PROBES * 2)
                assert await group.fetch_block(BLOCKS, index) == data(BlockRequest(BLOCKS, index))
            before = asked["old"]
            now[0] = 60.0  # its time is up: a block this member owns comes from the store
            rest = mine[peers.HANDOVER_PROBES * 2 :]
            assert all(group.previous_owner(BLOCKS, i) is None for i in rest)
            assert await group.fetch_block(BLOCKS, rest[0]) is None
            assert asked["old"] == before
            group.close()
            nursery.cancel_scope.cancel()

    trio.run(main)

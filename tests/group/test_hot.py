"""Hot blocks (pffs.group.hot) and where their second copy goes (pffs.group.placement): the
owner sends every second request of a block asked ASKS times within a window to the block's
second rendezvous choice, which is the owner the block would have without its owner."""

from __future__ import annotations

import time

import pytest

from pffs.cache.keys import BlockKey
from pffs.group import hot
from pffs.group.hot import Asked
from pffs.group.members import Member
from pffs.group.placement import Placement, owner
from pffs.group.protocol import BlockRequest, parse_target
from tests.group.test_protocol import BLOCKS

KEY = BlockKey("s3://b", "alice", "d/f.bin", '"etag"', 3)


def test_every_second_request_of_a_hot_block_goes_to_its_second_copy(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    asked = Asked()
    sent = [asked.to_second(KEY) for _ in range(12)]
    assert [n + 1 for n, second in enumerate(sent) if second] == [8, 10, 12]
    assert not asked.to_second(KEY._replace(block=4))  # another block: cold
    now[0] += hot.WINDOW + 1  # a new window: cold again
    assert not any(asked.to_second(KEY) for _ in range(hot.ASKS - 1))


def test_the_counts_are_bounded(monkeypatch) -> None:
    asked = Asked()
    for n in range(hot.MAX_BLOCKS + 10):
        asked.to_second(KEY._replace(block=n))
    assert len(asked._counts) <= hot.MAX_BLOCKS


def test_the_second_copy_is_the_owner_without_the_owner() -> None:
    members = [Member(f"node{n}", f"http://10.0.0.{n}:7000") for n in range(6)]
    placement = Placement(members)
    for block in range(200):
        key = KEY._replace(block=block)
        first = placement.owner(key)
        second = placement.second(key)
        assert first is not None and second is not None and first != second
        assert second == owner([m for m in members if m != first], key)
    assert Placement(members[:1]).second(KEY) is None


@pytest.mark.parametrize("forwarded", [False, True])
def test_a_forwarded_request_says_so(forwarded: bool) -> None:
    request = BlockRequest(BLOCKS, 1, forwarded=forwarded)
    assert parse_target(request.target()) == request

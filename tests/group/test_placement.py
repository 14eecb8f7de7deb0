"""Rendezvous placement (pffs.group.placement): every member computes the same owners, a change
of membership moves about 1/N of the blocks, weights scale shares, and for the handover's time
after each change the previous owner is known."""

from __future__ import annotations

from collections import Counter

from pffs.cache.keys import BlockKey
from pffs.group.members import Member
from pffs.group.placement import Placement, owner

KEYS = [BlockKey("s3://b", "alice", f"d/f{n // 8}.bin", '"etag"', n % 8) for n in range(8000)]


def members(count: int, **weights: float) -> list[Member]:
    names = [f"node{n}" for n in range(count)]
    return [
        Member(name, f"http://10.0.0.{n}:7000", weight=weights.get(name, 1.0))
        for n, name in enumerate(names)
    ]


def owners(group: list[Member]) -> list[str]:
    return [owner(group, key).name for key in KEYS]  # type: ignore[union-attr]


def test_owners_are_spread_and_independent_of_order() -> None:
    group = members(8)
    shares = Counter(owners(group))
    assert len(shares) == 8
    assert all(800 <= count <= 1200 for count in shares.values()), shares  # 1000 each, roughly
    assert owners(group[::-1]) == owners(group)


def test_a_change_moves_about_one_nth() -> None:
    before = owners(members(10))
    after = owners(members(9))  # node9 left: only its blocks move
    moved = sum(1 for a, b in zip(before, after, strict=True) if a != b)
    assert moved == before.count("node9")
    assert 0.07 * len(KEYS) <= moved <= 0.13 * len(KEYS)
    joined = owners(members(11))  # node10 joined: it takes about 1/11, from everyone
    taken = [a for a, b in zip(before, joined, strict=True) if a != b]
    assert all(b == "node10" for a, b in zip(before, joined, strict=True) if a != b)
    assert 0.06 * len(KEYS) <= len(taken) <= 0.12 * len(KEYS)


def test_weights_scale_shares() -> None:
    shares = Counter(owners(members(4, node0=3.0)))
    assert shares["node0"] > 2 * shares["node1"], shares


def test_members_that_do_not_own_are_skipped() -> None:
    group = [*members(3), Member("leaving", "http://10.0.0.9:7000", owns=False)]
    assert "leaving" not in owners(group)
    assert owner([Member("x", "http://h:1", owns=False)], KEYS[0]) is None


def test_the_previous_owner_is_known_after_a_change() -> None:
    placement = Placement(members(4))
    assert all(placement.previous_owner(key) is None for key in KEYS[:100])  # no change yet
    placement.update(members(5))
    moved = [key for key in KEYS if placement.owner(key).name == "node4"]  # type: ignore[union-attr]
    assert moved
    for key in moved[:50]:
        previous = placement.previous_owner(key)
        assert previous is not None and previous.name == owner(members(4), key).name  # type: ignore[union-attr]
    unmoved = next(key for key in KEYS if placement.owner(key).name != "node4")  # type: ignore[union-attr]
    assert placement.previous_owner(unmoved) is None


def test_orders_asked_before_a_change_follow_it() -> None:
    """The orders Placement keeps are forgotten on a change: a member that joined, or one that
    stopped owning blocks (a terminating endpoint, the same name), is seen at once."""
    placement = Placement(members(4))
    assert [placement.owner(key).name for key in KEYS] == owners(members(4))  # type: ignore[union-attr]
    placement.update(members(5))
    assert [placement.owner(key).name for key in KEYS] == owners(members(5))  # type: ignore[union-attr]
    terminating = [*members(4), Member("node4", "http://10.0.0.4:7000", owns=False)]
    placement.update(terminating)
    assert all(placement.owner(key).name != "node4" for key in KEYS)  # type: ignore[union-attr]
    assert all("node4" not in [m.name for m in placement.ranked(key)] for key in KEYS[:100])


def test_a_handover_can_end_early() -> None:
    placement = Placement(members(4))
    placement.update(members(5))
    assert any(placement.previous_owner(key) is not None for key in KEYS[:100])
    placement.end_handover()
    assert all(placement.previous_owner(key) is None for key in KEYS)


class Clock:
    """A clock the test moves by hand (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def moved_keys(placement: Placement) -> list[BlockKey]:
    return [key for key in KEYS[:400] if placement.previous_owner(key) is not None]


def test_a_handover_lasts_its_time_after_each_change() -> None:
    clock = Clock()
    placement = Placement(members(4), handover=300.0, clock=clock)
    placement.update(members(5))
    moved = moved_keys(placement)
    assert moved
    clock.now += 299.0
    assert moved_keys(placement) == moved  # still within the handover
    clock.now += 1.0
    assert moved_keys(placement) == []  # its time is up
    clock.now += 3600.0
    placement.update(members(6))  # a new change: a new handover, from now
    assert moved_keys(placement)
    clock.now += 299.0
    assert moved_keys(placement)
    clock.now += 1.0
    assert moved_keys(placement) == []


def test_a_handover_of_zero_is_none() -> None:
    placement = Placement(members(4), handover=0.0, clock=Clock())
    placement.update(members(5))
    assert moved_keys(placement) == []

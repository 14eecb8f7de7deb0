"""A peer's breaker (pffs.group.breaker): broken on a failure, one trial after the pause, up
again on a success; a trial cancelled before its answer lets the next request try."""

from __future__ import annotations

import time

import pytest

from pffs.group import breaker as breakers
from pffs.group.breaker import PeerBreaker


def test_broken_then_one_trial_then_up(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    peer = PeerBreaker("node-x")
    assert peer.allows() and peer.up
    peer.failed("timed out")
    assert not peer.up and not peer.allows()
    now[0] += breakers.FIRST_PAUSE + 0.1
    assert peer.allows()  # the trial
    assert not peer.allows()  # one at a time
    peer.abandoned()  # its reader went away
    assert peer.allows()
    peer.failed("timed out")  # the pause doubles
    now[0] += breakers.FIRST_PAUSE + 0.1
    assert not peer.allows()
    now[0] += breakers.FIRST_PAUSE
    assert peer.allows()
    peer.succeeded()
    assert peer.up and peer.allows()

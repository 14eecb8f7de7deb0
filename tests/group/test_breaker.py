"""A peer's breaker (pffs.group.breaker): broken on a failure, one trial after the pause, up
again on a success; a trial cancelled before its answer lets the next request try; an answer to a
request sent before the last change is no verdict."""

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
    peer.failed("timed out", sent=now[0])
    assert not peer.up and not peer.allows()
    now[0] += breakers.FIRST_PAUSE + 0.1
    assert peer.may_try() and peer.may_try()  # a look takes no trial
    assert peer.allows()  # the trial
    trial = now[0]
    assert not peer.allows() and not peer.may_try()  # one at a time
    peer.abandoned(trial)  # its reader went away
    assert peer.allows()
    peer.failed("timed out", sent=now[0])  # the pause doubles
    now[0] += breakers.FIRST_PAUSE + 0.1
    assert not peer.allows()
    now[0] += breakers.FIRST_PAUSE
    assert peer.allows()
    peer.succeeded(sent=now[0])
    assert peer.up and peer.allows()


def test_an_answer_sent_before_the_break_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILLed peer's socket buffers can still hold a whole block for one kept-alive
    connection after another saw the connection break: that answer must not call it back up."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    peer = PeerBreaker("node-x")
    before = now[0]
    now[0] += 0.01
    peer.failed("connection broken", sent=now[0])
    peer.succeeded(sent=before)
    assert not peer.up
    peer.failed("short body", sent=before)  # no doubling for an old request's failure
    now[0] += breakers.FIRST_PAUSE + 0.1
    assert peer.allows()
    trial = now[0]
    peer.abandoned(before)  # an old request's end does not free the trial's place
    assert not peer.allows()
    now[0] += 0.01
    peer.succeeded(sent=trial)
    assert peer.up
    peer.failed("timed out", sent=before)  # sent before the recovery: no verdict either
    assert peer.up

"""tests/waiting.py's `eventually`, on a virtual clock."""

from __future__ import annotations

import pytest

from tests.waiting import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_returns_the_first_true_value_as_soon_as_it_holds() -> None:
    clock, answers = Clock(), iter([None, 0, "", "found", "later"])
    assert eventually(lambda: next(answers), 10, clock=clock, sleep=clock.sleep) == "found"
    assert clock.now == pytest.approx(3 * 0.05)


def test_fails_past_its_bound_saying_what_and_the_last_value() -> None:
    clock = Clock()
    with pytest.raises(AssertionError, match=r"the log line: not so after 2s \(last seen: 0\)"):
        eventually(lambda: 0, 2, "the log line", clock=clock, sleep=clock.sleep)
    assert 2 <= clock.now < 2 + 0.05 * 2


def test_an_error_of_the_condition_is_raised_at_once() -> None:
    clock = Clock()

    def broken() -> bool:
        raise KeyError("no such metric")

    with pytest.raises(KeyError):
        eventually(broken, 10, clock=clock, sleep=clock.sleep)
    assert clock.now == 0

"""bench.leftovers' thread pool: a failure (as a Ctrl-C would) drops the work not started."""

from __future__ import annotations

import threading
import time

import pytest

from bench.leftovers import in_threads


def test_a_failure_drops_the_items_not_started() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        if item == 0:
            raise RuntimeError("the first item fails")
        time.sleep(0.01)
        with lock:
            done.append(item)

    with pytest.raises(RuntimeError, match="the first item fails"):
        in_threads(2, work, range(1000))  # 5 s of work if the rest were run first
    assert len(done) < 100


def test_every_item_runs_when_none_fails() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        with lock:
            seen.append(item)

    in_threads(4, work, range(50))
    assert sorted(seen) == list(range(50))

"""The retry loop's streamed form (pffs.retry.stream_with_retry): an attempt is everything it
yields; a transient failure midway starts another, which resumes where the last one stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pffs.config import RetryConfig
from pffs.errors import NotFound, Transient
from pffs.retry import call_with_retry, stream_with_retry

POLICY = RetryConfig(attempts=3, base_delay=0.001, max_delay=0.001, total_timeout=5.0)


def _pieces(items: list[int], failures: list[Exception]) -> tuple[Iterator[int], list[int]]:
    """A stream of `items` whose attempts each fail, in turn, with the next of `failures`
    after one item; `starts` records where each attempt started."""
    done, starts = 0, []

    def start() -> Iterator[int]:
        nonlocal done
        starts.append(done)
        while done < len(items):
            done += 1
            yield items[done - 1]
            if failures:
                raise failures.pop(0)

    stream = stream_with_retry(
        start, is_transient=lambda e: isinstance(e, Transient), policy=POLICY, what="GET"
    )
    return stream, starts


def test_a_stream_broken_midway_resumes_and_yields_each_item_once() -> None:
    stream, starts = _pieces([1, 2, 3, 4], [Transient("reset"), Transient("reset")])
    assert list(stream) == [1, 2, 3, 4]
    assert starts == [0, 1, 2]  # each attempt asked only for what the ones before did not give


def test_a_stream_fails_after_the_items_it_gave_once_retries_run_out() -> None:
    stream, starts = _pieces([1, 2, 3, 4, 5], [Transient("reset")] * 3)
    got: list[int] = []
    with pytest.raises(Transient):
        got.extend(stream)
    assert got == [1, 2, 3] and len(starts) == POLICY.attempts


def test_a_permanent_failure_is_not_retried() -> None:
    stream, starts = _pieces([1, 2, 3], [NotFound("gone")])
    got: list[int] = []
    with pytest.raises(NotFound):
        got.extend(stream)
    assert got == [1] and starts == [0]


def test_a_call_is_a_stream_of_one_value() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise Transient("503")
        return "ok"

    assert (
        call_with_retry(
            flaky, is_transient=lambda e: isinstance(e, Transient), policy=POLICY, what="GET"
        )
        == "ok"
    )
    assert len(calls) == 2

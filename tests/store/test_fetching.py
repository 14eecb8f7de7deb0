"""pffs.store.fetching: a request's terms (pffs.retry.RetryTerms) go down with it to the retry loop
of its backend, so the store's push backs reach the source's pace and its breaker stops the
retries, with nothing carried beside the call.

The backend is the local one, wrapped so its reads go through pffs.retry's real loop as the S3
backend's do, the first attempts of each answered with a push back (a 503 SlowDown): a local
directory never pushes back by itself.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.config import RetryConfig
from pffs.errors import SourceDown, Throttled, Transient
from pffs.retry import RetryTerms, call_with_retry
from pffs.routing.table import Mounted
from pffs.store.fetching import Store, StoreBlocks
from tests.fs.helpers import HoldingBackend

POLICY = RetryConfig(attempts=5, base_delay=0.001, max_delay=0.001, total_timeout=10.0)
DATA = bytes(range(256)) * 16


class PushingBack(HoldingBackend):
    """The local backend whose reads are retried by pffs.retry, each read's first `refusals`
    attempts refused with a push back; `attempts` counts them all."""

    def __init__(self, root: Path, refusals: int) -> None:
        super().__init__(root)
        self.refusals = refusals
        self.attempts = 0
        self.on_attempt = lambda: None

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        refused, read = 0, super().read_range

        def attempt() -> bytes:
            nonlocal refused
            self.attempts += 1
            self.on_attempt()
            if refused < self.refusals:
                refused += 1
                raise Throttled(f"{path}: 503 SlowDown")
            return read(path, start, length, version)

        return call_with_retry(
            attempt,
            is_transient=lambda exc: isinstance(exc, Transient),
            policy=POLICY,
            what=f"GET {path}",
            terms=terms,
        )


def _source(tmp_path: Path, refusals: int) -> tuple[PushingBack, Mounted, StoreBlocks]:
    (tmp_path / "f.bin").write_bytes(DATA)
    backend = PushingBack(tmp_path, refusals)
    mounted = Mounted("", backend)
    version = backend.inner.stat("f.bin").version
    blocks = ObjectBlocks(backend.source_id, backend.principal, "f.bin", version, len(DATA), 1024)
    return backend, mounted, StoreBlocks(Store.of(mounted), blocks)


def test_a_load_aheads_push_backs_halve_the_pace_and_a_readers_do_not(tmp_path: Path) -> None:
    backend, mounted, source = _source(tmp_path, refusals=2)
    ceiling = mounted.flow.pace.current

    async def main() -> None:
        assert await source.part(0, 100) == DATA[:100]  # a reader's, retried twice
        mounted.flow.pace.settle()
        assert mounted.flow.pace.current == ceiling  # a reader's push backs are not loading ahead's
        async with source.run(1, 1) as landing:
            assert [index async for index, _ in landing] == [1]
        mounted.flow.pace.settle()
        assert mounted.flow.pace.current == ceiling // 2

    trio.run(main)
    assert backend.attempts == 6


def test_the_breaker_stops_a_request_between_two_attempts(tmp_path: Path) -> None:
    backend, mounted, source = _source(tmp_path, refusals=3)

    def another_reader_marks_it_down() -> None:  # during the first attempt
        mounted.health.down_since = time.monotonic()

    backend.on_attempt = another_reader_marks_it_down

    async def main() -> None:
        with pytest.raises(SourceDown):
            await source.part(0, 100)

    trio.run(main)
    assert backend.attempts == 1


def test_a_run_of_one_block_or_of_several_gives_each_block_once_in_order(tmp_path: Path) -> None:
    # A run of one block takes the channel without a task of its own (pffs.store.fetching's
    # _OneBlock); it must land what as_safe_channel's run of several lands.
    backend, _, source = _source(tmp_path, refusals=0)

    async def main() -> None:
        async with source.run(2, 1) as landing:
            assert [item async for item in landing] == [(2, DATA[2048:3072])]
            with pytest.raises(trio.EndOfChannel):
                await landing.receive()  # one block, then the end
        async with source.run(0, 3) as landing:
            assert [item async for item in landing] == [
                (index, DATA[index * 1024 : (index + 1) * 1024]) for index in range(3)
            ]
        async with source.run(3, 1):
            pass  # left unread: no request made

    trio.run(main)
    assert backend.attempts == 4


def test_a_run_of_one_block_raises_its_requests_failure(tmp_path: Path) -> None:
    _, _, source = _source(tmp_path, refusals=99)  # beyond the retries: Throttled

    async def main() -> None:
        async with source.run(0, 1) as landing:
            with pytest.raises(Transient):
                async for _ in landing:
                    pass

    trio.run(main)

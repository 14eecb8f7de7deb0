"""The preload engine against a fake store of files (no VFS): bytes exact, bounds (a job's
sender held by its channel), priority, failures dropped, cancellation and idle jobs.

The store is a fake so it can hold requests, fail on demand and count what is in flight."""

from __future__ import annotations

import functools
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey
from pffs.cache.preload import (
    ITEMS_QUEUED,
    OPENS_KEPT_WITHOUT_JOBS,
    Items,
    Preloader,
    PreloadItem,
    job_channel,
)
from pffs.errors import NotFound, Transient
from tests.cache.configs import KIB, FetchSource, cache_config

BLOCK = 16 * KIB


def in_trio(
    test: Callable[..., Awaitable[None]], clock: trio.abc.Clock | None = None
) -> Callable[..., None]:
    """Run an async test in trio (pytest sees the test's own arguments)."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        trio.run(functools.partial(test, *args, **kwargs), clock=clock)

    return run


class Store:
    """Files by name; counts requests and the most in flight; can throttle or hold requests."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.throttle: set[str] = set()  # names answered with a 503 SlowDown
        self.missing: set[str] = set()
        self.gate = trio.Event()
        self.gate.set()
        self.delay = 0.0

    def item(self, name: str) -> PreloadItem:
        size = len(self.files[name])
        count = max(1, -(-size // BLOCK))
        sizes = [min(BLOCK, size - i * BLOCK) for i in range(count)]
        keys = [BlockKey("s", "u", name, "v1", i) for i in range(count)]

        return PreloadItem(("s", name), keys, sizes, FileSource(self, name, sizes))


class FileSource:
    """One file of the fake store as a block source: counts its requests, answers at the
    store's gate, delay and faults."""

    def __init__(self, store: Store, name: str, sizes: list[int]) -> None:
        self.store, self.name, self.sizes = store, name, sizes

    async def part(self, offset: int, length: int) -> bytes:
        raise AssertionError("preload loads runs only")

    @trio.as_safe_channel
    async def run(self, first: int, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
        store, name = self.store, self.name
        store.requests.append(name)
        store.in_flight += 1
        store.most_in_flight = max(store.most_in_flight, store.in_flight)
        try:
            await store.gate.wait()
            await trio.sleep(store.delay)
            if name in store.throttle:
                raise Transient("503 SlowDown")
            if name in store.missing:
                raise NotFound(name)
            for index in range(first, first + count):
                start = index * BLOCK
                yield index, store.files[name][start : start + self.sizes[index]]
        finally:
            store.in_flight -= 1


def stream(nursery: trio.Nursery, items: Iterable[PreloadItem]) -> Items:
    """A job's channel, fed by a task of `nursery` as the engine takes items."""
    send, receive = job_channel()

    async def feed() -> None:
        async with send:
            for item in items:
                try:
                    await send.send(item)
                except trio.BrokenResourceError:
                    return  # the engine ended the job

    nursery.start_soon(feed)
    return receive


def files(count: int, size: int) -> dict[str, bytes]:
    rng = random.Random(count * size)
    return {f"f{i:04}": rng.randbytes(size) for i in range(count)}


async def read_back(cache: BlockCache, store: Store, name: str) -> bytes:
    item = store.item(name)

    async def not_cached() -> bytes:
        raise AssertionError(f"{name} block was not in the cache")

    source = FetchSource(not_cached)
    blocks = [await cache.read(k, source, n) for k, n in zip(item.keys, item.sizes, strict=True)]
    return b"".join(blocks)


@pytest.mark.parametrize("size", [5 * KIB, 3 * BLOCK + 7])
@in_trio
async def test_loads_every_file_bytes_exact(tmp_path: Path, size: int) -> None:
    store = Store(files(20, size))
    cache = BlockCache(cache_config(tmp_path, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=32 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await engine.wait_idle()
        for name, data in store.files.items():
            assert await read_back(cache, store, name) == data
        nursery.cancel_scope.cancel()
    # One request per file: a small file is one GET, a larger one one run (<= fetch_size).
    assert sorted(store.requests) == sorted(store.files)
    assert engine.stats.files_fetched == 20
    assert engine.stats.bytes_fetched == 20 * size
    # Preloaded blocks read back are preload's to count, not readahead's.
    assert cache.stats.readahead_issued == cache.stats.readahead_used == 0


@in_trio
async def test_bounds_concurrency_and_budget(tmp_path: Path) -> None:
    count = ITEMS_QUEUED + 100
    store = Store(files(count, 2 * BLOCK))
    store.gate = trio.Event()  # hold every request
    cache = BlockCache(cache_config(None, memory_bytes=2048 * BLOCK, ahead_budget=512 * BLOCK))
    engine = Preloader(cache, budget=10 * BLOCK, concurrency=16)
    pulled = 0

    def counted() -> Iterator[PreloadItem]:
        nonlocal pulled
        for name in store.files:
            pulled += 1
            yield store.item(name)

    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, counted()))
        await trio.testing.wait_all_tasks_blocked()
        # 10 blocks of budget = 5 files of 2 blocks in flight; the sender waits on a full
        # channel (the one it is sending, too).
        assert store.in_flight == 5
        assert engine.bytes_in_flight <= 10 * BLOCK
        assert pulled <= 6 + ITEMS_QUEUED + 1
        store.gate.set()
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    assert store.most_in_flight == 5
    assert engine.stats.files_fetched == count


@pytest.mark.parametrize(("budget", "at_once"), [(64 * BLOCK, 3), (8 * BLOCK, 2)])
@in_trio
async def test_a_file_of_several_runs_asks_for_them_at_once(budget: int, at_once: int) -> None:
    # A large file preloaded in series waits a round trip and a run's transfer per run; its
    # reader, opening it while that goes on, waits behind them (a scan's 36 MiB Parquet files).
    # A file larger than the budget (loaded alone) has as many runs at once as it holds.
    store = Store(files(1, 12 * BLOCK))
    store.gate = trio.Event()  # hold every request
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK, fetch_size=4 * BLOCK))
    engine = Preloader(cache, budget=budget)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await trio.testing.wait_all_tasks_blocked()
        assert store.in_flight == at_once  # of three runs of four blocks
        store.gate.set()
        await engine.wait_idle()
        assert await read_back(cache, store, "f0000") == store.files["f0000"]
        nursery.cancel_scope.cancel()
    assert store.most_in_flight == at_once
    assert engine.stats.bytes_fetched == 12 * BLOCK


@in_trio
async def test_a_file_of_several_runs_that_fails_reports_the_stores_error() -> None:
    # `pffs warmup` prints it: "f0000: 503 SlowDown", not a group of the runs' errors.
    store = Store(files(1, 12 * BLOCK))
    store.throttle = {"f0000"}
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK, fetch_size=4 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK)
    outcomes: list[int | Exception] = []
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        items = stream(nursery, [store.item(n) for n in store.files])
        engine.add("job", items, report=lambda _, outcome: outcomes.append(outcome))
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    assert len(outcomes) == 1 and type(outcomes[0]) is Transient, outcomes
    assert str(outcomes[0]) == "503 SlowDown"
    assert engine.stats.files_failed == 1


@in_trio
async def test_room_for_unread_files_stops_loading_until_readers_use_them() -> None:
    store = Store(files(50, BLOCK))
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK, unread_max=10 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await trio.testing.wait_all_tasks_blocked()
        assert len(store.requests) == 10
        assert engine.unread_bytes == 10 * BLOCK
        for name in list(store.files)[:4]:  # a reader opens four of them
            engine.used(("s", name))
        await trio.testing.wait_all_tasks_blocked()
        assert len(store.requests) == 14
        assert engine.stats.files_used == 4
        engine.cancel("job")
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    assert engine.stats.files_wasted == 10


@in_trio
async def test_a_file_opened_before_its_turn_is_left_to_the_reader() -> None:
    store = Store(files(10, BLOCK))
    cache = BlockCache(cache_config(None))
    engine = Preloader(cache, budget=64 * BLOCK)
    engine.used(("s", "f0003"))
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    assert "f0003" not in store.requests and len(store.requests) == 9


@in_trio
async def test_failures_are_dropped() -> None:
    store = Store(files(60, BLOCK))
    store.throttle = {"f0001", "f0002"}
    store.missing = {"f0003"}
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK, concurrency=16, unread_max=256 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await engine.wait_idle()
        # Failed files were given up: a reader fetching them itself gets the store's error.
        for name in ("f0001", "f0003"):
            key = store.item(name).keys[0]
            assert not cache.is_cached_or_coming(key)
        nursery.cancel_scope.cancel()
    assert engine.stats.files_failed == 3
    assert engine.stats.files_fetched == 57


@functools.partial(in_trio, clock=trio.testing.MockClock(autojump_threshold=0))
async def test_cancelled_job_stops_taking_items() -> None:
    store = Store(files(100, BLOCK))
    store.delay = 0.01
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=4 * BLOCK, unread_max=256 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await trio.sleep(0.03)
        engine.cancel("job")
        await engine.wait_idle()
        taken = len(store.requests)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    # Virtual time: 30 ms of requests of 10 ms, at most 4 (the budget's blocks) at once.
    assert 0 < taken <= 4 * 4, taken
    assert len(store.requests) == taken


@functools.partial(in_trio, clock=trio.testing.MockClock(autojump_threshold=0))
async def test_job_ends_when_readers_stop() -> None:
    store = Store(files(100, BLOCK))
    store.delay = 1.0
    cache = BlockCache(cache_config(None, memory_bytes=512 * BLOCK))
    engine = Preloader(cache, budget=BLOCK, idle_after=10.0, unread_max=512 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await trio.sleep(5.5)
        engine.touch("job")  # a reader at work: 10 s more
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    # One file a second, one at a time: about 15 s of loading, never the whole job.
    assert 14 <= len(store.requests) <= 17
    assert not engine.has_job("job")


@functools.partial(in_trio, clock=trio.testing.MockClock(autojump_threshold=0))
async def test_room_held_by_a_finished_job_comes_back_when_its_readers_go() -> None:
    first = Store(files(10, BLOCK))
    second = Store({f"g{i}": data for i, data in enumerate(files(10, 2 * BLOCK).values())})
    cache = BlockCache(cache_config(None, memory_bytes=512 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK, idle_after=10.0, unread_max=12 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("first", stream(nursery, [first.item(n) for n in first.files]))
        await engine.wait_idle()  # its stream is done; its 10 files wait for readers
        assert engine.unread_bytes == 10 * BLOCK and engine.has_job("first")
        engine.add("second", stream(nursery, [second.item(n) for n in second.files]))
        await trio.sleep(5)
        assert len(second.requests) == 1  # only the room left: one file of two blocks
        engine.touch("second")
        await trio.sleep(7)  # "first" had no reader for 12 s: its room comes back
        assert not engine.has_job("first")
        assert engine.stats.files_wasted == 10
        assert len(second.requests) == 6
        nursery.cancel_scope.cancel()


@in_trio
async def test_opens_with_no_job_under_way_are_remembered_within_a_bound() -> None:
    """Every read-only open is told to the engine; with no job under way it remembers only
    the latest ones, so a mount reading a million files without preload stays small."""
    store = Store(files(3, BLOCK))
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK)
    for n in range(3 * OPENS_KEPT_WITHOUT_JOBS):
        engine.used(("s", f"opened-{n}"))
    assert len(engine._handled) <= OPENS_KEPT_WITHOUT_JOBS
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("job", stream(nursery, [store.item(n) for n in store.files]))
        await engine.wait_idle()
        assert len(store.requests) == 3 and engine.unread_bytes == 3 * BLOCK
        engine.used(("s", next(iter(store.files))))
        assert engine.unread_bytes == 2 * BLOCK
        nursery.cancel_scope.cancel()


@in_trio
async def test_a_held_job_loads_nothing_until_released_and_others_go_on() -> None:
    """A dataset read by ranges holds its job (pffs.fs.datasets): nothing is taken from it,
    a job behind it is loaded meanwhile, and once released its files are loaded."""
    store = Store(files(12, BLOCK))
    names = list(store.files)
    cache = BlockCache(cache_config(None, memory_bytes=256 * BLOCK))
    engine = Preloader(cache, budget=64 * BLOCK)
    async with trio.open_nursery() as nursery:
        cache.attach(nursery)
        engine.attach(nursery)
        engine.add("ranges", stream(nursery, [store.item(n) for n in names[:6]]), held=True)
        engine.add("whole", stream(nursery, [store.item(n) for n in names[6:]]))
        await engine.wait_idle()  # a held job is idle: it waits for its release
        assert sorted(store.requests) == names[6:]
        engine.hold("ranges", True)
        engine.hold("ranges", False)
        await engine.wait_idle()
        assert sorted(store.requests) == names
        nursery.cancel_scope.cancel()

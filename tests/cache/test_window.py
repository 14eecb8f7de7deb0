"""Windows of sequential readers alone (pffs.cache.window): Little's law windows, the parts that
carry them, and the budget shared fairly among the readers streaming at once."""

from __future__ import annotations

import pytest

from pffs.cache.window import (
    ACTIVE_SECONDS,
    HEADROOM,
    RATE_PERIOD,
    STREAMS,
    ReaderWindow,
    Windows,
)

MIB = 1 << 20
BLOCK = 4 * MIB


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_windows(
    clock: Clock, budget: int = 128 * MIB, readahead_max: int = 32 * MIB, largest: int = 128 * MIB
) -> Windows:
    return Windows(budget, readahead_max, largest, BLOCK, max_part=16 * MIB, clock=clock)


def stream(reader: ReaderWindow, clock: Clock, rate: float, seconds: float, read: int = MIB):
    """The reader consumes `read`-byte reads at `rate` bytes/s for `seconds`."""
    for _ in range(round(seconds * rate / read)):
        clock.now += read / rate
        reader.read(read)


def test_before_anything_is_measured_the_window_is_the_configured_one() -> None:
    clock = Clock()
    assert make_windows(clock, readahead_max=32 * MIB).reader().size() == 32 * MIB
    alone_with_a_small_budget = make_windows(clock, budget=16 * MIB).reader()
    assert alone_with_a_small_budget.size() == 16 * MIB


def test_a_long_files_reader_starts_at_the_largest_window() -> None:
    """A file of at least the largest window: its reader does not wait for Little's law to grow
    its window from the configured one; a shorter file's keeps the configured one, and a long
    file's reader among others still gets its share only."""
    clock = Clock()
    windows = make_windows(clock, readahead_max=32 * MIB, largest=128 * MIB)
    assert windows.reader(file_size=512 * MIB).size() == 128 * MIB
    assert windows.reader(file_size=128 * MIB).size() == 64 * MIB  # two readers now
    clock.now += 2.0  # both quiet: their shares go back
    assert windows.reader(file_size=127 * MIB).size() == 32 * MIB
    assert windows.reader().size() == 32 * MIB


def test_a_far_store_gets_headroom_times_rate_times_request_time() -> None:
    clock = Clock()
    window = make_windows(clock, readahead_max=32 * MIB, largest=128 * MIB).reader()
    stream(window, clock, rate=400e6, seconds=1.0)
    for _ in range(20):
        window.fetched(0.08)  # a far store: 8 MiB parts take 80 ms
    assert window.rate == pytest.approx(400e6, rel=0.01)
    assert window.size() == pytest.approx(HEADROOM * 400e6 * 0.08, rel=0.01)


def test_a_near_store_or_a_slow_reader_keeps_the_configured_window() -> None:
    clock = Clock()
    window = make_windows(clock, readahead_max=32 * MIB).reader()
    stream(window, clock, rate=1e6, seconds=1.0, read=64 * 1024)
    window.fetched(0.02)
    assert window.size() == 32 * MIB


def test_a_reader_held_back_by_a_far_store_grows_its_window_to_the_largest() -> None:
    """While the store sets the pace, the reader consumes what arrives: window / request time.
    Each estimate then asks HEADROOM times more, until the largest window."""
    clock = Clock()
    window = make_windows(clock, readahead_max=32 * MIB, largest=128 * MIB).reader()
    window.fetched(0.2)
    sizes = []
    for _ in range(6):
        size = window.size()
        sizes.append(size)
        stream(window, clock, rate=size / 0.2, seconds=1.0)
    assert sizes[0] == 32 * MIB and sizes[-1] == 128 * MIB
    assert sizes == sorted(sizes)
    assert sizes[2] > sizes[1] * 1.5


def test_a_seek_does_not_count_as_a_slow_read() -> None:
    clock = Clock()
    window = make_windows(clock).reader()
    stream(window, clock, rate=200e6, seconds=0.5)
    window.paused()
    clock.now += 5.0  # the reader did something else
    stream(window, clock, rate=200e6, seconds=0.2)
    assert window.rate == pytest.approx(200e6, rel=0.01)


def test_the_budget_is_shared_by_the_readers_streaming_now() -> None:
    clock = Clock()
    shared = make_windows(clock, budget=128 * MIB, readahead_max=64 * MIB)
    readers = [shared.reader() for _ in range(4)]
    sizes = [reader.size() for reader in readers]
    assert sizes[0] == 64 * MIB  # alone then: the configured window
    assert sizes[-1] == 32 * MIB  # four at once: a quarter of the budget each
    assert [reader.size() for reader in readers] == [32 * MIB] * 4
    assert shared.streaming() == 4


def test_a_reader_gone_quiet_or_closed_gives_its_share_back() -> None:
    clock = Clock()
    shared = make_windows(clock, budget=128 * MIB, readahead_max=128 * MIB)
    first, second, third = shared.reader(), shared.reader(), shared.reader()
    for reader in (first, second, third):
        reader.size()
    assert first.size() == 128 * MIB // 3
    third.close()
    assert first.size() == 64 * MIB
    clock.now += ACTIVE_SECONDS + 0.5  # the second reader stopped asking
    assert first.size() == 128 * MIB
    assert shared.streaming() == 1


def test_parts_split_a_window_over_several_requests_of_whole_blocks() -> None:
    window = make_windows(Clock()).reader()
    assert window.part_blocks(128 * MIB) == 16 * MIB // BLOCK  # 8 GETs of the largest request
    assert window.part_blocks(32 * MIB) == 16 * MIB // BLOCK
    assert window.part_blocks(16 * MIB) == 16 * MIB // STREAMS // BLOCK  # STREAMS GETs at least
    assert window.part_blocks(8 * MIB) == 1
    small_blocks = Windows(128 * MIB, 64 * MIB, 64 * MIB, MIB, 16 * MIB, Clock()).reader()
    assert small_blocks.part_blocks(64 * MIB) == 16  # blocks of 1 MiB: 16 MiB parts
    huge_blocks = Windows(128 * MIB, 64 * MIB, 64 * MIB, 32 * MIB, 16 * MIB, Clock()).reader()
    assert huge_blocks.part_blocks(64 * MIB) == 1  # a part is one block at least


def test_a_rate_needs_a_whole_period_of_reads() -> None:
    clock = Clock()
    window = make_windows(clock).reader()
    window.read(MIB)
    clock.now += RATE_PERIOD / 2
    window.read(MIB)
    assert window.rate is None
    clock.now += RATE_PERIOD
    window.read(MIB)
    assert window.rate == pytest.approx(2 * MIB / (1.5 * RATE_PERIOD))

"""The per-file readahead policy: pure bookkeeping, no I/O."""

from __future__ import annotations

import random

from pffs.cache.readahead import Readahead
from tests.cache.configs import KIB


def test_readahead_grows_on_sequential_reads_and_resets_on_seek() -> None:
    block = 4 * KIB
    ra = Readahead(block, max_window_bytes=8 * block, file_size=1000 * block)
    windows = []
    for offset in range(0, 20 * block, block // 2):
        windows.append(len(ra.on_read(offset, offset + block // 2)))
    assert windows[0] == 1 and max(windows) == 8
    assert list(ra.on_read(500 * block, 500 * block + 100)) == []  # a seek: nothing
    # Sequential again: the first continuation may be chance, the second starts a window.
    assert list(ra.on_read(500 * block + 100, 500 * block + 200)) == []
    assert len(ra.on_read(500 * block + 200, 500 * block + 300)) == 1


def test_random_reads_never_read_ahead() -> None:
    block = 4 * KIB
    ra = Readahead(block, max_window_bytes=8 * block, file_size=1000 * block)
    rng = random.Random(0)
    for _ in range(200):
        offset = rng.randrange(1, 999) * block + 7
        assert list(ra.on_read(offset, offset + 4096)) == []


def test_readahead_stops_at_the_end_of_the_file() -> None:
    ra = Readahead(100, max_window_bytes=10_000, file_size=350)
    assert list(ra.on_read(0, 100)) == [1]
    assert list(ra.on_read(100, 200)) == [2, 3]
    assert list(ra.on_read(200, 300)) == [3]

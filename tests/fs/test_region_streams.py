"""A short region run streamed (pffs.fs.regions): the kernel's READs of a tensor's page faults
get their bytes from ranged GETs streamed in pieces just ahead of them, no blocks loaded.

The store is the fake of tests/fs/test_reads_through_cache.py that serves runs in one request
(as S3 does) and can break one mid-stream, which no real server does on demand; the real path
through S3 and the kernel is tests/mount/test_lazy_checkpoint.py's.
"""

from __future__ import annotations

import itertools
import random

import pytest
import trio

from pffs.cache.readahead import REGION_STREAM_AHEAD
from pffs.errors import SourceDown, Transient
from tests.cache.configs import KIB, cache_config
from tests.fs.test_reads_through_cache import RunStore, cached_vfs, with_nursery

MIB = 1024 * KIB
BLOCK = 2 * MIB
READ = 512 * KIB  # the kernel's READs of a mapping: a quarter of a block at most, as here


def _region(seed: int, fail_at: int = 0) -> tuple[bytes, RunStore, list[tuple[int, int]], int]:
    data = random.Random(seed).randbytes(24 * BLOCK)
    store = RunStore({"f": data}, fail_at=fail_at)
    start = 7 * BLOCK + 5616  # a tensor's first byte, past a safetensors header
    region = 6 * MIB  # shorter than REGION_STREAM_BLOCKS blocks: streamed throughout
    return data, store, [(o, READ) for o in range(start, start + region, READ)], start


def test_a_region_is_streamed_just_ahead_of_its_reads() -> None:
    data, store, reads, start = _region(1)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]
    end = reads[-1][0] + READ
    assert store.ranges[0] == (start, READ)  # the first READ starts no run: its bytes alone
    # Then spans in pieces, never a whole block: the pieces cover the rest of the region once,
    # and at most REGION_STREAM_AHEAD past its last READ.
    pieces = store.ranges[1:]
    assert pieces[0][0] == start + READ and max(n for _, n in pieces) < BLOCK
    covered = sorted(pieces)
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))
    assert covered[-1][0] + covered[-1][1] <= end + REGION_STREAM_AHEAD
    assert store.requests < len(reads)  # spans of several READs each


@pytest.mark.parametrize("fail_at", [1, 3, 9, 17])
def test_a_span_broken_midway_gives_its_reads_their_bytes_anyway(fail_at: int) -> None:
    data, store, reads, _ = _region(fail_at, fail_at=fail_at)
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    assert got == [data[o : o + n] for o, n in reads]  # the READs asked for them themselves


def test_a_span_failing_for_good_fails_its_reads_with_the_stores_error() -> None:
    _, store, reads, _ = _region(5)

    def refuse(*args: object, **kwargs: object) -> None:
        raise Transient("the store went away")

    store.read_blocks = refuse  # type: ignore[method-assign]
    store.fail_every = 1  # every read_range too: the READs' own requests
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    with pytest.raises(ExceptionGroup) as raised:
        trio.run(with_nursery, cached_vfs(store, config), "f", reads)
    # The READ's own request failed (the breaker then fails the next at once), not a hang.
    assert raised.group_contains(Transient) or raised.group_contains(SourceDown)


def test_a_read_alone_across_a_blocks_end_is_one_request() -> None:
    """The first READ of a fault's read-around starts no run; when it crosses a block's end it
    gets its bytes in one request, not one per block in series with a block behind the second."""
    data, store, _, _ = _region(7)
    offset = 5 * BLOCK - 4 * KIB
    config = cache_config(None, block=BLOCK, readahead_max=8 * BLOCK, ahead_budget=16 * BLOCK)
    got = trio.run(with_nursery, cached_vfs(store, config), "f", [(offset, READ)])
    assert got == [data[offset : offset + READ]]
    assert store.ranges == [(offset, READ)]

"""ObjectBlocks: the one place an object's version becomes block keys, lengths and spans."""

from __future__ import annotations

import pytest

from pffs.cache.keys import BlockKey, ObjectBlocks

BLOCK = 100


def blocks(size: int) -> ObjectBlocks:
    return ObjectBlocks("s3://b", "u", "dir/f", "etag", size, BLOCK)


@pytest.mark.parametrize(("size", "count", "last"), [(0, 0, None), (1, 1, 1), (100, 1, 100)])
def test_small_objects(size: int, count: int, last: int | None) -> None:
    object_blocks = blocks(size)
    assert object_blocks.count == count
    assert object_blocks.lengths() == ([] if last is None else [last])


def test_keys_lengths_and_starts_of_a_longer_object() -> None:
    object_blocks = blocks(250)
    assert object_blocks.count == 3
    assert object_blocks.keys() == [BlockKey("s3://b", "u", "dir/f", "etag", i) for i in range(3)]
    assert object_blocks.lengths() == [100, 100, 50]
    assert object_blocks.keys(range(1, 3)) == object_blocks.keys()[1:]
    assert object_blocks.lengths(range(2, 2)) == []  # an empty window is no block, not all
    assert [object_blocks.start(i) for i in range(3)] == [0, 100, 200]
    # The file's ident does not carry the version: a new version is the same file.
    assert object_blocks.ident == ObjectBlocks("s3://b", "u", "dir/f", "v2", 7, BLOCK).ident


@pytest.mark.parametrize(
    ("offset", "end", "spans"),
    [
        (0, 250, [(0, 0, 100), (1, 0, 100), (2, 0, 50)]),
        (5, 6, [(0, 5, 6)]),
        (99, 101, [(0, 99, 100), (1, 0, 1)]),
        (100, 200, [(1, 0, 100)]),
        (150, 250, [(1, 50, 100), (2, 0, 50)]),
    ],
)
def test_spans_cover_exactly_the_bytes_asked(
    offset: int, end: int, spans: list[tuple[int, int, int]]
) -> None:
    object_blocks = blocks(250)
    assert object_blocks.spans(offset, end) == spans
    data = bytes(range(250))
    pieces = [data[object_blocks.start(i) :][start:stop] for i, start, stop in spans]
    assert b"".join(pieces) == data[offset:end]

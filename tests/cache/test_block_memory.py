"""Block memory (pffs.cache.blockmemory): a block's mapping is reused only once nothing holds
the block or a slice of it, free mappings beyond the spare bound are let go, and a block in one
is written to the disk tier as it lies and reads back exact (pffs.cache.entries)."""

from __future__ import annotations

import os
import random

from pffs.cache.blockmemory import BlockMemory
from pffs.cache.entries import ALIGN, read_block, read_layout, write_entry

MIB = 1 << 20


def _received(memory: BlockMemory, data: bytes) -> memoryview:
    taken = memory.take(len(data))
    assert taken is not None
    target, block = taken
    target[:] = data
    return block


def test_a_held_block_keeps_its_bytes_while_later_blocks_arrive() -> None:
    memory = BlockMemory(spare_bytes=8 * MIB)
    first = _received(memory, b"a" * (4 * MIB))
    view = first[100:200]  # what a FUSE reply or a peer holds: a slice
    del first
    for fill in b"bcdefgh":
        _received(memory, bytes([fill]) * (4 * MIB))  # dropped at once: free again
    assert bytes(view) == b"a" * 100
    assert memory.held() == 4 * MIB
    del view
    assert memory.held() == 0


def test_a_free_mapping_serves_the_next_block() -> None:
    memory = BlockMemory(spare_bytes=8 * MIB)
    first = _received(memory, b"a" * (4 * MIB))
    mapping = id(memory.mapping_of(first))  # its id only: a reference would hold it
    del first
    second = _received(memory, b"b" * (4 * MIB))
    assert id(memory.mapping_of(second)) == mapping
    assert bytes(second[:3]) == b"bbb"
    assert memory.kept() == 4 * MIB


def test_free_mappings_beyond_the_spare_bound_are_let_go() -> None:
    memory = BlockMemory(spare_bytes=8 * MIB)
    held = [_received(memory, b"x" * (4 * MIB)) for _ in range(5)]
    assert memory.kept() == memory.held() == 20 * MIB  # held ones are the blocks' own memory
    del held
    _received(memory, b"y" * (4 * MIB))
    assert memory.held() == 0
    assert memory.kept() == 12 * MIB  # the one taken, and 8 MiB spare


def test_only_the_block_handed_out_is_known_as_starting_its_mapping() -> None:
    memory = BlockMemory()
    block = _received(memory, b"z" * (4 * MIB))
    assert memory.mapping_of(block) is not None
    assert memory.mapping_of(block[ALIGN:]) is None  # a slice does not start the mapping
    assert memory.mapping_of(bytes(block)) is None
    assert memory.mapping_of(BlockMemory().take(4 * MIB)) is None  # another pool's


def test_a_short_last_block_is_not_given_a_mapping() -> None:
    memory = BlockMemory()
    _received(memory, b"z" * (4 * MIB))
    assert memory.take(MIB) is None  # a 4 MiB mapping would hold 4x what the cache counts
    assert memory.take(3 * MIB) is not None


def test_a_block_in_block_memory_is_written_in_place_and_reads_back(tmp_path) -> None:
    memory = BlockMemory()
    for length in (4 * MIB, 4 * MIB - 1000):  # a whole block, and one the padding follows
        data = random.Random(length).randbytes(length)
        block = _received(memory, data)
        mapping = memory.mapping_of(block)
        assert mapping is not None
        mapping[length:] = b"\xff" * (len(mapping) - length)  # the last block's leftovers
        path = str(tmp_path / f"entry-{length}")
        size = write_entry(path, "key", block, compress=False, mapping=mapping)
        assert size == os.path.getsize(path) and size % ALIGN == 0
        assert bytes(block) == data  # the padding went after the block, not into it
        fd = os.open(path, os.O_RDONLY)
        try:
            layout = read_layout("key", fd)
            assert layout is not None
            assert read_block(layout, fd) == data
        finally:
            os.close(fd)


def test_a_compressible_block_is_packed_not_written_in_place(tmp_path) -> None:
    memory = BlockMemory()
    data = b"compressible " * (300 * 1024)
    block = _received(memory, data)
    path = str(tmp_path / "entry")
    size = write_entry(path, "key", block, compress=True, mapping=memory.mapping_of(block))
    assert size < len(data) // 2
    fd = os.open(path, os.O_RDONLY)
    try:
        layout = read_layout("key", fd)
        assert layout is not None
        assert read_block(layout, fd) == data
    finally:
        os.close(fd)

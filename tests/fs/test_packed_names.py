"""Packed names on their own: what goes in comes back, in order or overwritten many times,
names that are not UTF-8 (surrogate escapes), and a name too long to keep."""

from __future__ import annotations

import os
import random

import pytest

from pffs.fs.inodes import InodeTable
from pffs.fs.listings import DirListing
from pffs.fs.names import NameIndex, PackedNames, encode
from tests.fs.test_inode_table import dir_info, file_info

# A name as os.listdir gives a file whose name is not UTF-8, and others that are.
ODD_NAMES = [os.fsdecode(b"caf\xe9.bin"), "é", "日本語.txt", "a b", "z" * 300, "x"]


def test_names_come_back_as_given_and_are_found_by_name() -> None:
    names = PackedNames()
    index = NameIndex(names)
    shuffled = ODD_NAMES + [f"o{n:06d}" for n in range(500)]
    random.Random(1).shuffle(shuffled)
    for name in shuffled:  # through several growths of the index
        names.append(encode(name))
        index.add(len(names) - 1, encode(name))
    assert list(names) == shuffled
    assert [index.get(encode(name)) for name in shuffled] == list(range(len(shuffled)))
    assert index.get(encode("o000000x")) is None and index.get(b"") is None


def test_names_overwritten_many_times_stay_right_and_the_bytes_stay_small() -> None:
    rng = random.Random(3)
    names = PackedNames()
    names.extend_blank(1000)
    model = [""] * 1000
    for step in range(50000):
        index = rng.randrange(1000)
        model[index] = rng.choice(ODD_NAMES) + str(step)
        names.set(index, model[index])
    assert list(names) == model
    assert all(names.equals(index, encode(name)) for index, name in enumerate(model))
    live = sum(len(encode(name)) for name in model)
    assert len(names._bytes) <= 2 * live + (1 << 16)  # rewritten, not grown without end


def test_a_name_too_long_to_keep_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="too long"):
        PackedNames().append(encode("n" * 70000))


def test_odd_names_go_through_the_listing_and_the_table_unchanged() -> None:
    listing = DirListing()
    for name in sorted(ODD_NAMES, key=encode):
        listing.add(file_info(name))
    table = InodeTable(dir_info(""))
    directory = table.remember("d", dir_info("d"), 0.0)
    for name in ODD_NAMES:
        position = listing.position(name)
        assert position is not None and listing.info_at(position).name == name
        inode = table.remember_listed(f"d/{name}", listing, position, 0.0, directory.ino)
        assert inode.path == f"d/{name}" and inode.info.name == name
        assert table.known(f"d/{name}") is not None
    assert listing.position(os.fsdecode(b"caf\xe8.bin")) is None

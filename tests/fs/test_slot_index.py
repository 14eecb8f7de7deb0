"""The inode table's open-addressing index on its own: numbers that collide, removals that
shift entries back across the array's end, growth and rebuilds, checked against a dict."""

from __future__ import annotations

import random
from array import array

from pffs.fs.slotindex import SlotIndex


def test_the_index_finds_what_a_dict_would_through_collisions_and_removals() -> None:
    rng = random.Random(18)
    inos: array[int] = array("q", bytes(8 * 4000))
    index = SlotIndex(inos)
    model: dict[int, int] = {}
    free = list(range(4000))
    rng.shuffle(free)
    # Numbers crowded onto a few home places (same low bits) and the array's last places, so
    # that probes wrap around its end; and digest-sized numbers.
    candidates = [(n << 6) | 63 for n in range(300)] + [(n << 7) | 5 for n in range(300)]
    candidates += [rng.getrandbits(62) | 1 << 62 for _ in range(3000)]
    for step in range(20000):
        if free and (not model or rng.random() < 0.55):
            ino = rng.choice(candidates)
            if ino in model:
                continue
            slot = free.pop()
            inos[slot] = ino
            index.add(slot)
            model[ino] = slot
        else:
            ino = rng.choice(list(model))
            slot = model.pop(ino)
            index.remove(slot)
            free.append(slot)
        if step % 997 == 0:
            assert all(index.get(ino) == slot for ino, slot in model.items())
            assert sorted(index.slots()) == sorted(model.values())
    assert len(index) == len(model)
    assert all(index.get(ino) == slot for ino, slot in model.items())
    assert all(index.get(ino) == -1 for ino in candidates if ino not in model)


def test_a_rebuild_indexes_the_first_slots_afresh() -> None:
    inos: array[int] = array("q", [(n << 10) | 3 for n in range(500)])
    index = SlotIndex(inos)
    for slot in range(500):
        index.add(slot)
    del inos[200:]  # as the table's compaction leaves its columns
    index.rebuild(200)
    assert len(index) == 200
    assert [index.get((n << 10) | 3) for n in range(500)] == list(range(200)) + [-1] * 300

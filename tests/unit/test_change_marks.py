"""What a change through the mount covers (pffs.fs.changes): the entry, everything below a
changed directory, its directory's listing; and past the bound, every answer under way."""

from __future__ import annotations

import pytest

from pffs.fs import changes
from pffs.fs.changes import ChangeMarks


def test_a_change_covers_the_entry_what_lies_below_it_and_its_directorys_listing() -> None:
    marks = ChangeMarks()
    asked = marks.mark()
    marks.note("data/train")  # a directory renamed or removed
    assert marks.entry_changed("data/train", asked)
    assert marks.entry_changed("data/train/shard-0.tar", asked)
    assert not marks.entry_changed("data/test/shard-0.tar", asked)
    assert not marks.entry_changed("data", asked)
    assert marks.listing_changed("data", asked)  # train left or came
    assert marks.listing_changed("data/train/sub", asked)
    assert not marks.listing_changed("data/test", asked)
    later = marks.mark()  # asked after the change: its answer is kept
    assert not marks.entry_changed("data/train", later)
    assert not marks.listing_changed("data", later)


def test_past_the_bound_every_answer_under_way_counts_as_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(changes, "MAX_CHANGED", 3)
    marks = ChangeMarks()
    asked = marks.mark()
    for name in ("a", "b", "c", "d"):
        marks.note(name)
    assert marks.entry_changed("z", asked) and marks.listing_changed("z", asked)
    after = marks.mark()
    marks.note("e")
    assert not marks.entry_changed("z", after) and marks.entry_changed("e", after)

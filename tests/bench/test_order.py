"""The order the bench runs the systems in (bench.cli.in_turn): each repetition and each
server-and-latency table starts with another system, so a position's cost (the first read
after an upload, the first mount after a proxy starts) is not one system's every time."""

from __future__ import annotations

from bench.cli import in_turn


def test_one_repetition_per_table_still_turns_the_order() -> None:
    """--quick runs one repetition: before, every table began with the first system."""
    systems = ["pffs", "s3fs", "rclone"]
    firsts = [in_turn(systems, table, rep=0)[0] for table in range(4)]
    assert firsts == ["pffs", "s3fs", "rclone", "pffs"]


def test_every_order_runs_every_system_once() -> None:
    systems = ["pffs", "s3fs", "rclone"]
    for table in range(3):
        for rep in range(3):
            assert sorted(in_turn(systems, table, rep)) == sorted(systems)
    assert in_turn(systems, 0, 1) == ["s3fs", "rclone", "pffs"]  # repetitions turn it too
    assert in_turn([], 2, 1) == []

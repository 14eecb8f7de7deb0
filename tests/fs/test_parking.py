"""Parking (pffs.fs.parking): a file's dropped region spans on local disk while it is open.

Real files in a real directory and real worker threads; the spans' bytes are made up here (the
read path that parks them is tests/fs/test_region_streams.py's)."""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
import trio.testing

from pffs.fs.parking import ParkedSpans, Parking

KIB = 1024


def _scratch_files(directory: Path) -> int:
    """Descriptors this process holds open on files in `directory` (a scratch file has no
    name left: its link reads as the directory's path and a number)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(f"{directory}/")
    return count


async def _written(parked: ParkedSpans) -> None:
    """Until the scratch file holds what was parked (its writes are worker threads': no trio
    task is left to wait for)."""
    with trio.fail_after(10):
        while parked.held:
            await trio.sleep(0.005)


async def _parked_in(
    directory: Path,
    room: int,
    test: Callable[[ParkedSpans, Parking], Awaitable[None]],
    unwritten: int = 1 << 20,
    free_ratio: float = 0.0,  # no floor: whatever the machine's disk holds (tests/conftest.py)
) -> None:
    parking = Parking(str(directory), room, unwritten, free_ratio)
    async with trio.open_nursery() as nursery:

        def spawn(fn: Callable[[], Awaitable[None]]) -> bool:
            nursery.start_soon(fn)
            return True

        await test(ParkedSpans(parking, spawn), parking)


def test_parked_bytes_leave_memory_for_the_scratch_file_and_come_back(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(512 * KIB)

    async def test(parked: ParkedSpans, parking: Parking) -> None:
        parked.park(1000, bytearray(data))
        assert await parked.read(1000 + 7, 1000 + 9000) == data[7:9000]  # in memory still
        await _written(parked)  # then nothing of it is left in memory
        assert _scratch_files(tmp_path) == 1
        assert await parked.read(1000 + 5, 1000 + len(data)) == data[5:]  # from the disk
        assert parked.covering(999) is None and parked.covering(1000) == 1000 + len(data)
        assert await parked.read(900, 1100) is None  # not all parked
        parked.close()
        assert parking.used == 0 and _scratch_files(tmp_path) == 0
        assert await parked.read(1000, 2000) is None  # closed: the caller asks the store

    trio.run(_parked_in, tmp_path, 1 << 20, test)


def test_spans_past_the_mounts_room_are_let_go(tmp_path: Path) -> None:
    async def test(parked: ParkedSpans, parking: Parking) -> None:
        for n in range(5):
            parked.park(n * 100 * KIB, bytes(100 * KIB))
        await _written(parked)
        assert parking.used == 300 * KIB  # three fit in the room
        assert parked.overlaps(0, 300 * KIB) and not parked.overlaps(300 * KIB, 500 * KIB)
        parked.close()
        assert parking.used == 0

    trio.run(_parked_in, tmp_path, 300 * KIB, test)


def test_spans_waiting_for_their_write_are_bounded_in_memory(tmp_path: Path) -> None:
    """A slow disk must not turn parking back into resident memory: past UNWRITTEN bytes not yet
    written across the mount, a dropped span is let go."""

    async def test(parked: ParkedSpans, parking: Parking) -> None:
        for n in range(5):  # all at once: no write has started yet
            parked.park(n * 100 * KIB, bytes(100 * KIB))
        assert parking.unwritten == 200 * KIB and parked.held == 200 * KIB
        await _written(parked)
        assert parking.unwritten == 0 and parking.used == 200 * KIB
        parked.park(500 * KIB, bytes(100 * KIB))  # room again once written
        assert parking.unwritten == 100 * KIB
        parked.close()  # before its write: let go all the same
        await trio.testing.wait_all_tasks_blocked()
        assert parking.used == parking.unwritten == 0 and _scratch_files(tmp_path) == 0

    trio.run(_parked_in, tmp_path, 1 << 20, test, 200 * KIB)


def test_a_scratch_file_that_cannot_be_made_parks_nothing_more(tmp_path: Path) -> None:
    async def test(parked: ParkedSpans, parking: Parking) -> None:
        parked.park(0, bytes(KIB))
        with trio.fail_after(10):
            while parking.used:  # the write failed: let go
                await trio.sleep(0.005)
        assert parking.used == 0 and not parked.overlaps(0, KIB)  # let go, room given back
        parked.park(KIB, bytes(KIB))
        assert parking.used == 0

    trio.run(_parked_in, tmp_path / "gone", 1 << 20, test)


def test_parking_leaves_the_disks_free_share_to_staged_writes(tmp_path: Path) -> None:
    """Staged writes share the scratch files' disk: past the free-space floor (the disk tier's
    --cache-free-ratio) a dropped span is let go, not parked."""

    async def test(parked: ParkedSpans, parking: Parking) -> None:
        parked.park(0, bytes(100 * KIB))
        assert parking.used == 0 and not parked.overlaps(0, 100 * KIB)
        parked.close()

    # This machine's disk is never 99.9999% free: the floor is always below.
    trio.run(_parked_in, tmp_path, 1 << 20, test, 1 << 20, 0.999999)

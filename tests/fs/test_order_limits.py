"""The caps of the order channel through the VFS, without a kernel (pffs.fs.orders): the
preload file's lists over their bytes or lines refused with one line, the listing work of a
list bounded, lists received at once capped, and each report its sender's alone. The socket's
side on a real mount: tests/mount/test_order_limits.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pffs.config import OrderLimits
from pffs.errors import Busy, TooLarge
from pffs.fs.orders import Sender
from pffs.fs.special import HIDDEN_DIR, PRELOAD_FILE
from pffs.fs.vfs import Vfs
from tests.fs.helpers import KIB, dataset, preloading_vfs, resolve, with_vfs

ALICE = Sender(uid=1000, pid=100)
BOB = Sender(uid=2000, pid=200)


async def hand_over(vfs: Vfs, text: bytes, sender: Sender) -> bytes:
    """Write a list through one read-write handle, then read that handle's report."""
    control = await resolve(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}")
    fh, _ = await vfs.open(control, os.O_RDWR, sender)
    try:
        for offset in range(0, len(text), 64 * KIB):
            await vfs.write(fh, offset, text[offset : offset + 64 * KIB])
        await vfs.fsync(fh)
        return bytes(await vfs.read(fh, 0, 1 << 20))
    finally:
        await vfs.release(fh)


async def report_for(vfs: Vfs, sender: Sender) -> bytes:
    fh, _ = await vfs.open(await resolve(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}"), os.O_RDONLY, sender)
    try:
        return bytes(await vfs.read(fh, 0, 1 << 20))
    finally:
        await vfs.release(fh)


def test_each_report_is_its_senders_own(tmp_path: Path) -> None:
    dataset(tmp_path, {"a": 3}, 2 * KIB)
    vfs, _ = preloading_vfs(tmp_path, trigger_files=100)

    async def body() -> None:
        assert await hand_over(vfs, b"a/000.bin\nsecret/plan\n", ALICE) == (
            b"queued 1\nsecret/plan: no such file\n"
        )
        assert await hand_over(vfs, b"a/001.bin\n", BOB) == b"queued 1\n"
        # A later reading open by the same process sees its own last report; another
        # process sees none of Alice's.
        assert await report_for(vfs, ALICE) == b"queued 1\nsecret/plan: no such file\n"
        assert await report_for(vfs, BOB) == b"queued 1\n"
        assert await report_for(vfs, Sender(uid=1000, pid=300)) == b""

    with_vfs(vfs, body)


def test_lists_over_their_bytes_or_lines_are_refused(tmp_path: Path) -> None:
    dataset(tmp_path, {"a": 3}, 2 * KIB)
    limits = OrderLimits(max_bytes=64 * KIB, max_lines=100)
    vfs, backend = preloading_vfs(tmp_path, trigger_files=100, orders=limits)

    async def body() -> None:
        with pytest.raises(TooLarge):
            await hand_over(vfs, b"a/000.bin\n" * 7000, ALICE)  # 70 KB
        assert await report_for(vfs, ALICE) == b"refused: the list is over 65536 bytes\n"
        with pytest.raises(TooLarge):
            await hand_over(vfs, b"a/000.bin\n" * 101, ALICE)
        assert await report_for(vfs, ALICE) == b"refused: the list is over 100 lines\n"
        # A last line without its end counts too.
        with pytest.raises(TooLarge):
            await hand_over(vfs, b"a/000.bin\n" * 100 + b"a/001.bin", ALICE)
        assert await hand_over(vfs, b"a/000.bin\n" * 100, ALICE) == b"queued 100\n"
        await vfs.datasets.engine.wait_idle()
        assert set(backend.reads) == {"a/000.bin"}  # nothing of the refused lists

    with_vfs(vfs, body)


def test_the_listing_work_of_a_list_is_bounded(tmp_path: Path) -> None:
    """Each directory a list names is listed; over `max_listed` entries in all, the list is
    refused, its files not loaded, and no directory listed past the cap's next chunk."""
    dataset(tmp_path, {"a": 30, "b": 30, "c": 30}, KIB)
    vfs, backend = preloading_vfs(tmp_path, trigger_files=1000, orders=OrderLimits(max_listed=50))

    async def body() -> None:
        text = b"a/000.bin\nb/000.bin\nc/000.bin\n"
        assert await hand_over(vfs, text, ALICE) == (
            b"refused: the list's directories hold over 50 entries\n"
        )
        assert len(vfs.namespace.listing_of("c").names) == 0  # never listed
        assert await hand_over(vfs, b"a/000.bin\na/001.bin\n", ALICE) == b"queued 2\n"
        await vfs.datasets.engine.wait_idle()
        assert set(backend.reads) == {"a/000.bin", "a/001.bin"}

    with_vfs(vfs, body)


def test_lists_received_at_once_are_capped(tmp_path: Path) -> None:
    vfs, _ = preloading_vfs(tmp_path, orders=OrderLimits(connections=2))

    async def body() -> None:
        control = await resolve(vfs, f"{HIDDEN_DIR}/{PRELOAD_FILE}")
        first, _ = await vfs.open(control, os.O_WRONLY, ALICE)
        second, _ = await vfs.open(control, os.O_WRONLY, ALICE)
        with pytest.raises(Busy):
            await vfs.open(control, os.O_WRONLY, BOB)
        reader, _ = await vfs.open(control, os.O_RDONLY, BOB)  # reading takes no slot
        await vfs.release(reader)
        await vfs.release(first)
        third, _ = await vfs.open(control, os.O_WRONLY, BOB)  # a slot given back
        await vfs.release(second)
        await vfs.release(third)
        assert vfs.special.slots.taken == 0

    with_vfs(vfs, body)

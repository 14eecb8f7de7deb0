"""The modes the kernel is told: write bits follow each source's read-only flag and the mount's,
and the hidden files keep their own (kernel-free: PffsOperations driven directly)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from pffs.backends.local import LocalBackend
from pffs.config import FuseConfig, MetaConfig, MountConfig, SourceConfig
from pffs.fuse_ops import PffsOperations
from pffs.routing.table import Mounted, MountTable
from tests.fs.helpers import make_vfs

NO_CONTEXT: Any = None  # the handlers tested never read the request context


def operations(table: MountTable, read_only_mount: bool = False) -> PffsOperations:
    vfs = make_vfs(table, meta=MetaConfig(), read_only=read_only_mount)
    fuse = FuseConfig(mountpoint="/unused", read_only=read_only_mount)
    return PffsOperations(vfs, MountConfig(table=(), fuse=fuse))


def source(root: Path, name: str) -> LocalBackend:
    (root / name).mkdir(parents=True)
    (root / name / "f.txt").write_bytes(b"x")
    return LocalBackend(SourceConfig(url=f"file://{root / name}"))


async def file_mode(ops: PffsOperations, *path: str) -> int:
    ino = 1
    for name in path:
        ino = (await ops.lookup(ino, name.encode(), NO_CONTEXT)).st_ino
    return (await ops.getattr(ino, NO_CONTEXT)).st_mode & 0o777


def test_write_bits_follow_each_source_and_the_mount(tmp_path: Path) -> None:
    mixed = MountTable(
        [Mounted("rw", source(tmp_path, "a")), Mounted("ro", source(tmp_path, "b"), True)]
    )
    only_ro = MountTable([Mounted("", source(tmp_path, "c"), read_only=True)])
    only_rw = MountTable([Mounted("", source(tmp_path, "d"))])

    async def main() -> None:
        ops = operations(mixed)
        assert await file_mode(ops, "rw", "f.txt") == 0o644
        assert await file_mode(ops, "ro", "f.txt") == 0o444
        assert await file_mode(ops, ".pffs", "stats") == 0o444
        assert await file_mode(ops, ".pffs", "preload") == 0o644  # an order list is written
        assert await file_mode(operations(only_ro), "f.txt") == 0o444
        assert await file_mode(operations(only_rw), "f.txt") == 0o644
        assert await file_mode(operations(only_rw), ".pffs", "stats") == 0o444
        assert await file_mode(operations(only_rw, read_only_mount=True), "f.txt") == 0o444

    trio.run(main)

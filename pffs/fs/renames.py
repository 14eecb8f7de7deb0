"""Name changes through the mount: unlink, mkdir, rmdir and rename.

mkdir makes a marker ("dir/" on S3), rmdir refuses non-empty directories (ENOTEMPTY), rename
moves files, and directories where the store can (on S3 by copying then deleting every object
under the prefix: not atomic, and as slow as the copies). Renames between two sources answer
EXDEV so tools copy instead. Files being written belong to the writer (pffs.fs.writes): an
unlink tells it to drop one, a rename has it upload one first, so the store holds what moves.
"""

from __future__ import annotations

import dataclasses
import itertools

from pffs.backends.base import ObjectInfo, is_valid_name, join
from pffs.errors import (
    Busy,
    CrossDevice,
    Exists,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    Unsupported,
    UsageError,
)
from pffs.fs.inodes import Inode
from pffs.fs.namespace import Namespace
from pffs.fs.writes import Writer
from pffs.routing.table import Mounted, MountTable
from pffs.workers import run_blocking

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # from linux/fs.h


class Renamer:
    """Renames and removals of names, and new directories, in the stores."""

    def __init__(self, namespace: Namespace, writer: Writer) -> None:
        self.namespace = namespace
        self.writer = writer
        self.table: MountTable = namespace.table

    async def unlink(self, parent_ino: int, name: str) -> None:
        path = join(self.namespace.inode(parent_ino).path, name)
        mounted, backend, inside = self.writer.writable(path, "unlink")
        if self.table.leads_to_mount(path):
            raise Busy(f"/{path} leads to a mount table entry")
        inode = await self.namespace.resolve(parent_ino, name)
        if inode.is_dir:
            raise IsADirectory(f"/{path} is a directory")
        was_staged = self.writer.unlinked(inode.ino)
        try:
            await run_blocking(mounted.flow.permit("reader"), backend.delete, inside)
        except NotFound:
            if not was_staged:
                raise
        self.namespace.gone(path)

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        parent = self.namespace.inode(parent_ino)
        if not is_valid_name(name):
            raise UsageError(f"{name!r} is not a valid directory name")
        path = join(parent.path, name)
        mounted, backend, inside = self.writer.writable(path, "mkdir")
        try:
            await self.namespace.resolve(parent_ino, name)
        except NotFound:
            pass
        else:
            raise Exists(f"/{path} already exists")
        info = await run_blocking(mounted.flow.permit("reader"), backend.make_dir, inside)
        inode = self.namespace.remember(path, dataclasses.replace(info, name=name))
        inode.lookups += 1
        self.namespace.changed(path)
        return inode

    async def rmdir(self, parent_ino: int, name: str) -> None:
        path = join(self.namespace.inode(parent_ino).path, name)
        if self.table.leads_to_mount(path):
            raise Busy(f"/{path} is or leads to a mount table entry")
        mounted, backend, inside = self.writer.writable(path, "rmdir")
        inode = await self.namespace.resolve(parent_ino, name)
        if not inode.is_dir:
            raise NotADirectory(f"/{path} is not a directory")
        await self._require_empty(mounted, inside, path)
        await run_blocking(mounted.flow.permit("reader"), backend.remove_dir, inside)
        self.namespace.gone(path)

    async def _require_empty(self, mounted: Mounted, inside: str, path: str) -> None:
        def first_entry() -> list[ObjectInfo]:
            return list(itertools.islice(mounted.backend.list(inside), 1))

        if await run_blocking(mounted.flow.permit("reader"), first_entry):
            raise NotEmpty(f"/{path} is not empty")

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        """Rename within one source; across two, EXDEV tells tools like mv to copy instead."""
        old_path = join(self.namespace.inode(old_parent).path, old_name)
        new_path = join(self.namespace.inode(new_parent).path, new_name)
        if flags & RENAME_EXCHANGE:
            raise Unsupported("rename: exchanging two names is not supported")
        old_route, new_route = self.table.route(old_path), self.table.route(new_path)
        if old_route and new_route and old_route[0] is not new_route[0]:
            raise CrossDevice(f"rename /{old_path} -> /{new_path}: they are in different sources")
        mounted, backend, old_inside = self.writer.writable(old_path, "rename")
        _, _, new_inside = self.writer.writable(new_path, "rename")
        if self.table.leads_to_mount(old_path) or self.table.leads_to_mount(new_path):
            raise Busy(f"rename /{old_path} -> /{new_path}: a mount table entry is in the way")
        if not is_valid_name(new_name):
            raise UsageError(f"{new_name!r} is not a valid name")
        source = await self.namespace.resolve(old_parent, old_name)
        await self._check_target(source, new_parent, new_name, new_path, flags)
        await self.writer.commit_if_staged(source)  # the store must hold what is renamed
        await run_blocking(mounted.flow.permit("reader"), backend.rename, old_inside, new_inside)
        self.namespace.moved(old_path, new_path, new_inside)
        await self.writer.renamed(new_inside)  # manifests name the new path from now on

    async def _check_target(
        self, source: Inode, new_parent: int, new_name: str, new_path: str, flags: int
    ) -> None:
        try:
            target = await self.namespace.resolve(new_parent, new_name)
        except NotFound:
            return
        if flags & RENAME_NOREPLACE:
            raise Exists(f"/{new_path} exists")
        if target.is_dir and not source.is_dir:
            raise IsADirectory(f"/{new_path} is a directory")
        if source.is_dir and not target.is_dir:
            raise NotADirectory(f"/{new_path} is not a directory")
        if target.is_dir:
            mounted, inside = self.namespace.route(new_path)
            await self._require_empty(mounted, inside, new_path)

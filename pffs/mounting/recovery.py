"""Staged writes a stopped or crashed pffs left behind: found at mount, uploaded or reported.

A staging file (pffs.fs.staging) outlives its process when the process dies before the upload
(kill -9, OOM, power loss) or when an upload failed at close. At the next mount of the same
source as the same principal (the credentials' identity, pffs.backends.principal: one
principal's writes are never uploaded with another's credentials), before the tree is served,
each one is handled by the state its manifest records:

- "closed": its writer closed it, so it is complete, but the upload failed. It is uploaded now,
  and removed once the store has it; if that fails again it stays, reported.
- "writing": the process died while the file was still open. Its bytes are what the writer
  wrote so far, but perhaps not all it meant to write: uploading could replace a good object
  with half a file (a checkpoint being rewritten, say). It is kept and reported with its path,
  so the user decides (copy it into the mount to upload it, or delete it).
- "clean": the store already holds these bytes; the file is removed.

Nothing is ever deleted unless the store holds its data. Files of other sources or principals
are left for a mount of theirs; files of the source whose manifest names no principal (written
before manifests did) are kept and reported; files still locked by a live process (another
mount sharing the cache directory) are not touched. Each report is one log line, also passed to
`notify` (which `pffs mount` prints on its stderr).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from pffs.errors import PffsError
from pffs.fs.staging import Staged, manifest_path, upload
from pffs.routing.table import Mounted
from pffs.workers import run_blocking

log = logging.getLogger("pffs.mounting.recovery")


@dataclass(frozen=True)
class Leftover:
    """One staging file found at mount, with what its manifest says (None when unreadable)."""

    data: str
    source: str | None
    principal: str | None  # None: a manifest from before principals were recorded
    path: str | None
    state: str | None
    size: int


@dataclass
class RecoveryReport:
    uploaded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def find_leftovers(staging_dir: str) -> list[Leftover]:
    """Staging files no live process holds (blocking)."""
    try:
        names = sorted(os.listdir(staging_dir))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(".data"):
            continue
        data = os.path.join(staging_dir, name)
        if _held_by_live_process(data):
            continue
        try:
            size = os.path.getsize(data)
        except OSError:
            continue
        source = principal = path = state = None
        try:
            with open(manifest_path(data), encoding="utf-8") as f:
                manifest = json.load(f)
            source, path = str(manifest["source"]), str(manifest["path"])
            principal = str(manifest["principal"]) if "principal" in manifest else None
            # Manifests written before states existed were made at create: "writing".
            state = str(manifest.get("state", "writing"))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # reported below as a file of unknown origin
        found.append(Leftover(data, source, principal, path, state, size))
    return found


def _held_by_live_process(data: str) -> bool:
    try:
        fd = os.open(data, os.O_RDONLY)
    except OSError:
        return True  # vanished or unreadable: not ours to handle
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False


def recover_staged(
    staging_dir: str,
    mounted: Sequence[Mounted],
    notify: Callable[[str], None] = lambda line: None,
) -> RecoveryReport:
    """Upload, keep or remove the leftovers of `mounted`'s sources (blocking: runs trio)."""
    report = RecoveryReport()
    by_identity: dict[tuple[str | None, str | None], Mounted] = {
        (m.backend.source_id, m.backend.principal): m for m in mounted
    }
    sources = {m.backend.source_id for m in mounted}
    leftovers = find_leftovers(staging_dir)
    mine = [item for item in leftovers if (item.source, item.principal) in by_identity]
    for item in leftovers:
        if item.source is None:
            why = "of unknown origin", "its manifest is missing or damaged"
        elif item.source in sources and item.principal is None:
            why = f"to {item.source}/{item.path}", "its manifest names no principal"
        else:
            continue
        _report(
            notify,
            f"a staged write {why[0]} is kept in {item.data} ({item.size} bytes; {why[1]}: "
            "copy it into the mount to upload it, or delete it)",
        )
        report.kept.append(item.data)
    if not mine:
        return report
    trio.run(_recover, mine, by_identity, report, notify)
    return report


async def _recover(
    items: list[Leftover],
    by_identity: dict[tuple[str | None, str | None], Mounted],
    report: RecoveryReport,
    notify: Callable[[str], None],
) -> None:
    for item in items:
        assert item.source is not None and item.path is not None
        original = by_identity[item.source, item.principal]
        # A limiter of this trio run: the table's own belong to the run that serves the mount.
        mounted = Mounted(original.path, original.backend, original.read_only)
        where = f"{item.source}/{item.path}"
        if item.state == "clean":
            _remove(item.data)
            report.removed.append(item.data)
            continue
        if item.state != "closed":
            _report(
                notify,
                f"{where}: a write in progress when pffs stopped was not uploaded; "
                f"its {item.size} bytes are kept in {item.data} (copy the file into the "
                "mount to upload it, or delete it)",
            )
            report.kept.append(item.data)
            continue
        if mounted.read_only:
            _report(
                notify,
                f"{where}: not uploaded, the source is mounted read-only; its data "
                f"is kept in {item.data}",
            )
            report.kept.append(item.data)
            continue
        try:
            await _upload(item, mounted)
        except PffsError as exc:
            _report(
                notify,
                f"{where}: upload of a staged write left by an earlier pffs failed "
                f"({exc}); its data is kept in {item.data}",
            )
            report.kept.append(item.data)
            continue
        _remove(item.data)
        report.uploaded.append(item.data)
        line = f"{where}: uploaded {item.size} bytes that a stopped pffs had staged"
        log.warning("%s", line)
        notify(line)


async def _upload(item: Leftover, mounted: Mounted) -> None:
    assert item.path is not None
    fd = os.open(item.data, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # two mounts starting at once: one wins
    except OSError:
        os.close(fd)
        raise PffsError("another pffs is uploading it") from None
    staged = Staged(mounted, item.path, item.data, fd, size=item.size)
    try:
        await upload(staged, run_blocking)
    finally:
        os.close(fd)


def _remove(data: str) -> None:
    for path in (data, manifest_path(data)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _report(notify: Callable[[str], None], line: str) -> None:
    log.error("%s", line)
    notify(line)

"""The volumes a node serves: one `pffs mount` process per volume, bind mounted into each target.

Layout under the state dir (root only, 0700):

    volumes/<key>/state.json    volume id, how it is mounted, its targets (the reference count)
    volumes/<key>/credentials   the keys the mount was started with (0600), read by it as values
                                (`pffs mount --credentials-file`) and again on a restart
    volumes/<key>/mnt           the staging mountpoint of the volume's FUSE mount
    log/<key>.log               the mount process's log, appended across restarts

The mount process runs in its own session (`pffs mount` daemonizes), so it outlives a restart
of the driver. On start, `recover()` re-adopts what is still mounted: live mounts are kept,
dead ones ("Transport endpoint is not connected") are cleared and, where pods still use them,
mounted again and bound again; the targets are checked against the kernel's mount table, so
the reference counts are those of the bind mounts that actually exist.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from pffs.credentials import Credentials
from pffs.csi import bind, mountprocess
from pffs.csi.params import READER_ONLY_MODES, SINGLE_TARGET_MODES, VolumeSpec
from pffs.csi.status import CsiError
from pffs.errors import PffsError
from pffs.mounting.kernel import (
    FSTYPE,
    find_mount,
    fusermount,
    is_dead,
    mount_table,
    wait_unmounted,
)
from pffs.privatefiles import private_dir

log = logging.getLogger("pffs.csi.volumes")


@dataclass(frozen=True)
class Publication:
    """How one target was published; a repeat must match it (else ALREADY_EXISTS)."""

    readonly: bool  # the request's flag
    access_mode: int
    context: dict[str, str] | None  # None: adopted from the mount table, details unknown

    @property
    def bind_readonly(self) -> bool:
        """Whether the target's bind mount is read-only: asked for, or a reader-only mode."""
        return self.readonly or self.access_mode in READER_ONLY_MODES

    def matches(self, other: Publication) -> bool:
        if self.context is None:
            return True
        return (self.readonly, self.access_mode, self.context) == (
            other.readonly,
            other.access_mode,
            other.context,
        )


@dataclass
class Volume:
    volume_id: str
    spec: VolumeSpec
    pid: int | None = None
    targets: dict[str, Publication] = field(default_factory=dict)

    @property
    def key(self) -> str:
        # Volume ids may hold '/', ':' and run to 128 bytes: a digest makes a safe dir name.
        return hashlib.sha256(self.volume_id.encode()).hexdigest()[:24]

    def to_json(self) -> dict[str, Any]:
        return {
            "volume_id": self.volume_id,
            "spec": self.spec.as_dict(),
            "pid": self.pid,
            "targets": {
                path: {"readonly": p.readonly, "access_mode": p.access_mode, "context": p.context}
                for path, p in self.targets.items()
            },
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Volume:
        return cls(
            volume_id=raw["volume_id"],
            spec=VolumeSpec.from_dict(raw["spec"]),
            pid=raw.get("pid"),
            targets={path: Publication(**p) for path, p in raw["targets"].items()},
        )


class VolumeManager:
    """Publishes and unpublishes volumes at target paths; one instance per node driver."""

    def __init__(
        self,
        state_dir: str,
        cache_dir: str,
        group_options: list[str] | None = None,
        node_options: list[str] | None = None,
    ) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.cache_dir = os.path.abspath(cache_dir)
        # `pffs mount` options joining the node's cache group (volumes with cacheGroup).
        self.group_options = group_options or []
        # The node's own `pffs mount` options (the operator's driver flags), every volume's.
        self.node_options = node_options or []
        self.volumes: dict[str, Volume] = {}
        self._guard = threading.Lock()  # self.volumes and self._busy
        self._busy: set[str] = set()
        for sub in ("volumes", "log"):
            os.makedirs(os.path.join(self.state_dir, sub), mode=0o700, exist_ok=True)
        private_dir(self.state_dir)  # never chmod through another user's symlink

    # --- paths -----------------------------------------------------------------------------

    def _dir(self, volume: Volume) -> str:
        return os.path.join(self.state_dir, "volumes", volume.key)

    def staging(self, volume: Volume) -> str:
        return os.path.join(self._dir(volume), "mnt")

    def log_path(self, volume: Volume) -> str:
        return os.path.join(self.state_dir, "log", f"{volume.key}.log")

    # --- locking: one operation per volume at a time ---------------------------------------

    @contextlib.contextmanager
    def operation(self, volume_id: str) -> Iterator[None]:
        """Hold the volume for one call; a concurrent call for it gets ABORTED (CSI spec)."""
        with self._guard:
            if volume_id in self._busy:
                raise CsiError(
                    grpc.StatusCode.ABORTED, f"an operation on volume {volume_id} is in progress"
                )
            self._busy.add(volume_id)
        try:
            yield
        finally:
            with self._guard:
                self._busy.discard(volume_id)

    def owner_of(self, target: str) -> str | None:
        with self._guard:
            for volume in self.volumes.values():
                if target in volume.targets:
                    return volume.volume_id
        return None

    # --- publish / unpublish ---------------------------------------------------------------

    def publish(
        self,
        volume_id: str,
        target: str,
        spec: VolumeSpec,
        publication: Publication,
        credentials: Credentials | None,
    ) -> None:
        """Make `target` show the volume; idempotent for a matching repeat."""
        owner = self.owner_of(target)
        if owner is not None and owner != volume_id:
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS, f"{target} is where volume {owner} is published"
            )
        volume = self.volumes.get(volume_id)
        if volume is not None:
            self._check_compatible(volume, target, spec, publication)
            if target in volume.targets and self._target_live(volume, target):
                return  # the same publish again: nothing to do
        else:
            volume = Volume(volume_id, spec)
        started = self._ensure_running(volume, credentials)
        try:
            self._make_target(target)
            self._unbind(target)  # a dead bind left by a crashed mount
            self._bind(volume, target, publication.bind_readonly)
        except BaseException:
            if started and not volume.targets:
                self._stop(volume)
            raise
        volume.targets[target] = publication
        with self._guard:
            self.volumes[volume_id] = volume
        self._save(volume)
        log.info("published %s at %s (%d targets)", volume_id, target, len(volume.targets))

    def _check_compatible(
        self, volume: Volume, target: str, spec: VolumeSpec, publication: Publication
    ) -> None:
        if volume.spec != spec:
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"volume {volume.volume_id} is mounted on this node with other attributes "
                f"(source {volume.spec.name})",
            )
        existing = volume.targets.get(target)
        if existing is not None and not existing.matches(publication):
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"volume {volume.volume_id} is published at {target} with another capability "
                "or read-only flag",
            )
        others = [t for t in volume.targets if t != target]
        modes = {p.access_mode for t, p in volume.targets.items() if t != target}
        if others and (
            publication.access_mode in SINGLE_TARGET_MODES or modes & SINGLE_TARGET_MODES
        ):
            raise CsiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"volume {volume.volume_id} is already published at {others[0]} with a "
                "single-node access mode",
            )

    def unpublish(self, volume_id: str, target: str) -> None:
        """Remove the bind at `target` and the target itself; stop the mount after its last."""
        owner = self.owner_of(target)
        if owner is not None and owner != volume_id:
            log.warning("%s belongs to volume %s, not %s: left alone", target, owner, volume_id)
            return
        self._unbind(target)
        try:
            os.rmdir(target)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # Not empty or not a directory: not something this driver made, so it stays.
            log.warning("left %s in place: %s", target, exc.strerror)
        volume = self.volumes.get(volume_id)
        if volume is None or target not in volume.targets:
            return
        del volume.targets[target]
        if volume.targets:
            self._save(volume)
        else:
            self._stop(volume)
        log.info("unpublished %s from %s (%d targets left)", volume_id, target, len(volume.targets))

    def is_publication(self, volume_id: str, path: str) -> bool:
        volume = self.volumes.get(volume_id)
        if volume is None:
            return False
        return path in volume.targets or path == self.staging(volume)

    # --- the mount process -----------------------------------------------------------------

    def _running(self, volume: Volume) -> bool:
        entry = find_mount(self.staging(volume))
        return entry is not None and entry.fstype == FSTYPE and not is_dead(self.staging(volume))

    def _target_live(self, volume: Volume, target: str) -> bool:
        staging, here = find_mount(self.staging(volume)), find_mount(target)
        if staging is None or here is None or here.device != staging.device:
            return False
        return not is_dead(target)

    def _ensure_running(self, volume: Volume, credentials: Credentials | None) -> bool:
        """Start the volume's mount unless it is live; True when it was started here. Given
        keys are kept (the newest) for a later restart; without, the kept ones are used."""
        if credentials is not None:
            mountprocess.write_credentials(self._dir(volume), credentials)
        if self._running(volume):
            return False
        staging = self.staging(volume)
        self._clear_dead(staging)
        os.makedirs(staging, mode=0o755, exist_ok=True)
        volume.pid = self._spawn(volume)
        # Targets bound to the old, dead mount are bound again to the new one.
        for target, publication in list(volume.targets.items()):
            try:
                self._unbind(target)
                self._bind(volume, target, publication.bind_readonly)
            except (OSError, CsiError) as exc:
                log.warning("could not bind %s again: %s", target, exc)
                del volume.targets[target]
        return True

    def _spawn(self, volume: Volume) -> int | None:
        """Run `pffs mount` for the volume; returns the daemon's pid once the mount is live."""
        spec = volume.spec
        if spec.mount_table is not None:
            table_file = os.path.join(self._dir(volume), "pffs.toml")
            with open(os.open(table_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(spec.mount_table)
            what = ["--config", table_file]
        else:
            what = [spec.source]
        options = [
            *what,
            self.staging(volume),
            *("--cache-dir", self.cache_dir, "--log-file", self.log_path(volume)),
            *self.node_options,
            *spec.mount_options(),
        ]
        if spec.cache_group:
            if not self.group_options:
                raise CsiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "the volume asks for a cache group (cacheGroup) and this node's driver is in "
                    "none (Helm value cacheGroup.enabled)",
                )
            options += self.group_options
        log.info("starting pffs mount of %s for volume %s", spec.name, volume.volume_id)
        keys = mountprocess.credentials_path(self._dir(volume))
        return mountprocess.start(spec.name, options, keys, self.state_dir)

    def _stop(self, volume: Volume) -> None:
        """Unmount the volume's FUSE mount (its daemon then exits) and forget the volume."""
        staging = self.staging(volume)
        entry = find_mount(staging)
        if entry is not None and entry.fstype == FSTYPE:
            try:
                fusermount(staging, lazy=is_dead(staging))
            except PffsError as exc:
                log.warning("%s; detaching it", exc)
                fusermount(staging, lazy=True)
            if not wait_unmounted(staging, timeout=10.0):
                log.warning("%s is still mounted after 10 s", staging)
        mountprocess.reap(volume.pid)
        with self._guard:
            self.volumes.pop(volume.volume_id, None)
        shutil.rmtree(self._dir(volume), ignore_errors=True)

    def _clear_dead(self, path: str) -> None:
        entry = find_mount(path)
        if entry is not None and entry.fstype.startswith("fuse") and is_dead(path):
            log.warning("clearing dead mount at %s (Transport endpoint is not connected)", path)
            with contextlib.suppress(OSError):
                bind.unmount(path, detach=True)
            wait_unmounted(path, timeout=5.0)

    # --- targets ---------------------------------------------------------------------------

    @staticmethod
    def _make_target(target: str) -> None:
        try:
            os.mkdir(target, 0o750)
        except FileExistsError:
            if not os.path.isdir(target):
                raise CsiError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{target} exists and is not a directory"
                ) from None
        except FileNotFoundError:
            raise CsiError(
                grpc.StatusCode.INVALID_ARGUMENT, f"the parent of {target} does not exist"
            ) from None

    def _bind(self, volume: Volume, target: str, readonly: bool) -> None:
        try:
            bind.bind_mount(self.staging(volume), target, read_only=readonly)
        except OSError as exc:
            raise CsiError(grpc.StatusCode.INTERNAL, str(exc.strerror)) from None

    @staticmethod
    def _unbind(target: str) -> None:
        """Unmount every pffs mount stacked at `target` (a repeated publish may stack two)."""
        for _ in range(16):
            entry = find_mount(target)
            if entry is None or entry.fstype != FSTYPE:
                return
            try:
                bind.unmount(target, detach=is_dead(target))
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise CsiError(grpc.StatusCode.INTERNAL, str(exc.strerror)) from None
                log.warning("%s is busy; detaching it", target)
                bind.unmount(target, detach=True)

    # --- state -----------------------------------------------------------------------------

    def _save(self, volume: Volume) -> None:
        path = os.path.join(self._dir(volume), "state.json")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(volume.to_json(), f, indent=1)
        os.replace(tmp, path)

    # --- restart ---------------------------------------------------------------------------

    def recover(self) -> None:
        """Re-adopt the volumes of an earlier run of the driver (see the module docstring)."""
        root = os.path.join(self.state_dir, "volumes")
        for key in sorted(os.listdir(root)):
            try:
                with open(os.path.join(root, key, "state.json"), encoding="utf-8") as f:
                    volume = Volume.from_json(json.load(f))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable volume state %s: %s", key, exc)
                self._clear_dead(os.path.join(root, key, "mnt"))
                shutil.rmtree(os.path.join(root, key), ignore_errors=True)
                continue
            try:
                self._recover(volume)
            except (OSError, CsiError, PffsError) as exc:
                log.error("volume %s could not be recovered: %s", volume.volume_id, exc)

    def _recover(self, volume: Volume) -> None:
        staging = self.staging(volume)
        live = self._running(volume)
        if not live:
            self._clear_dead(staging)
        device = find_mount(staging).device if live else None  # type: ignore[union-attr]
        rebind: list[str] = []
        for target in list(volume.targets):
            entry = find_mount(target)
            if entry is None or entry.fstype != FSTYPE:
                log.info("volume %s: %s is no longer mounted", volume.volume_id, target)
                del volume.targets[target]
            elif live and entry.device == device and not is_dead(target):
                continue
            else:
                log.warning("volume %s: %s is a dead mount", volume.volume_id, target)
                self._unbind(target)
                rebind.append(target)
        if live:
            # Binds made just before a crash, before the state was written, count too.
            for entry in mount_table():
                path = entry.mountpoint
                if entry.device == device and path != staging and path not in volume.targets:
                    readonly = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
                    volume.targets[path] = Publication(readonly, 0, None)
                    log.info("volume %s: adopted the bind mount at %s", volume.volume_id, path)
        with self._guard:
            self.volumes[volume.volume_id] = volume
        if not volume.targets:
            log.info("volume %s has no targets left: unmounting it", volume.volume_id)
            self._stop(volume)
            return
        if rebind:
            log.info("volume %s: mounting it again for %d targets", volume.volume_id, len(rebind))
            try:
                self._ensure_running(volume, None)  # a fresh mount binds every target itself
                for target in rebind:
                    if target in volume.targets and not self._target_live(volume, target):
                        self._unbind(target)
                        self._bind(volume, target, volume.targets[target].bind_readonly)
            except CsiError:
                for target in rebind:
                    volume.targets.pop(target, None)
                if volume.targets:
                    self._save(volume)
                else:
                    self._stop(volume)
                raise
        self._save(volume)
        log.info("volume %s re-adopted with %d targets", volume.volume_id, len(volume.targets))

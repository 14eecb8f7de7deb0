"""The mount's state on the host: the registry of live mounts, and where staging and logs go.

A live mount records its configuration under the user's state directory (XDG_STATE_HOME), one
file per mountpoint, so that `pffs warmup` run inside the mount finds its cache. A mount whose
sources were given keys (pffs.credentials) records nothing, since the record would need them:
`pffs warmup` reads through such a mount instead, with the mount's own keys. The same
directory holds a mount's default log and, without a disk cache, its staged writes.
"""

from __future__ import annotations

import contextlib
import os

from pffs.config import MountConfig, from_json, to_json


def state_dir() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "pffs")


def _escaped(mountpoint: str) -> str:
    return os.path.abspath(mountpoint).strip("/").replace("/", "_") or "root"


def registry_path(mountpoint: str) -> str:
    """Where a live mount records its configuration (for `pffs warmup` inside the mount)."""
    return os.path.join(state_dir(), "mounts", f"{_escaped(mountpoint)}.json")


def register_mount(mountpoint: str, config: MountConfig) -> str:
    path = registry_path(mountpoint)
    if any(entry.source.credentials is not None for entry in config.table):
        with contextlib.suppress(OSError):
            os.unlink(path)  # an earlier mount's record here would be wrong now
        return path
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(config))
    return path


def registered_config(mountpoint: str) -> MountConfig | None:
    try:
        with open(registry_path(mountpoint), encoding="utf-8") as f:
            return from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def staging_dir(config: MountConfig) -> str:
    """Where written data waits for upload: beside the disk cache, else in the state dir."""
    base = config.cache.disk_dir or state_dir()
    return os.path.join(base, "staging")


def default_log_path(mountpoint: str) -> str:
    return os.path.join(state_dir(), "log", f"{_escaped(mountpoint)}.log")

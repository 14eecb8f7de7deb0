"""`pffs fluid`: the FUSE container of a Fluid ThinRuntime, and its liveness probe.

`pffs fluid` reads Fluid's config (pffs.cli.fluidconfig), makes the target path (clearing a dead
mount a crashed container left there), mounts the Dataset's mounts as one tree and serves in
the foreground until SIGTERM or an unmount (Fluid's preStop runs `umount <targetPath>`), then
exits 0 with the kernel mount taken down.

When the config file changes (Fluid rewrites it when the Dataset's mounts change, without
restarting the container), pffs unmounts and exits with CONFIG_CHANGED, so that Kubernetes
restarts the container with the new mounts: pffs's tree is fixed for the life of a mount. A
config that changed into something unreadable is logged and the mount keeps serving.

`pffs fluid --check` exits 0 when a live pffs mount sits at the target path, 1 when it is
absent or dead (or does not answer within the probe's time), 2 when the config is unusable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from pffs.cli.fluidconfig import (
    find_config,
    option_dest,
    read_document,
    target_path,
    translated,
)
from pffs.cli.fluidpolicy import Policy
from pffs.errors import MountpointError, UsageError

log = logging.getLogger("pffs.fluid")
# Exit code after a config change (distinct from every error's, pffs.errors): restart me.
CONFIG_CHANGED = 9
# How long the liveness check waits for the mount to answer (a hung mount never does).
CHECK_TIMEOUT = 10.0


def run(args: argparse.Namespace, setup_logging: Callable[[bool, str | None, str], None]) -> int:
    """`pffs fluid [--check]` (its parser is in pffs.cli.options); `setup_logging` is the
    commands' own."""
    path = find_config(args.config)
    if args.check:
        return check(path)
    return serve(path, args.watch_interval, policy_of(args), setup_logging)


def policy_of(args: argparse.Namespace) -> Policy:
    """The profile's settings from `pffs fluid`'s command line."""
    allowed = frozenset(
        option_dest(key.strip(), f"--allow-option {key}")
        for text in args.allow_option
        for key in text.split(",")
        if key.strip()
    )
    return Policy(
        options=tuple(args.options),
        secrets_dir=args.secrets_dir,
        local_roots=tuple(os.path.abspath(root) for root in args.allow_local),
        node_credentials=args.allow_node_credentials,
        allowed_options=allowed,
    )


def serve(
    path: str,
    watch_interval: float,
    policy: Policy,
    setup_logging: Callable[[bool, str | None, str], None],
) -> int:
    """Mount what the config at `path` says and serve until SIGTERM, an unmount or a change."""
    from pffs.mounting.serving import serve_here

    document = read_document(path)
    watcher = ConfigWatcher(path, watch_interval, document)
    config = translated(document, os.environ, path, policy)
    setup_logging(config.debug, config.log_file, config.observe.log_level)
    target = config.fuse.mountpoint
    _make_target(target)
    log.info("Fluid config %s: %d mounts at %s", path, len(config.table), target)
    serve_here(config, on_ready=watcher.start)
    watcher.stop()
    if watcher.changed:
        log.warning(
            "exiting with %d: %s changed (the Dataset's mounts); the container restarts "
            "with the new mounts",
            CONFIG_CHANGED,
            path,
        )
        return CONFIG_CHANGED
    return 0


def _make_target(target: str) -> None:
    """mkdir -p the target path; a dead mount there is left for serve_here to clear."""
    from pffs.mounting.kernel import is_dead

    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        if not is_dead(target):
            raise MountpointError(f"cannot create {target}: {exc.strerror}") from None


class ConfigWatcher:
    """Looks at the config file every `interval` seconds once the mount is up; when its
    content changes, sends this process SIGTERM (the mount's own clean shutdown) and says so."""

    def __init__(self, path: str, interval: float, first: dict[str, Any]) -> None:
        self.path = path
        self.interval = interval
        self.changed = False
        self._stop = threading.Event()
        self._first = first  # what is mounted

    def _content(self) -> object:
        try:
            return read_document(self.path)
        except UsageError as exc:
            return exc  # unusable now (a torn write, bad JSON): logged, not acted on

    def start(self) -> None:
        threading.Thread(target=self._watch, name="fluid-config", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        reported = None
        while not self._stop.wait(self.interval):
            content = self._content()
            if isinstance(content, UsageError):
                if str(content) != reported:
                    log.warning("config changed but cannot be used, still serving: %s", content)
                    reported = str(content)
                continue
            if json.dumps(content, sort_keys=True) != json.dumps(self._first, sort_keys=True):
                log.warning("%s changed: unmounting to restart with the new mounts", self.path)
                self.changed = True
                os.kill(os.getpid(), signal.SIGTERM)
                return


def check(path: str) -> int:
    """The liveness probe: 0 when a live pffs mount is at the config's target path."""
    from pffs.mounting.kernel import FSTYPE, find_mount, is_dead

    target = target_path(read_document(path), os.environ, path)
    entry = find_mount(target)
    if entry is None or entry.fstype != FSTYPE:
        print(f"pffs: no pffs mount at {target}")
        return 1
    answer: list[bool] = []
    probe = threading.Thread(target=lambda: answer.append(is_dead(target)), daemon=True)
    probe.start()
    probe.join(CHECK_TIMEOUT)
    if not answer:
        print(f"pffs: the mount at {target} did not answer within {CHECK_TIMEOUT:g}s")
        return 1
    if answer[0]:
        print(f"pffs: the mount at {target} is dead (its process is gone)")
        return 1
    print(f"pffs: {target} is live")
    return 0

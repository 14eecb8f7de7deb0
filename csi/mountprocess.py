"""One volume's `pffs mount` process: started with the volume's own credentials, its failure
told as the gRPC status a CO understands, reaped after its unmount; and the credentials file
kept beside the volume's state (0600 in a 0700 directory, never argv or the environment), which
the mount reads as values (`pffs mount --credentials-file`, pffs.credentials), and again on a
restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import grpc

from pffs.credentials import Credentials, credentials_text
from pffs.csi.status import CsiError
from pffs.errors import UsageError

log = logging.getLogger("pffs.csi.volumes")

# `pffs mount` waits up to 60 s for its daemon; past this something is badly wrong.
MOUNT_TIMEOUT = 90.0
# `pffs mount` exit codes (pffs.errors) -> the status a CO understands.
EXIT_STATUS = {
    2: grpc.StatusCode.INVALID_ARGUMENT,
    3: grpc.StatusCode.NOT_FOUND,
    4: grpc.StatusCode.PERMISSION_DENIED,
    5: grpc.StatusCode.UNAVAILABLE,
}
PID_PATTERN = re.compile(r"\(pid (\d+)")
CREDENTIALS_FILE = "credentials"
# What a driver before this one kept instead: {"AWS_ACCESS_KEY_ID": ..., ...}.
FORMER_SECRETS_FILE = "secrets.json"


def start(
    name: str, options: list[str], credentials_file: str | None, state_dir: str
) -> int | None:
    """Run `pffs mount OPTIONS` for the volume `name`; the daemon's pid once the mount is live.

    The keys in `credentials_file` replace whatever credentials chain the driver itself has
    (without one, the mount uses that chain); the mount's record (read by `pffs warmup`
    inside it) stays in the driver's `state_dir`.
    """
    argv = [sys.executable, "-m", "pffs", "mount", *options]
    if credentials_file is not None:
        argv += ["--credentials-file", credentials_file]
    if os.geteuid() == 0:
        argv.append("--allow-other")  # pods run as any user; root needs no fuse.conf entry
    env = dict(os.environ, XDG_STATE_HOME=state_dir)
    try:
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=MOUNT_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise CsiError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"pffs mount of {name} did not answer in {MOUNT_TIMEOUT:.0f}s",
        ) from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        detail = (lines[-1] if lines else f"exit status {result.returncode}").removeprefix("pffs: ")
        code = EXIT_STATUS.get(result.returncode, grpc.StatusCode.INTERNAL)
        raise CsiError(code, f"mounting {name} failed: {detail}")
    match = PID_PATTERN.search(result.stdout)
    return int(match.group(1)) if match else None


def reap(pid: int | None) -> None:
    """Wait for a volume's daemon to exit after its unmount; end it if it lingers."""
    if pid is None or not is_pffs_daemon(pid):
        return
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and is_pffs_daemon(pid):
        time.sleep(0.05)
    if is_pffs_daemon(pid):
        log.warning("the mount process %d outlived its unmount; terminating it", pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def is_pffs_daemon(pid: int) -> bool:
    """True while `pid` is a pffs mount daemon (and not a reused pid or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return b"_daemon" in argv and state != b"Z"


def write_credentials(directory: str, credentials: Credentials) -> None:
    """Keep the keys a volume is mounted with, for its mount and a restart of it (0600)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, CREDENTIALS_FILE)
    fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(credentials_text(credentials))
    os.replace(f"{path}.tmp", path)


def credentials_path(directory: str) -> str | None:
    """The volume's credentials file, if it has one (a former driver's secrets.json becomes
    one here)."""
    path = os.path.join(directory, CREDENTIALS_FILE)
    former = os.path.join(directory, FORMER_SECRETS_FILE)
    if not os.path.exists(path) and os.path.exists(former):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, UsageError):
            with open(former, encoding="utf-8") as f:
                env = json.load(f)
            keys = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
            if keys[0] and keys[1]:
                token = env.get("AWS_SESSION_TOKEN")
                write_credentials(directory, Credentials(keys[0], keys[1], token))
        with contextlib.suppress(OSError):
            os.unlink(former)
    return path if os.path.exists(path) else None

"""The daemon hand-off: starting a mount in the background and hearing back from it.

The background `pffs mount` (its default) starts a daemon in its own session, so the mount
outlives the shell or the CSI driver that asked for it, and returns only once the daemon
reports the mount live, or with the daemon's own one-line error. The daemon serves with
pffs.mounting.serving and reports through a pipe named by an environment variable.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time

from pffs.config import MountConfig, to_json
from pffs.errors import MountFailed, PffsError, UsageError
from pffs.mounting.registry import default_log_path
from pffs.privatefiles import open_private_log

READY_FD_ENV = "PFFS_READY_FD"
# How long `pffs mount` waits for the daemon: the preflight checks have their own short bounds,
# so this only trips when something is badly wrong.
DAEMON_START_TIMEOUT = 60.0


class DaemonError(PffsError):
    """An error the daemon reported before the mount came up, with the daemon's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def start_daemon(config: MountConfig) -> tuple[int, str]:
    """Start a daemon serving `config`; return (pid, log path) once the mount is live."""
    log_path = config.log_file or default_log_path(config.fuse.mountpoint)
    try:  # never through another user's symlink (pffs.privatefiles)
        log_fd = open_private_log(log_path)
    except OSError as exc:
        raise UsageError(f"cannot open the log file {log_path}: {exc.strerror}") from None
    read_end, write_end = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(write_end)})
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pffs", "_daemon"],
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(write_end,),
            env=env,
            start_new_session=True,  # survives the caller's terminal and process group
        )
    finally:
        os.close(write_end)
        os.close(log_fd)
    assert proc.stdin is not None
    proc.stdin.write(to_json(config, with_credentials=True).encode())
    proc.stdin.close()
    try:
        message = _read_report(read_end, proc)
    finally:
        os.close(read_end)
    if message == "ok":
        return proc.pid, log_path
    code, _, text = message.partition(" ")
    if code.isdigit():
        raise DaemonError(text, int(code))
    raise MountFailed(f"the pffs daemon failed to start: {message} (log: {log_path})")


def _read_report(fd: int, proc: subprocess.Popen[bytes]) -> str:
    """The daemon's report: 'ok', or '<exit code> <message>'.

    Lines 'note <text>' before it are printed on stderr (what the user must know, such as
    staged writes recovered or kept) and show the daemon is busy: each restarts the clock.
    """
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if not text.startswith("note "):
                    return text
                sys.stderr.write(f"pffs: {text[5:]}\n")
                deadline = time.monotonic() + DAEMON_START_TIMEOUT
    if buffer:
        return buffer.decode(errors="replace").strip()
    status = proc.poll()
    if status is None:
        proc.terminate()
        return f"no answer within {DAEMON_START_TIMEOUT:.0f}s"
    return f"exited with status {status}"


def note_to_parent(line: str) -> None:
    """A line for the stderr of the `pffs mount` that started this daemon (if any)."""
    fd_text = os.environ.get(READY_FD_ENV)
    if fd_text is None:
        return
    with contextlib.suppress(OSError):  # the parent is gone
        os.write(int(fd_text), ("note " + line.replace("\n", " ") + "\n").encode())


def report_to_parent(line: str) -> None:
    """Send the daemon's first report line to the `pffs mount` that started it."""
    fd_text = os.environ.pop(READY_FD_ENV, None)
    if fd_text is None:
        return
    fd = int(fd_text)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
        os.close(fd)
    except OSError:
        pass  # the parent is gone; nothing to tell

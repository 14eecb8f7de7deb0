"""Processes a test started but is not the parent of: found by a marker in their environment,
whatever session they put themselves in (servers run in sessions of their own, mount daemons
detach: a test sets MARK=<token> in the environment of what it starts, and every descendant
inherits it), and waited for by pid."""

from __future__ import annotations

import os
import time


def marked_processes(mark: str, token: str) -> dict[int, str]:
    """Every live process whose environment carries `mark`=`token`: pid -> command line."""
    found = {}
    needle = f"{mark}={token}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


def wait_exited(pid: int, timeout: float = 60.0) -> bool:
    """Wait until process `pid` (not necessarily a child of ours) has exited, every thread of
    it: gone, or a zombie its parent has yet to reap. False if it still runs after `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _running(pid: int) -> bool:
    """Whether a thread of process `pid` still runs. Not its first thread alone: that one is a
    zombie as soon as it exits, while the others may still be exiting and still hold the
    process's files (a killed FUSE daemon's connection then ends a moment later, and a request
    made meanwhile is aborted, not refused)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            return True
    return False

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
    """Wait until process `pid` (not necessarily a child of ours) has exited: gone, or a
    zombie its parent has yet to reap. False if it still runs after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")

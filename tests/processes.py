"""Processes found by a marker in their environment, whatever session they put themselves in
(servers run in sessions of their own, mount daemons detach): a test sets MARK=<token> in the
environment of what it starts, and every descendant inherits it."""

from __future__ import annotations

import os


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

"""The `pffs` program: a pffs command line, or mount(8)'s form of one.

mount.fuse3 runs `pffs SOURCE MOUNTPOINT -o ...` for `mount -t fuse.pffs`; that form goes to
the mount helper, which translates it and comes back through `commands.run`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pffs.cli import commands, mounthelper


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if mounthelper.is_helper_call(arguments):
        return mounthelper.main(arguments)
    return commands.run(arguments)


if __name__ == "__main__":
    raise SystemExit(main())

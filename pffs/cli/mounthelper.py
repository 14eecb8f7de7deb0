"""`mount.pffs`: the mount(8) helper, so `mount -t fuse.pffs` and /etc/fstab lines mount pffs.

mount(8) runs `/sbin/mount.<type> SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]` when such
a helper exists; for type `fuse.pffs` it looks for /sbin/mount.fuse.pffs (link it to this
script), and failing that /sbin/mount.fuse (fuse3's mount.fuse3), which runs the subtype as a
program: `pffs SOURCE MOUNTPOINT -o OPTIONS`. pffs.cli.main hands that form here too, so both ways
land in `translate` below.

Each `-o` option becomes a `pffs mount` long option of the same name (`endpoint_url=URL` ->
`--endpoint-url URL`, `allow_other` -> `--allow-other`): the names are read from the option
table (pffs.optiontable), so every mount option works and nothing else does. Options meant
for mount(8), systemd or the kernel defaults FUSE already applies are dropped (`defaults`,
`rw`, `_netdev`, `noauto`, `nofail`, `x-systemd.*`, `nodev`, `nosuid`, `dev`, `suid`, ...:
pffs mounts are always nodev,nosuid); `ro` is `--read-only`; `debug` is pffs's
`--debug`; `credentials_file=PATH` is `--credentials-file PATH` (a mount started by systemd has
no AWS_* variables: pffs reads the keys from the file as values). Options that would change what the
kernel enforces but that pffs cannot apply (`noexec`, `sync`, `dirsync`) are refused rather
than dropped. A SOURCE without `://` is a mount table file (`pffs mount --config`).

Exit codes follow mount(8): 1 for a wrong invocation or option, 32 when the mount failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence

from pffs.cli import commands
from pffs.errors import UsageError
from pffs.optiontable import OPTIONS, TRISTATE, Option

EXIT_USAGE = 1  # mount(8): incorrect invocation or permissions
EXIT_MOUNT_FAILED = 32  # mount(8): mount failure
HELPER_TYPES = ("fuse.pffs", "pffs")

# For mount(8), systemd or the fstab reader, or already what every FUSE mount does (libfuse
# mounts nodev,nosuid; atime updates do not exist in pffs). `dev` and `suid` are dropped too:
# mount.fuse3 adds them for root, and a mount without them is only the stricter one.
IGNORED = frozenset(
    {
        "defaults",
        "rw",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "nofail",
        "_netdev",
        "nodev",
        "nosuid",
        "dev",
        "suid",
        "exec",
        "async",
        "atime",
        "noatime",
        "relatime",
        "strictatime",
        "diratime",
        "nodiratime",
        "lazytime",
        "nolazytime",
    }
)
IGNORED_PREFIXES = ("x-", "X-", "comment=")
# Kernel-enforced options pffs cannot pass on: refusing is safer than mounting without them.
REFUSED = frozenset({"noexec", "sync", "dirsync", "mand"})


def is_helper_call(argv: Sequence[str]) -> bool:
    """True for mount.fuse3's `pffs SOURCE MOUNTPOINT ...` (no pffs subcommand goes so)."""
    return len(argv) >= 2 and "://" in argv[0] and not argv[0].startswith("-")


def mount_options() -> dict[str, Option]:
    """`pffs mount`'s options by -o name (underscores), former names and `no_` forms included."""
    options: dict[str, Option] = {}
    for option in OPTIONS:
        if option.cli:
            names = [option.name, *option.renamed]
            if option.form == TRISTATE:
                names.append(f"no-{option.name}")
            options |= dict.fromkeys((name.replace("-", "_") for name in names), option)
    return options


def split_options(text: str) -> list[str]:
    """Comma-separated options; a double-quoted part may hold commas (libmount's rule)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [p for p in (part.strip() for part in parts) if p]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def translate(
    source: str, mountpoint: str, options: Sequence[str], sloppy: bool = False
) -> list[str]:
    """The pffs argv for a mount(8) call; UsageError for a bad option."""
    known = mount_options()
    head: list[str] = []
    args: list[str] = []
    for option in options:
        name, has_value, value = option.partition("=")
        value = _unquote(value)
        key = name.replace("-", "_")
        if option in IGNORED or option.startswith(IGNORED_PREFIXES):
            continue
        if option == "ro":
            args.append("--read-only")
        elif option == "debug":
            head.append("--debug")
        elif option in REFUSED:
            if not sloppy:
                raise UsageError(f"option {option!r} is not supported by pffs")
        elif key in known:
            flag = f"--{key.replace('_', '-')}"
            takes_value = known[key].takes_value
            if takes_value and not has_value:
                raise UsageError(f"option {name!r} needs a value: {name}=VALUE")
            if not takes_value and has_value:
                raise UsageError(f"option {name!r} takes no value")
            args += [flag, value] if takes_value else [flag]
        elif not sloppy:
            names = ", ".join(sorted(known))
            raise UsageError(f"unknown option {name!r} (pffs mount options: {names})")
    target = [source] if "://" in source else ["--config", source]
    return [*head, "mount", *target, mountpoint, *args]


class _HelperParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _HelperParser(prog="mount.pffs", add_help=False)
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("-o", dest="options", action="append", default=[])
    parser.add_argument("-t", dest="type", default="fuse.pffs")
    parser.add_argument("-s", dest="sloppy", action="store_true")
    parser.add_argument("-f", dest="fake", action="store_true")
    parser.add_argument("-n", dest="no_mtab", action="store_true")  # no mtab: nothing to skip
    parser.add_argument("-v", dest="verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """mount(8)'s call: `mount.pffs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        if args.type not in HELPER_TYPES:
            raise UsageError(f"-t {args.type}: this helper mounts {' or '.join(HELPER_TYPES)}")
        options = [opt for text in args.options for opt in split_options(text)]
        pffs_argv = translate(args.source, args.mountpoint, options, args.sloppy)
    except UsageError as exc:
        sys.stderr.write(f"mount.pffs: {exc}\n")
        return EXIT_USAGE
    if args.verbose or args.fake:
        print("mount.pffs: pffs " + " ".join(pffs_argv), flush=True)
    if args.fake:
        return 0
    # mount helpers are quiet on success; pffs's "mounted at" line is shown with -v only.
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = commands.run(pffs_argv)
    if args.verbose:
        sys.stdout.write(said.getvalue())
    if code == 0:
        return 0
    return EXIT_USAGE if code == UsageError.exit_code else EXIT_MOUNT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())

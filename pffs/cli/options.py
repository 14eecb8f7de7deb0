"""`pffs`'s argv: the parser of every command and the configs built from its answers.

Only front ends read argv; this module turns it into the frozen dataclasses of pffs.config,
each filled by the option table (`pffs.optiontable.build`: every row names its field), so
this module writes only what several options make together and the checks across options.
A value's own range and form are its parser's (pffs.optionvalues): argparse refuses it.
A usage error is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import NoReturn

from pffs.cli import argtypes
from pffs.cli.groupoptions import group_config, shared_cache_config
from pffs.config import (
    CacheConfig,
    FuseConfig,
    MetaConfig,
    MountConfig,
    ObserveConfig,
    OrderLimits,
    PreloadConfig,
    RetryConfig,
    SourceConfig,
    TableEntry,
    default_cache_dir,
    memory_holds_blocks,
)
from pffs.credentials import Credentials, parse_credentials
from pffs.errors import UsageError
from pffs.optiontable import build
from pffs.version import __version__

# A credentials file of a few profiles is a few KiB.
MAX_CREDENTIALS_FILE = 1 << 20


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"pffs: {message} (see {self.prog} --help)\n")
        raise SystemExit(UsageError.exit_code)


def metadata_config(args: argparse.Namespace) -> MetaConfig:
    """The TTLs: each option given, else `--metadata-ttl`, else the default (the table's order)."""
    return build(MetaConfig, vars(args))


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    for section in ("s3", "retry", "hdfs"):
        argtypes.add_section(parser, section)


def preload_config(args: argparse.Namespace) -> PreloadConfig:
    given = vars(args)
    return build(PreloadConfig, given, orders=build(OrderLimits, given))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pffs", description="A caching filesystem for AI data on S3 and HDFS.")
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--version", action="version", version=f"pffs {__version__}")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="{mount,umount,stats,warmup,preload,cache,demo,fluid,csi,scheduler-extender,affinity}",
    )

    mount = commands.add_parser(
        "mount",
        help="mount a source, or a mount table of several",
        description="Mount SOURCE at MOUNTPOINT, or the sources of a mount table file "
        "(--config pffs.toml) as one tree.",
    )
    mount.add_argument(
        "source", nargs="?", help="s3://bucket[/prefix], hdfs://namenode[:port]/path, file:///dir"
    )
    mount.add_argument("mountpoint", help="an empty directory (or a dead pffs mount)")
    mount.add_argument(
        "--config",
        help="mount table file: [[mount]] entries of path, source and options (see docs/USAGE.md)",
    )
    _add_source_options(mount)
    argtypes.add_section(mount, "cache")
    argtypes.add_section(mount, "preload")
    opts = argtypes.add_section(mount, "mount")
    opts.add_argument("-f", "--foreground", action="store_true", help="serve in this process")
    argtypes.add_section(mount, "observe")
    argtypes.add_section(mount, "meta")
    argtypes.add_section(mount, "group")
    argtypes.add_section(mount, "shared")

    umount = commands.add_parser("umount", help="unmount", description="Unmount a pffs mount.")
    umount.add_argument("mountpoint")
    umount.add_argument("-l", "--lazy", action="store_true", help="detach now, finish when idle")
    from pffs.cli.stats_view import add_parser as add_stats_parser

    add_stats_parser(commands)

    warmup = commands.add_parser(
        "warmup",
        help="fill the disk cache ahead of a job",
        description="Fill the disk cache with PATHs: directories or files inside a pffs mount "
        "(its own cache settings are used; a mount served elsewhere, such as a Fluid or CSI "
        "pod's volume, is read through), or source URLs with the cache options given here.",
    )
    warmup.add_argument("paths", nargs="*", help="paths in a pffs mount, or s3://, file:// URLs")
    warmup.add_argument("--list", dest="list_file", help="read more paths from FILE, one a line")
    warmup.add_argument(
        "-j", "--jobs", type=argtypes.positive_int, default=16, help="parallel blocks (16)"
    )
    warmup.add_argument("--quiet", action="store_true", help="no progress bar, just the summary")
    _add_source_options(warmup)
    argtypes.add_section(warmup, "cache")

    preload = commands.add_parser(
        "preload",
        help="hand a job's read order to a mount",
        description="Hand the paths in FILE (one a line, relative to the mount root or "
        "absolute under it) to the pffs mount at MOUNTPOINT, which loads them in that order "
        "ahead of the readers. Bad entries are printed, one a line, and the rest proceeds.",
    )
    # `pffs prefetch`, its former name, still works (with a notice; not in the help).
    for order_parser in (preload, commands.add_parser("prefetch")):
        order_parser.add_argument(
            "--order", required=True, metavar="FILE", help="the paths in read order ('-': stdin)"
        )
        order_parser.add_argument("mountpoint", help="the root of a pffs mount")

    cache = commands.add_parser("cache", help="inspect or clear the disk cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--cache-dir", default=default_cache_dir())
    cache.add_argument("--source", help="clear only this source's blocks (its source id)")

    demo = commands.add_parser("demo", help="mount a generated dataset from an in-process S3")
    demo.add_argument("--files", type=argtypes.positive_int, default=200, help="small files (200)")
    demo.add_argument(
        "--large-mib", type=argtypes.positive_int, default=16, help="large file MiB (16)"
    )

    fluid = commands.add_parser(
        "fluid",
        help="serve a Fluid ThinRuntime's mount (its FUSE container's command)",
        description="Mount a Fluid Dataset's mounts as one tree at Fluid's target path, as "
        "Fluid's config file describes them, and serve in the foreground until SIGTERM. Exits "
        "with 9 when the config changes, so that the container restarts with the new mounts.",
    )
    fluid.add_argument(
        "--config",
        help="Fluid's config file (default: /etc/fluid/config/config.json, else "
        "/etc/fluid/config.json)",
    )
    fluid.add_argument(
        "--check",
        action="store_true",
        help="liveness probe: exit 0 when the mount at the target path is live, 1 if not",
    )
    fluid.add_argument(
        "--watch-interval",
        type=argtypes.positive_seconds,
        default=5.0,  # Kubernetes takes up to a minute to update a mounted ConfigMap anyway
        help="seconds between looks at the config file for changes (5)",
    )
    _add_fluid_policy(fluid)

    _add_affinity_commands(commands)
    from pffs.csi.server import add_parser as add_csi_parser  # no grpc import until it runs

    add_csi_parser(commands)

    commands.add_parser("_daemon")  # internal: the background half of `pffs mount`
    return parser


def _add_fluid_policy(fluid: argparse.ArgumentParser) -> None:
    """The profile's settings (pffs.cli.fluidpolicy): only its author writes this command line."""
    policy = fluid.add_argument_group(
        "the profile's settings (a Dataset or ThinRuntime may set only data options)"
    )
    policy.add_argument(
        "--options",
        action="append",
        default=[],
        metavar="K=V,K,...",
        help="the mount's options: any `pffs mount` option without the dashes (cache-dir, "
        "cache-size, cache-memory, metrics, uid, log-file, ...)",
    )
    policy.add_argument(
        "--allow-local",
        action="append",
        default=[],
        metavar="DIR",
        help="let Datasets mount local:// and file:// directories under DIR (none)",
    )
    policy.add_argument(
        "--allow-node-credentials",
        action="store_true",
        help="let Datasets mount without keys of their own: S3 by the container's credential "
        "chain (the node's role), a named profile, HDFS without a ticket cache in the secrets",
    )
    policy.add_argument(
        "--allow-option",
        action="append",
        default=[],
        metavar="KEY",
        help="let Datasets and ThinRuntimes set this whole-mount option too",
    )
    policy.add_argument(
        "--secrets-dir",
        default="/etc/fluid/secrets",
        metavar="DIR",
        help="the only place secret files are read from (/etc/fluid/secrets)",
    )


def _add_affinity_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Data-affinity scheduling (csi/affinity/extender.py, csi/affinity/manifest.py)."""
    ext = commands.add_parser(
        "scheduler-extender",
        help="serve the kube-scheduler extender that favours nodes caching a pod's data",
    )
    ext.add_argument(
        "--listen",
        required=True,
        help="HOST:PORT to serve on (:PORT is 127.0.0.1; every interface is 0.0.0.0:PORT)",
    )
    ext.add_argument("--api", help="Kubernetes API URL (default: in-cluster service account)")
    ext.add_argument("--mode", choices=["prefer", "require"], default="prefer")
    ext.add_argument("--url-prefix", default="", help="path before /filter and /prioritize")
    aff = commands.add_parser(
        "affinity", help="print a pod/job manifest with node affinity for nodes caching its data"
    )
    aff.add_argument("manifest", help="YAML or JSON file, - for stdin")
    aff.add_argument("--required", action="store_true", help="require instead of prefer")
    aff.add_argument("--api", help="Kubernetes API URL (default: in-cluster service account)")
    aff.add_argument("-n", "--namespace", help="namespace of PVCs when the manifest has none")


def observe_config(args: argparse.Namespace) -> ObserveConfig:
    level = args.log_level or ("debug" if args.debug else "info")
    return build(ObserveConfig, vars(args), log_level=level)


def source_config(args: argparse.Namespace, url: str, read_only: bool = False) -> SourceConfig:
    credentials = read_credentials_file(args.credentials_file, args.profile)
    return build(
        SourceConfig,
        vars(args),
        url=url,
        # With a credentials file, the profile names its section, not a profile of ~/.aws.
        profile=None if credentials else args.profile,
        credentials=credentials,
        read_only=read_only,
        retry=retry_config(args),
    )


def read_credentials_file(path: str | None, section: str | None) -> Credentials | None:
    """The keys in the credentials file at `path` (pffs.credentials), as values."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(f"--credentials-file {path} is not a regular file")
            data = f.read(MAX_CREDENTIALS_FILE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read the credentials file {path}: {exc.strerror}") from None
    if len(data) > MAX_CREDENTIALS_FILE:
        raise UsageError(f"the credentials file {path} is too large for one")
    return parse_credentials(data.decode("utf-8", errors="replace"), path, section)


def retry_config(args: argparse.Namespace) -> RetryConfig:
    if args.retry_timeout < args.request_timeout:
        # One attempt may take the whole request timeout: a shorter bound would never retry.
        raise UsageError(
            f"--retry-timeout ({args.retry_timeout:g}s) must be at least --request-timeout "
            f"({args.request_timeout:g}s)"
        )
    return build(RetryConfig, vars(args))


def cache_config(args: argparse.Namespace) -> CacheConfig:
    if not memory_holds_blocks(args.cache_memory, args.block_size):
        raise UsageError("--cache-memory must hold at least two blocks")
    return build(CacheConfig, vars(args))


def mount_config(args: argparse.Namespace) -> MountConfig:
    if args.config and args.source:
        raise UsageError("give a SOURCE or --config FILE, not both")
    if args.config:
        from pffs.routing.tablefile import load_table_file

        defaults = source_config(args, "", args.read_only)
        table = load_table_file(args.config, defaults)
        name = os.path.abspath(args.config)
    elif args.source:
        from pffs.backends import scheme_of

        scheme_of(args.source)  # an unknown scheme fails here, before a daemon starts
        table = (TableEntry("", source_config(args, args.source, args.read_only)),)
        name = args.source
    else:
        raise UsageError("nothing to mount: give a SOURCE URL or --config FILE")
    return table_mount_config(args, table, name)


def table_mount_config(
    args: argparse.Namespace, table: tuple[TableEntry, ...], name: str
) -> MountConfig:
    """The mount of `table` with the mount options in `args` (`pffs mount`, `pffs fluid`)."""
    return build(
        MountConfig,
        vars(args),
        table=table,
        fuse=build(FuseConfig, vars(args), mountpoint=os.path.abspath(args.mountpoint)),
        meta=metadata_config(args),
        cache=cache_config(args),
        name=name,
        observe=observe_config(args),
        dataset=preload_config(args),
        group=group_config(args),
        shared_cache=shared_cache_config(args),
    )

"""The commands of `pffs`: each takes parsed arguments and returns an exit code.

Every failure the user can cause ends as one line on stderr ("pffs: ...") and the exit code of
its error class (pffs.errors); a traceback is printed only with --debug.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pffs.cli.argtypes import renamed
from pffs.cli.options import build_parser, cache_config, mount_config, source_config
from pffs.config import from_json
from pffs.errors import MountFailed, PffsError, UsageError

log = logging.getLogger("pffs")


def setup_logging(
    debug: bool, log_file: str | None = None, level: str | None = None, stdio: bool = False
) -> None:
    """Log to `log_file` (rotated, reopened on SIGHUP: pffs.logfile; with `stdio`, stdout and
    stderr go to it too), else to stderr."""
    from pffs.logs import LineFormatter, level_of

    handler: logging.Handler
    if log_file:
        from pffs.logfile import PrivateLogFile

        try:  # never through another user's symlink (pffs.privatefiles)
            handler = PrivateLogFile(log_file, stdio=stdio)
        except OSError as exc:
            raise UsageError(f"cannot open the log file {log_file}: {exc.strerror}") from None
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter())  # one line per event, credentials masked
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_of(level) if level else logging.DEBUG if debug else logging.INFO)
    # boto's own debug output is a flood and can include request headers; keep it out.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_mount(args: argparse.Namespace) -> int:
    from pffs.mounting.daemon import start_daemon
    from pffs.mounting.serving import serve_here

    config = mount_config(args)
    if args.foreground:
        setup_logging(args.debug, config.log_file, config.observe.log_level)
        serve_here(config)
        return 0
    pid, log_path = start_daemon(config)
    print(f"pffs: {config.name} mounted at {config.fuse.mountpoint} (pid {pid}, log {log_path})")
    return 0


def cmd_daemon() -> int:
    """The background half of `pffs mount`: config on stdin, readiness on PFFS_READY_FD."""
    from pffs.mounting.daemon import report_to_parent
    from pffs.mounting.registry import default_log_path
    from pffs.mounting.serving import serve_here

    config = from_json(sys.stdin.read())
    # The log file `pffs mount` opened as stdout and stderr, opened again here by its path so
    # that it rotates (pffs.logfile), stdout and stderr following it.
    log_file = config.log_file or default_log_path(config.fuse.mountpoint)
    setup_logging(config.debug, log_file, config.observe.log_level, stdio=True)
    try:
        serve_here(config, on_ready=lambda: report_to_parent("ok"))
    except PffsError as exc:
        log.error("%s", exc)
        report_to_parent(f"{exc.exit_code} {exc}")
        return exc.exit_code
    except BaseException as exc:
        log.exception("daemon failed")
        report_to_parent(f"{MountFailed.exit_code} unexpected error: {type(exc).__name__}: {exc}")
        raise
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    from pffs.cli.warmup import resolve_targets, run_warmup

    os.umask(
        0o077
    )  # cache blocks are the user's data, as in a mount (pffs.mounting.serving.serve_here)
    items = list(args.paths)
    if args.list_file:
        try:
            with open(args.list_file, encoding="utf-8") as f:
                items += [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise UsageError(f"cannot read the list {args.list_file}: {exc.strerror}") from None
    if not items:
        raise UsageError("nothing to warm up: give paths, URLs or --list FILE")
    targets = resolve_targets(items, lambda url: source_config(args, url), cache_config(args))
    return run_warmup(targets, args.jobs, args.quiet)


def cmd_preload(args: argparse.Namespace) -> int:
    """`pffs preload --order FILE MOUNTPOINT`: bad entries to stderr, non-zero if any."""
    from pffs.jobs import NotAMount, preload_order

    try:
        if args.order == "-":
            paths = [line for line in sys.stdin.read().splitlines() if line.strip()]
        else:
            with open(args.order, encoding="utf-8") as f:
                paths = [line for line in f.read().splitlines() if line.strip()]
    except OSError as exc:
        raise UsageError(f"cannot read the order list {args.order}: {exc.strerror}") from None
    try:
        bad = preload_order(args.mountpoint, paths)
    except NotAMount as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{args.mountpoint}: cannot hand the list over: {exc.strerror}") from None
    for line in bad:
        print(line, file=sys.stderr)
    print(f"preload: {len(paths) - len(bad)} files queued, {len(bad)} bad entries")
    return 1 if bad else 0


def cmd_umount(args: argparse.Namespace) -> int:
    from pffs.errors import MountpointError
    from pffs.mounting.kernel import find_mount, fusermount

    path = os.path.abspath(args.mountpoint)
    entry = find_mount(path)
    if entry is None or not entry.fstype.startswith("fuse"):
        raise MountpointError(f"{path} is not mounted")
    fusermount(path, lazy=args.lazy)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (a pffs command line) and run its command."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "mount":
            return cmd_mount(args)
        if args.command == "umount":
            return cmd_umount(args)
        if args.command == "stats":
            from pffs.cli.stats_view import run as run_stats

            return run_stats(args)
        if args.command == "warmup":
            return cmd_warmup(args)
        if args.command in ("preload", "prefetch"):
            if args.command == "prefetch":
                renamed("pffs prefetch", "pffs preload")
            return cmd_preload(args)
        if args.command == "cache":
            from pffs.cli.cacheadmin import cache_admin

            return cache_admin(args.cache_dir, args.action, args.source)
        if args.command == "demo":
            from pffs.cli.demo import run_demo

            return run_demo(files=args.files, large_mib=args.large_mib)
        if args.command == "fluid":
            from pffs.cli.fluid import run as run_fluid

            return run_fluid(args, setup_logging)
        if args.command == "scheduler-extender":
            from pffs.csi.affinity.extender import run as run_extender

            setup_logging(args.debug)
            return run_extender(args.listen, args.api, args.mode, args.url_prefix)
        if args.command == "affinity":
            from pffs.csi.affinity.manifest import run as run_affinity

            return run_affinity(args.manifest, args.required, args.api, args.namespace)
        if args.command == "_daemon":
            return cmd_daemon()
        if args.command == "csi":
            from pffs.csi.server import run as run_csi

            setup_logging(args.debug)
            return run_csi(args)
        raise UsageError(f"unknown command {args.command}")
    except PffsError as exc:
        if args.debug:
            log.exception("failed")
        sys.stderr.write(f"pffs: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130

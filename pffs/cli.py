"""The `pffs` command: parse argv and environment, build a MountConfig, call pffs.mount.

Every failure the user can cause ends as one line on stderr ("pffs: ...") and the exit code of
its error class (pffs.errors); a traceback is printed only with --debug.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pffs.config import FuseConfig, MetaConfig, MountConfig, SourceConfig, from_json
from pffs.errors import PffsError, UsageError

log = logging.getLogger("pffs")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"pffs: {message} (see {self.prog} --help)\n")
        raise SystemExit(UsageError.exit_code)


def _mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode like 644") from None
    if not 0 <= value <= 0o7777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 0 and 7777")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pffs", description="A caching filesystem for AI data on S3 and HDFS.")
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{mount,umount,demo}"
    )

    mount = commands.add_parser(
        "mount", help="mount a source", description="Mount SOURCE at MOUNTPOINT."
    )
    mount.add_argument("source", help="s3://bucket[/prefix] or file:///dir")
    mount.add_argument("mountpoint", help="an empty directory (or a dead pffs mount)")
    s3 = mount.add_argument_group("S3 (credentials come from boto3's chain: env, profile, files)")
    s3.add_argument("--endpoint-url", help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL)")
    s3.add_argument("--region", help="region (default: from the AWS config, else us-east-1)")
    s3.add_argument("--profile", help="named profile from ~/.aws")
    s3.add_argument(
        "--path-style",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="path-style addressing (default: on when an endpoint URL is set)",
    )
    s3.add_argument(
        "--max-concurrency", type=_positive_int, default=16, help="requests in flight (16)"
    )
    opts = mount.add_argument_group("mount")
    opts.add_argument("--read-only", action="store_true", help="refuse all writes")
    opts.add_argument("--uid", type=int, default=os.getuid(), help="owner of every entry")
    opts.add_argument("--gid", type=int, default=os.getgid(), help="group of every entry")
    opts.add_argument("--file-mode", type=_mode, default=0o644, help="octal mode of files (644)")
    opts.add_argument(
        "--dir-mode", type=_mode, default=0o755, help="octal mode of directories (755)"
    )
    opts.add_argument("--allow-other", action="store_true", help="let other users see the mount")
    opts.add_argument("-f", "--foreground", action="store_true", help="serve in this process")
    opts.add_argument("--log-file", help="daemon log (default: ~/.local/state/pffs/log/)")
    meta = mount.add_argument_group("metadata caching (seconds)")
    meta.add_argument("--attr-ttl", type=_seconds, default=MetaConfig.attr_ttl)
    meta.add_argument("--entry-ttl", type=_seconds, default=MetaConfig.entry_ttl)
    meta.add_argument("--dir-ttl", type=_seconds, default=MetaConfig.dir_ttl)
    meta.add_argument("--negative-ttl", type=_seconds, default=MetaConfig.negative_ttl)

    umount = commands.add_parser("umount", help="unmount", description="Unmount a pffs mount.")
    umount.add_argument("mountpoint")
    umount.add_argument("-l", "--lazy", action="store_true", help="detach now, finish when idle")

    demo = commands.add_parser("demo", help="mount a generated dataset from an in-process S3")
    demo.add_argument("--files", type=_positive_int, default=200, help="small files (200)")
    demo.add_argument("--large-mib", type=_positive_int, default=16, help="large file MiB (16)")

    commands.add_parser("_daemon")  # internal: the background half of `pffs mount`
    return parser


def mount_config(args: argparse.Namespace) -> MountConfig:
    source = SourceConfig(
        url=args.source,
        endpoint_url=args.endpoint_url,
        region=args.region,
        profile=args.profile,
        path_style=args.path_style,
        read_only=args.read_only,
        max_concurrency=args.max_concurrency,
    )
    fuse = FuseConfig(
        mountpoint=os.path.abspath(args.mountpoint),
        read_only=args.read_only,
        uid=args.uid,
        gid=args.gid,
        file_mode=args.file_mode,
        dir_mode=args.dir_mode,
        allow_other=args.allow_other,
    )
    meta = MetaConfig(
        attr_ttl=args.attr_ttl,
        entry_ttl=args.entry_ttl,
        dir_ttl=args.dir_ttl,
        negative_ttl=args.negative_ttl,
    )
    log_file = os.path.abspath(args.log_file) if args.log_file else None
    return MountConfig(source=source, fuse=fuse, meta=meta, log_file=log_file, debug=args.debug)


def setup_logging(debug: bool, log_file: str | None = None) -> None:
    handler: logging.Handler
    if log_file:
        os.makedirs(os.path.dirname(log_file) or ".", mode=0o700, exist_ok=True)
        handler = logging.FileHandler(log_file)
        os.chmod(log_file, 0o600)
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    # boto's own debug output is a flood and can include request headers; keep it out.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _check_source(url: str) -> None:
    """Fail early on a URL no backend can take, before anything starts."""
    from pffs.backends import scheme_of

    scheme_of(url)


def cmd_mount(args: argparse.Namespace) -> int:
    from pffs.mount import serve_here, start_daemon

    config = mount_config(args)
    _check_source(config.source.url)
    if args.foreground:
        setup_logging(args.debug, config.log_file)
        serve_here(config)
        return 0
    pid, log_path = start_daemon(config)
    print(
        f"pffs: {config.source.url} mounted at {config.fuse.mountpoint} (pid {pid}, log {log_path})"
    )
    return 0


def cmd_daemon() -> int:
    """The background half of `pffs mount`: config on stdin, readiness on PFFS_READY_FD."""
    from pffs.mount import report_to_parent, serve_here

    config = from_json(sys.stdin.read())
    setup_logging(config.debug)  # stderr is already the log file
    try:
        serve_here(config, on_ready=lambda: report_to_parent("ok"))
    except PffsError as exc:
        log.error("%s", exc)
        report_to_parent(f"{exc.exit_code} {exc}")
        return exc.exit_code
    except BaseException as exc:
        log.exception("daemon failed")
        report_to_parent(f"{7} unexpected error: {type(exc).__name__}: {exc}")
        raise
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from pffs.errors import MountpointError
    from pffs.mountpoint import find_mount, fusermount

    path = os.path.abspath(args.mountpoint)
    entry = find_mount(path)
    if entry is None or not entry.fstype.startswith("fuse"):
        raise MountpointError(f"{path} is not mounted")
    fusermount(path, lazy=args.lazy)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "mount":
            return cmd_mount(args)
        if args.command == "umount":
            return cmd_umount(args)
        if args.command == "demo":
            from pffs.demo import run_demo

            return run_demo(files=args.files, large_mib=args.large_mib)
        if args.command == "_daemon":
            return cmd_daemon()
        raise UsageError(f"unknown command {args.command}")
    except PffsError as exc:
        if args.debug:
            log.exception("failed")
        sys.stderr.write(f"pffs: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""The mount options, declared once: every front end derives its spelling and its parsing here.

Each `Option` names one setting of a mount (name, value parser, default, help, unit) and who
may set it:

- `scope`: "mount" for the whole mount, "source" for one source (a mount table entry, one of
  Fluid's mounts); a source option given for the whole mount is every source's default;
- `dataset`: whether the untrusted side of Fluid (a Dataset or ThinRuntime) may set this
  whole-mount option (pffs.cli.fluidpolicy); source options are checked one by one there.

The spellings, derived from `name` ("cache-size"):

    CLI flag            --cache-size                 (pffs.cli.options)
    mount(8) -o         cache_size                   (pffs.cli.mounthelper)
    Fluid option        cache-size                   (pffs.cli.fluidconfig)
    CSI attribute       `csi`, camelCase: cacheSize  (csi/params.py; only the options listed)
    pffs.toml key       `toml`, snake_case           (pffs.routing.tablefile; source options)

`fills` names the config fields the value fills (`CacheConfig.block_size`, pffs.config), and
`into` how the value becomes the field's when it is not the same; `build` makes a config from
parsed options by them, so a front end writes no field of its own but those made from several
options (the credentials a file and a profile name).

`renamed` keeps former names working everywhere a name is read, each with a notice. A value's
text is parsed by the option's `parse` (pffs.optionvalues), the same parser in every front end.
tests/unit/test_option_table.py walks this table through every front end.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pffs import optionvalues as values
from pffs.config import (
    CACHE_POLICIES,
    LOG_LEVELS,
    CacheConfig,
    FuseConfig,
    GroupConfig,
    MetaConfig,
    ObserveConfig,
    PreloadConfig,
    RetryConfig,
    SourceConfig,
    default_cache_dir,
)

Config = TypeVar("Config")

# How an option is written on a command line: with a value (`--cache-size 1G`), as a switch
# (`--read-only`), or as a switch with a `--no-` form that leaves "unset" as the default.
VALUE, SWITCH, TRISTATE = "value", "switch", "tristate"


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[str], object]
    # The value when not given; a callable is called each time (it depends on who runs pffs).
    default: object
    help: str
    section: str
    unit: str | None = None
    form: str = VALUE
    scope: str = "mount"
    dataset: bool = False
    csi: str | None = None
    toml: str | None = None
    # The type a pffs.toml value has (TOML is typed); the option's parser checks its range.
    toml_type: type = str
    renamed: tuple[str, ...] = ()
    # False: no flag of its own on the command line (a source's cache policy: pffs.toml only).
    cli: bool = True
    # The config fields the value fills, `Class.field` of pffs.config, space-separated.
    fills: str = ""
    # How the value becomes the field's (None: as it is).
    into: Callable[[Any], object] | None = None

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace, and the key of Fluid's `--allow-option`."""
        return self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def o_name(self) -> str:
        """mount(8)'s `-o` spelling."""
        return self.dest

    @property
    def metavar(self) -> str | None:
        """What the help shows for the value: the unit, else what its parser reads."""
        return self.unit or _UNITS.get(self.parse)

    @property
    def takes_value(self) -> bool:
        return self.form == VALUE

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(config class name, field name) of each field the value fills."""
        return tuple(
            (config, field)
            for config, _, field in (target.partition(".") for target in self.fills.split())
        )

    def fields_of(self, config: type) -> tuple[str, ...]:
        """The fields of `config` this option fills."""
        return tuple(field for name, field in self.fields if name == config.__name__)

    def default_value(self) -> object:
        return self.default() if callable(self.default) else self.default

    def argv(self, value: object) -> list[str]:
        """The command line that sets `value` (switches: only a true value has one)."""
        if self.form == SWITCH:
            return [self.flag] if value else []
        if self.form == TRISTATE:
            return [self.flag if value else f"--no-{self.name}"]
        if self.parse is values.boolean:
            return [self.flag, "on" if value else "off"]
        if isinstance(value, float) and value.is_integer():
            return [self.flag, str(int(value))]  # 300, not 300.0
        return [self.flag, str(value)]


_UNITS: dict[Callable[[str], object], str] = {
    values.size: "SIZE",
    values.block_size: "SIZE",
    values.positive_size: "SIZE",
    values.seconds: "SECONDS",
    values.positive_seconds: "SECONDS",
    values.metadata_ttl: "SECONDS",
    values.mode: "MODE",
}
_CACHE = CacheConfig(disk_dir=None)
_PRELOAD = PreloadConfig()
_SOURCE = SourceConfig(url="")


def _attempts(retries: int) -> int:
    """RetryConfig counts the first try among its attempts."""
    return retries + 1


def _disk_dir(text: str) -> str | None:
    """`none` is no disk tier; a relative directory is the caller's."""
    return None if text.lower() == "none" else os.path.abspath(text)


def _path(text: str) -> str:
    """A file named relative to the caller, as the daemon (its own process) finds it."""
    return os.path.abspath(text)


# One option a line or a few: the table reads better unwrapped by the formatter.
# fmt: off
OPTIONS: tuple[Option, ...] = (
    # S3 (whole-mount defaults of every source, and per source)
    Option("endpoint-url", values.text, None, "S3-compatible endpoint (default: "
           "$AWS_ENDPOINT_URL)", "s3", scope="source", csi="endpoint", toml="endpoint",
           fills="SourceConfig.endpoint_url"),
    Option("region", values.text, None, "region (default: from the AWS config, else us-east-1)",
           "s3", scope="source", csi="region", toml="region", fills="SourceConfig.region"),
    Option("profile", values.text, None, "named profile from ~/.aws (with --credentials-file: "
           "its section)", "s3", scope="source", toml="profile", fills="SourceConfig.profile"),
    Option("credentials-file", values.text, None, "the keys, read as values from FILE: "
           "aws_access_key_id, aws_secret_access_key and aws_session_token of its [default] "
           "section (or --profile's); nothing else in it is read or run", "s3", unit="FILE",
           fills="SourceConfig.credentials"),  # read by the front end: the file, and --profile
    Option("path-style", values.boolean, None, "path-style addressing (default: on when an "
           "endpoint URL is set)", "s3", form=TRISTATE, scope="source", toml="path_style",
           toml_type=bool, fills="SourceConfig.path_style"),
    Option("max-concurrency", values.positive_int, _SOURCE.max_concurrency, "readers' requests "
           f"in flight; loading ahead 4x as many ({_SOURCE.max_concurrency})", "s3", scope="source",
           toml="max_concurrency", toml_type=int, fills="SourceConfig.max_concurrency"),
    # retries and timeouts
    Option("retries", values.count_up_to(100), RetryConfig.attempts - 1, "retries of a failed "
           f"request after the first try ({RetryConfig.attempts - 1})", "retry", dataset=True,
           fills="RetryConfig.attempts", into=_attempts),
    Option("retry-timeout", values.positive_seconds, RetryConfig.total_timeout, "give up "
           "retrying a request after this many seconds, sleeps included "
           f"({RetryConfig.total_timeout:g})", "retry", dataset=True,
           fills="RetryConfig.total_timeout"),
    Option("request-timeout", values.positive_seconds, _SOURCE.read_timeout, "seconds one "
           f"request may wait for the store's next bytes ({_SOURCE.read_timeout:g})", "retry",
           dataset=True, fills="SourceConfig.read_timeout"),
    Option("connect-timeout", values.positive_seconds, _SOURCE.connect_timeout, "seconds to "
           f"open a connection ({_SOURCE.connect_timeout:g})", "retry", dataset=True,
           fills="SourceConfig.connect_timeout"),
    # HDFS
    Option("hdfs-user", values.text, None, "user to act as (default: login or Kerberos user)",
           "hdfs", scope="source", toml="user", fills="SourceConfig.hdfs_user"),
    Option("kerberos-ticket-cache", values.text, None, "Kerberos ticket cache path (kinit -c)",
           "hdfs", scope="source", toml="kerberos_ticket_cache",
           fills="SourceConfig.kerberos_ticket_cache"),
    Option("replication", values.whole_number, 0, "replication of written files (cluster's)",
           "hdfs", scope="source", toml="replication", toml_type=int,
           fills="SourceConfig.replication"),
    Option("buffer-size", values.size, 0, "I/O buffer size (client's default)", "hdfs",
           scope="source", toml="buffer_size", toml_type=int, fills="SourceConfig.buffer_size"),
    # block cache
    Option("cache", values.one_of(*CACHE_POLICIES), "disk", "disk, or memory: never write "
           "this source's blocks to disk", "cache", scope="source", toml="cache", cli=False,
           fills="TableEntry.cache"),
    Option("cache-dir", values.text, default_cache_dir, "disk tier directory, or 'none' for "
           "memory only (~/.cache/pffs)", "cache", fills="CacheConfig.disk_dir", into=_disk_dir),
    Option("cache-size", values.size, _CACHE.disk_bytes, "disk tier bound (100G)", "cache",
           csi="cacheSize", fills="CacheConfig.disk_bytes"),
    Option("cache-free-ratio", values.ratio, _CACHE.free_ratio, "keep this fraction of the disk "
           "free (0.1)", "cache", fills="CacheConfig.free_ratio"),
    Option("cache-memory", values.size, _CACHE.memory_bytes, "memory bound, blocks loaded ahead "
           "in flight included (512M)", "cache", csi="cacheMemory",
           fills="CacheConfig.memory_bytes"),
    Option("block-size", values.block_size, _CACHE.block_size, "cache block size (4M)", "cache",
           dataset=True, csi="blockSize", fills="CacheConfig.block_size"),
    Option("readahead-max", values.size, _CACHE.readahead_max, "readahead window per open file "
           "(more for a far store or a long file), 0 disables (32M)", "cache", dataset=True,
           csi="readaheadMax",
           renamed=("prefetch-max",), fills="CacheConfig.readahead_max"),
    # preload
    Option("preload", values.boolean, _PRELOAD.enabled, "load files ahead of readers: a "
           "directory's once a job reads a few of them, and order lists (on)", "preload",
           unit="on|off", dataset=True, csi="preload", renamed=("dataset-prefetch",),
           fills="PreloadConfig.enabled"),
    Option("preload-budget", values.positive_size, _PRELOAD.budget, "bytes of files preloaded "
           "in flight at most (64M)", "preload", dataset=True,
           renamed=("dataset-prefetch-budget",), fills="PreloadConfig.budget"),
    Option("order-timeout", values.positive_seconds, _PRELOAD.orders.seconds, "an order list "
           "sent to .pffs/preload.sock must arrive whole within this long of its connection, and "
           "its report be read within as long again (60)", "preload", unit="SECONDS",
           fills="OrderLimits.seconds"),
    # mount
    Option("read-only", values.boolean, False, "refuse all writes", "mount", form=SWITCH,
           dataset=True, csi="readOnly", toml="read_only", toml_type=bool,
           fills="FuseConfig.read_only SourceConfig.read_only"),
    Option("uid", values.any_id, os.getuid, "owner of every entry", "mount",
           fills="FuseConfig.uid"),
    Option("gid", values.any_id, os.getgid, "group of every entry", "mount",
           fills="FuseConfig.gid"),
    Option("file-mode", values.mode, 0o644, "octal mode of files (644)", "mount",
           fills="FuseConfig.file_mode"),
    Option("dir-mode", values.mode, 0o755, "octal mode of directories (755)", "mount",
           fills="FuseConfig.dir_mode"),
    Option("allow-other", values.boolean, False, "let other users see the mount", "mount",
           form=SWITCH, fills="FuseConfig.allow_other"),
    Option("kernel-readahead", values.size, FuseConfig.kernel_readahead, "kernel readahead of "
           "the mount, needs root (2M)", "mount", fills="FuseConfig.kernel_readahead"),
    Option("debug", values.boolean, False, "verbose logs and tracebacks", "mount", form=SWITCH,
           fills="MountConfig.debug"),
    Option("log-file", values.text, None, "daemon log (default: ~/.local/state/pffs/log/)",
           "mount", fills="MountConfig.log_file", into=_path),
    # observability
    Option("metrics", values.listen_address, None, "serve Prometheus metrics at HOST:PORT, e.g. "
           "127.0.0.1:9567; :PORT is 127.0.0.1, every interface is 0.0.0.0:PORT (off)",
           "observe", unit="ADDR", fills="ObserveConfig.metrics_address"),
    Option("slow-request", values.seconds, ObserveConfig.slow_request, "log store requests "
           "slower than this at WARNING (5)", "observe", unit="SECONDS",
           fills="ObserveConfig.slow_request"),
    Option("log-level", values.one_of(*LOG_LEVELS), None, "least severe level logged (info; "
           "debug with --debug)", "observe", unit="|".join(LOG_LEVELS),
           fills="ObserveConfig.log_level"),
    # metadata caching (a row fills its fields after the rows above it: attr-ttl given beats
    # metadata-ttl)
    Option("metadata-ttl", values.metadata_ttl, None, "the attribute, name and listing TTLs at "
           "once: seconds, or `indefinite` for a dataset that does not change while mounted "
           "(the three options below override it)", "meta", dataset=True,
           fills="MetaConfig.attr_ttl MetaConfig.entry_ttl MetaConfig.dir_ttl"),
    Option("attr-ttl", values.seconds, None, f"({MetaConfig.attr_ttl:g})", "meta", dataset=True,
           fills="MetaConfig.attr_ttl"),
    Option("entry-ttl", values.seconds, None, f"({MetaConfig.entry_ttl:g})", "meta",
           dataset=True, fills="MetaConfig.entry_ttl"),
    Option("dir-ttl", values.seconds, None, f"({MetaConfig.dir_ttl:g})", "meta", dataset=True,
           fills="MetaConfig.dir_ttl"),
    Option("negative-ttl", values.seconds, MetaConfig.negative_ttl, "", "meta", dataset=True,
           fills="MetaConfig.negative_ttl"),
    # cache group (checked whole by pffs.cli.groupoptions: they go together)
    Option("group-members", values.member_source, None, "the member list: file:///PATH (NAME "
           "http://HOST:PORT a line), k8s://NS/SERVICE or dns://NAME:PORT", "group",
           unit="SOURCE", fills="GroupConfig.members"),
    Option("group-listen", values.listen_address, None, "where peers reach this mount",
           "group", unit="HOST:PORT", fills="GroupConfig.listen"),
    Option("group-secret-file", values.text, None, "the group's shared secret", "group",
           unit="FILE", fills="GroupConfig.secret_file", into=_path),
    Option("group-principal-secret-file", values.text, None, "the secret that proves, to the "
           "group's peers, the principals with no static key of their own (a role, a web "
           "identity, anonymous, HDFS, local files) this mount reads as: given to the mounts "
           "that share them (without it their blocks are never asked of, nor served to, peers)",
           "group", unit="FILE", fills="GroupConfig.principal_secret_file", into=_path),
    Option("group-self", values.member_name, None, "this member's name (default: $NODE_NAME, "
           "else host name)", "group", unit="NAME", fills="GroupConfig.self_name"),
    Option("group-handover", values.handover_seconds, None, "after a membership change, how "
           "long a block's new owner asks its previous owner before the store (at most 86400; "
           f"0: never; {GroupConfig.handover:g})", "group", unit="SECONDS",
           fills="GroupConfig.handover"),
    # shared cache
    Option("shared-cache", values.s3_prefix, None, "where blocks go", "shared",
           unit="s3://BUCKET/PREFIX", fills="SharedCacheConfig.url"),
    Option("shared-cache-endpoint", values.text, None, "its S3 endpoint", "shared", unit="URL",
           fills="SharedCacheConfig.endpoint_url"),
    Option("shared-cache-profile", values.text, None, "its credentials profile", "shared",
           unit="NAME", fills="SharedCacheConfig.profile"),
    Option("shared-cache-secret-file", values.text, None, "the secret the mounts sharing the "
           "tier hold: each block object carries a MAC under it, and one without the right MAC "
           "is read from the origin instead (required with --shared-cache)", "shared",
           unit="FILE", fills="SharedCacheConfig.secret_file", into=_path),
)
# fmt: on

# The sections of the table, as `pffs mount --help` shows them.
SECTIONS = {
    "s3": "S3 (credentials: --credentials-file, else boto3's chain: env, profile, files)",
    "retry": "retries and timeouts (every source)",
    "hdfs": "HDFS (libhdfs through pyarrow; needs Java and Hadoop)",
    "cache": "block cache",
    "preload": "preload",
    "mount": "mount",
    "observe": "observability",
    "meta": "metadata caching (seconds)",
    "group": "cache group (mounts serving each other's blocks: each block from the store once)",
    "shared": "shared cache (a store near the compute holding blocks for every mount)",
}
BY_NAME = {option.name: option for option in OPTIONS}
# Former name -> the option it now is.
RENAMED = {old: option for option in OPTIONS for old in option.renamed}


def find(name: str) -> tuple[Option, bool] | None:
    """The option called `name` (or by a former name: then True), None for no option."""
    if name in BY_NAME:
        return BY_NAME[name], False
    if name in RENAMED:
        return RENAMED[name], True
    return None


def section(name: str) -> tuple[Option, ...]:
    return tuple(option for option in OPTIONS if option.section == name)


def defaults() -> dict[str, object]:
    """{dest: default} of every option: what a command line that gives none of them means."""
    return {option.dest: option.default_value() for option in OPTIONS}


def build(config: type[Config], given: Mapping[str, object], **fixed: object) -> Config:
    """A `config` (a pffs.config class) with the fields `fixed` and, for every other field,
    the value of the option that fills it in `given` ({dest: value}, as a parsed command line
    or Fluid's options): rows in table order, a later row's value replacing an earlier one's;
    an option whose value is None, or absent, leaves the field to `config`'s default."""
    fields: dict[str, object] = {}
    for option in OPTIONS:
        value = given.get(option.dest)
        for field in option.fields_of(config):
            if field not in fixed and value is not None:
                fields[field] = value if option.into is None else option.into(value)
    return config(**fields, **fixed)


def argtype(parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse` as an argparse type: its one-line complaint becomes argparse's."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except values.BadValue as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def add_argument(group: Any, option: Option, **overrides: Any) -> None:
    """`option` as an argument of an argparse parser or group (`pffs mount`'s, the CSI
    driver's), its flag, parser, default, unit and help the table's; `overrides` replace
    argparse settings (another default)."""
    kwargs: dict[str, Any] = {"help": option.help or None, "default": option.default_value()}
    if option.form == SWITCH:
        kwargs["action"] = "store_true"
    elif option.form == TRISTATE:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = argtype(option.parse)
        if option.metavar:
            kwargs["metavar"] = option.metavar
    group.add_argument(option.flag, **kwargs | overrides)


def camel(name: str) -> str:
    """A dashed name in camelCase, as Kubernetes attributes are written."""
    first, *rest = name.split("-")
    return first + "".join(part.title() for part in rest)

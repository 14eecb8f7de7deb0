"""Configuration: one frozen dataclass per layer, composed into MountConfig.

Only front ends (cli.py, csi/, bench/) read argv, environment or files; they build these
objects and hand them down. Every field has a default and a comment saying why.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from pffs.credentials import Credentials


@dataclass(frozen=True)
class RetryConfig:
    """How a backend retries transient failures (see pffs.retry)."""

    # Five attempts ride out a short throttling burst without making a dead store look alive.
    attempts: int = 5
    # First backoff; doubled each attempt, with full jitter so many readers do not retry in step.
    base_delay: float = 0.1
    # Cap on one sleep, so a long outage is retried at a steady pace rather than ever slower.
    max_delay: float = 5.0
    # Bound on the whole call including sleeps: a reader gets EIO after this, never a hang.
    total_timeout: float = 60.0


@dataclass(frozen=True)
class SourceConfig:
    """One store to mount: its URL and how to reach it."""

    url: str
    # S3: a non-AWS endpoint (moto, MinIO, s3rver, Ceph...). Also read from AWS_ENDPOINT_URL.
    endpoint_url: str | None = None
    # S3: None lets boto3's chain decide (AWS_REGION, profile); us-east-1 is used as a last resort.
    region: str | None = None
    # S3: named profile from ~/.aws; None means boto3's default chain (env, profile, config files).
    profile: str | None = None
    # S3: the keys as values (pffs.credentials), given to the boto3 session as arguments; None
    # leaves them to the profile or the default chain. Never in a repr, nor in a recorded config.
    credentials: Credentials | None = field(default=None, repr=False)
    # S3: path-style addressing. None means "path style when a custom endpoint is set", which is
    # what self-hosted stores need and what AWS still accepts.
    path_style: bool | None = None
    # Refuse writes even where the store would accept them.
    read_only: bool = False
    # Requests in flight to this store at once (threads). 16 fills a 10 Gbit link with 4 MiB GETs
    # without drowning a small self-hosted server.
    max_concurrency: int = 16
    # Seconds to open a connection and to wait for bytes; a stalled store then fails into retries.
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    # HDFS: the user to act as (None: the login user, or the Kerberos principal).
    hdfs_user: str | None = None
    # HDFS: a Kerberos ticket cache (as from kinit -c); None uses the default cache if secured.
    kerberos_ticket_cache: str | None = None
    # HDFS: replication of files pffs writes; 0 keeps libhdfs's default (3).
    replication: int = 0
    # HDFS: read/write buffer size in bytes; 0 keeps the client's default (io.file.buffer.size).
    buffer_size: int = 0


# Per-entry block cache policies: "disk" keeps blocks in memory and on disk; "memory" never
# writes them to disk (one-pass or sensitive data that should not fill the disk tier).
CACHE_POLICIES = ("disk", "memory")


@dataclass(frozen=True)
class TableEntry:
    """One source shown at `path` in the tree ("" is the root; no leading or trailing slash)."""

    path: str
    source: SourceConfig
    cache: str = "disk"


@dataclass(frozen=True)
class MetaConfig:
    """Metadata caching: how long names and attributes are trusted without asking the store."""

    # 60 s, as mountpoint-s3 with a cache (`--cache` makes its `--metadata-ttl` 60 s) and
    # gcsfuse's stat cache: a dataset is read many times and rarely changes under a job, and
    # every expired name costs a FUSE lookup in Python, mostly pyfuse3 and trio alone, where
    # the kernel answers in microseconds. The price, in docs/SEMANTICS.md: a change made
    # elsewhere is seen within a minute; until then reads serve the old version whole or fail
    # with ESTALE, never a mix. Changes made through the mount show at once.
    attr_ttl: float = 60.0
    entry_ttl: float = 60.0
    # A directory listing is reused this long (its entries answer lookups and opens).
    dir_ttl: float = 60.0
    # "No such file" is remembered this long; short so a file created elsewhere shows up soon.
    negative_ttl: float = 1.0


# `--metadata-ttl indefinite`: a TTL no mount outlives, for a dataset that does not change while
# it is mounted (mountpoint-s3's `--metadata-ttl indefinite`). Finite, as the kernel takes it.
INDEFINITE_TTL = 10 * 365 * 86400.0


@dataclass(frozen=True)
class FuseConfig:
    """How the tree is presented to the kernel."""

    mountpoint: str
    read_only: bool = False
    # Owner and modes shown for every entry: object stores have none. Default: whoever mounts.
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    file_mode: int = 0o644
    dir_mode: int = 0o755
    # Let other users see the mount (needs user_allow_other in /etc/fuse.conf for non-root).
    allow_other: bool = False
    # Concurrent FUSE requests served; reads wait on the network, so many are useful.
    max_tasks: int = 64
    # Kernel readahead for the mount (set through sysfs, needs root). 2 MiB lets the kernel send
    # 1 MiB requests two at a time instead of 128 KiB ones in turn: much faster reads. It is
    # also a mapped file's read-around per page fault, all fetched: 4 MiB fetched a lazy loader
    # half as much again, and read whole files no faster (docs/notes/lazy-checkpoint.md).
    kernel_readahead: int = 2 << 20


def default_cache_dir() -> str:
    """Per user, under XDG_CACHE_HOME (~/.cache): survives reboots, never shared between users."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "pffs")


MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class CacheConfig:
    """The block cache: memory tier, disk tier and readahead."""

    # 4 MiB like JuiceFS: large enough that a GET's latency is amortised, small enough that a
    # random 4 KiB read does not pull much more than it needs.
    block_size: int = 4 * MIB
    # Everything the cache holds in memory, blocks loaded ahead in flight included.
    memory_bytes: int = 512 * MIB
    # The disk tier's directory; None disables it (memory only).
    disk_dir: str | None = field(default_factory=default_cache_dir)
    # Bound on the disk tier (JuiceFS uses 100 GiB); the free-space floor below also applies.
    disk_bytes: int = 100 * GIB
    # Stop adding to the disk tier when the file system has less than this fraction free.
    free_ratio: float = 0.1
    # Readahead window of one open file; it starts at one block and doubles up to this, or up
    # to more when its read rate x request time asks for more (a far store: pffs.cache.window).
    # 8 blocks like JuiceFS: on a small machine a wider window only adds threads contending
    # (docs/notes/parallel-reads.md). A file of at least the largest window starts at that one.
    readahead_max: int = 32 * MIB
    # Largest store request of a load ahead: consecutive blocks are fetched together, one GET for
    # up to this many bytes. Per request, the client and the server spend as much CPU as on
    # megabytes of data, so fewer, larger requests make a cold read faster, and runs give that
    # without making random reads fetch a whole run (docs/notes/cold-and-warm-reads.md).
    fetch_size: int = 16 * MIB
    # Bytes loaded ahead (readahead and preload) in flight across all files: bounds memory and
    # the store's load.
    ahead_budget: int = 128 * MIB
    # Threads reading and writing the disk tier at once (checksums and lz4 run there too).
    disk_threads: int = 8
    # lz4 for blocks that compress (text, JSON, CSV); incompressible blocks are stored raw.
    compress: bool = True


def memory_holds_blocks(memory_bytes: int, block_size: int) -> bool:
    """Whether a memory bound leaves a reader its block and the next one loading: the one check
    across two cache options, made by every front end before anything starts."""
    return memory_bytes >= 2 * block_size


@dataclass(frozen=True)
class OrderLimits:
    """The caps of the order channel (`.pffs/preload` and its socket): anyone who can reach the
    mount can send a list, so what one list may cost the mount's process is bounded
    (pffs.fs.orders). pffs.jobs splits a longer order into lists within them."""

    # Bytes and lines of one list: 64 Ki paths of 64 bytes; a list over either is refused.
    max_bytes: int = 4 * MIB
    max_lines: int = 64 * 1024
    # Entries the directories one list names may hold in all (each is listed to find its
    # files): an ImageNet train set (1.28 million in 1,000 directories) fits three times.
    max_listed: int = 4 * 1024 * 1024
    # Lists being received at once (socket connections and preload-file handles open for
    # writing, each): beyond it a new one is refused. With `max_bytes`, the memory all take.
    connections: int = 8
    # A connection has this long, from its accept, to send its whole list, and as long again
    # to read its report; then it is cut off however slowly it trickles.
    seconds: float = 60.0


@dataclass(frozen=True)
class PreloadConfig:
    """Preload: a directory a job starts consuming, or a job's order list, is loaded ahead
    (pffs.fs.datasets)."""

    # On by default: a first epoch otherwise waits one store round trip per file.
    enabled: bool = True
    # Distinct files of one directory opened within the window that make it a dataset: a
    # training job opens thousands in seconds, `cat a b` or an editor opens one or two.
    trigger_files: int = 3
    trigger_window: float = 10.0
    # Bytes of files preloaded in flight at most (also capped at half the mount's budget of
    # bytes ahead, so readahead keeps the other half: pffs.flow.budget).
    budget: int = 64 * MIB
    # Files loaded at once at most; fewer while the sources' flows give preload fewer permits
    # (pffs.flow.permits decides how many requests reach a store).
    concurrency: int = 64
    # A dataset no reader touched for this long stops being loaded (the job ended or moved on).
    idle_after: float = 30.0
    orders: OrderLimits = OrderLimits()


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ObserveConfig:
    """Metrics and logs of a mount (see pffs.metrics and pffs.mounting.observe)."""

    # HOST:PORT of the Prometheus endpoint; None serves none (the .pffs/stats file is always on).
    metrics_address: str | None = None
    # A store request slower than this many seconds is logged at WARNING with its timing. 5 s is
    # far above a healthy 4 MiB GET and far below the minute a reader waits before EIO.
    slow_request: float = 5.0
    # Least severe level logged ("debug", "info", "warning", "error"); --debug means "debug".
    log_level: str = "info"


@dataclass(frozen=True)
class MembersFile:
    """`file:///PATH`: a file of `NAME http://HOST:PORT` lines, re-read when it changes."""

    path: str
    kind: str = field(default="file", init=False)

    def __str__(self) -> str:
        return f"file://{self.path}"


@dataclass(frozen=True)
class MembersKube:
    """`k8s://NAMESPACE/SERVICE`: the EndpointSlices of a headless Service."""

    namespace: str
    service: str
    kind: str = field(default="k8s", init=False)

    def __str__(self) -> str:
        return f"k8s://{self.namespace}/{self.service}"


@dataclass(frozen=True)
class MembersDns:
    """`dns://NAME:PORT`: the addresses a name resolves to, each a member at PORT."""

    name: str
    port: int
    kind: str = field(default="dns", init=False)

    def __str__(self) -> str:
        return f"dns://{self.name}:{self.port}"


# Where a group's member list comes from, parsed once from its URL (pffs.optionvalues
# .member_source); `str()` gives the URL back.
MemberSource = MembersFile | MembersKube | MembersDns
MEMBER_SOURCES: dict[str, type[MemberSource]] = {
    "file": MembersFile,
    "k8s": MembersKube,
    "dns": MembersDns,
}


@dataclass(frozen=True)
class GroupConfig:
    """A cache group this mount joins (pffs.group): where the member list comes from, the
    address its peer server listens on, the file holding the shared secret, and this member's
    name in the list. `kube_api` is the Kubernetes API's URL for `k8s://` outside a pod
    (`kubectl proxy`); None: the pod's service account."""

    members: MemberSource
    listen: str
    secret_file: str
    self_name: str
    kube_api: str | None = None
    # Seconds after a membership change a new owner asks a block's previous owner before the
    # store (pffs.group.placement); 0: never.
    handover: float = 300.0
    # The secret proving the principals without a static key (pffs.group.principals); None:
    # their blocks stay out of the group.
    principal_secret_file: str | None = None


# A DNS label as Kubernetes names namespaces, services and each part of a label's prefix.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def parse_member_source(text: str) -> MemberSource | None:
    """The member source a URL names, or None where it is none of the forms (the option's
    parser, pffs.optionvalues.member_source, says which it expected)."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme == "file" and not parts.netloc and parts.path.startswith("/"):
        return MembersFile(parts.path)
    if parts.scheme == "k8s":
        namespace, _, service = text.removeprefix("k8s://").partition("/")
        if text.startswith("k8s://") and DNS_LABEL.match(namespace) and DNS_LABEL.match(service):
            return MembersKube(namespace, service)
    if parts.scheme == "dns" and parts.hostname and port is not None and parts.path in ("", "/"):
        return MembersDns(parts.hostname, port)
    return None


def _group_config(raw: dict[str, Any]) -> GroupConfig:
    fields = dict(raw)
    members = fields.pop("members")
    if isinstance(members, str):
        # A record written before the source was kept parsed held its URL: a mount that
        # outlived an upgrade keeps its settings for `pffs warmup`.
        source = parse_member_source(members)
        if source is None:
            raise ValueError(f"a group record's member source {members!r} is not a URL of one")
        return GroupConfig(members=source, **fields)
    members = dict(members)
    source = MEMBER_SOURCES[members.pop("kind")](**members)
    return GroupConfig(members=source, **fields)


@dataclass(frozen=True)
class SharedCacheConfig:
    """A shared tier this mount uses (pffs.group.shared): an S3-compatible store near the
    compute holding blocks for every mount, with its own endpoint and credentials profile."""

    url: str
    endpoint_url: str | None = None
    profile: str | None = None
    # The file of the secret keying its objects' MACs (pffs.group.shared.tier_key).
    secret_file: str = ""


@dataclass(frozen=True)
class MountConfig:
    """Everything a mount needs (`pffs.mounting.serving.serve_here`).

    `table` lists the sources and where each appears in the tree; `pffs mount SOURCE` makes a
    table of one entry at the root. `name` is what `mount` shows as the file system's device.
    """

    table: tuple[TableEntry, ...]
    fuse: FuseConfig
    meta: MetaConfig = field(default_factory=MetaConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    # Where the daemon logs; None means stderr (foreground) or a per-mount file (daemon).
    log_file: str | None = None
    debug: bool = False
    name: str = "pffs"
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    dataset: PreloadConfig = field(default_factory=PreloadConfig)
    # None: no group, the mount fetches from its stores alone.
    group: GroupConfig | None = None
    # None: no shared tier (a mount is in a group or uses a shared tier, not both).
    shared_cache: SharedCacheConfig | None = None


def single_source(
    source: SourceConfig,
    fuse: FuseConfig,
    meta: MetaConfig | None = None,
    cache: CacheConfig | None = None,
    log_file: str | None = None,
) -> MountConfig:
    """The MountConfig of `pffs mount SOURCE MOUNTPOINT`: one source at the root."""
    return MountConfig(
        table=(TableEntry("", source),),
        fuse=fuse,
        meta=meta or MetaConfig(),
        cache=cache or CacheConfig(),
        log_file=log_file,
        name=source.url,
    )


def to_json(config: MountConfig, with_credentials: bool = False) -> str:
    """Serialise a MountConfig: without the sources' credentials (a record on disk), or with
    them (`with_credentials`: only through a pipe, to the daemon that serves the mount)."""
    if not with_credentials:
        table = tuple(replace(e, source=replace(e.source, credentials=None)) for e in config.table)
        config = replace(config, table=table)
    return json.dumps(asdict(config))


def from_json(text: str) -> MountConfig:
    raw = json.loads(text)
    table = []
    for entry in raw["table"]:
        source = dict(entry["source"])
        source["retry"] = RetryConfig(**source["retry"])
        if source.get("credentials"):
            source["credentials"] = Credentials(**source["credentials"])
        table.append(TableEntry(entry["path"], SourceConfig(**source), entry["cache"]))
    return MountConfig(
        table=tuple(table),
        fuse=FuseConfig(**raw["fuse"]),
        meta=MetaConfig(**raw["meta"]),
        cache=CacheConfig(**raw["cache"]),
        log_file=raw["log_file"],
        debug=raw["debug"],
        name=raw["name"],
        observe=ObserveConfig(**raw.get("observe", {})),
        dataset=_preload_config(raw.get("dataset", {})),
        group=_group_config(raw["group"]) if raw.get("group") else None,
        shared_cache=SharedCacheConfig(**raw["shared_cache"]) if raw.get("shared_cache") else None,
    )


def _preload_config(raw: dict[str, Any]) -> PreloadConfig:
    fields = dict(raw)
    if "orders" in fields:
        fields["orders"] = OrderLimits(**fields["orders"])
    return PreloadConfig(**fields)

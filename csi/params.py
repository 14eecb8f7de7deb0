"""What a CSI request asks for: volume attributes, secrets and capabilities, checked.

Volume context keys (camelCase, as Kubernetes volume attributes are written):

    source       the source URL, s3://bucket[/prefix] or hdfs://namenode[:port]/path
    mountTable   instead of source: a mount table (pffs.toml's [[mount]] entries, as TOML text)
                 to show several sources as one tree; file:// entries are refused
    endpoint     S3-compatible endpoint URL
    region       region
    cacheMemory  memory bound of the mount's cache ("512M")
    cacheSize    disk tier bound ("100G"); the disk tier itself is the node's --cache-dir
    readaheadMax largest readahead window ("32M", "0" disables readahead)
    blockSize    cache block size ("4M")
    readOnly     "true" / "false": the whole mount refuses writes
    preload      "true" / "false": load a directory's files ahead once a job reads a few
                 of them, and order lists (default true, `--preload on|off`)
    cacheGroup   "true" / "false": join the node's cache group (the driver's --group-*
                 options): the volume's mounts on all nodes serve each other's blocks

Every key but source, mountTable and cacheGroup is a mount option of pffs.optiontable (its
`csi` name: VOLUME_KEYS is derived from the table), read by that option's parser at
NodePublish, so a bad value fails the call naming its key before any mount process starts; an
empty attribute is one not given. The former names
prefetchMax and datasetPrefetch still work, with a warning in the log.

Node-publish and provisioner secrets: accessKeyId, secretAccessKey, optional sessionToken. They
become a Credentials value (pffs.credentials): the mount process reads them from a 0600 file
of the volume's state (`pffs mount --credentials-file`), the controller gives them to its boto3
session as arguments; never argv, an AWS_* variable or a log. A value with a line break or
another control character is INVALID_ARGUMENT, naming its key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from pffs.backends import scheme_of
from pffs.config import CacheConfig, memory_holds_blocks
from pffs.credentials import Credentials, value_problem
from pffs.csi.proto import csi_pb2
from pffs.csi.status import invalid
from pffs.errors import UsageError
from pffs.optiontable import OPTIONS, Option, camel
from pffs.optionvalues import BadValue, boolean

AccessMode = csi_pb2.VolumeCapability.AccessMode
log = logging.getLogger(__name__)

# The mount options a volume attribute sets, by attribute name.
VOLUME_OPTIONS: dict[str, Option] = {option.csi: option for option in OPTIONS if option.csi}
SIZE_KEYS = frozenset(key for key, option in VOLUME_OPTIONS.items() if option.metavar == "SIZE")
VOLUME_KEYS = frozenset({"source", "mountTable", "cacheGroup", *VOLUME_OPTIONS})
# Former key -> its name now ("prefetch" used to name both readahead and preload).
RENAMED_KEYS = {camel(old): key for key, option in VOLUME_OPTIONS.items() for old in option.renamed}
# Kubernetes adds these to volume attributes (pod info, ephemeral) and parameters (provisioner).
K8S_PREFIX = "csi.storage.k8s.io/"
# Secret key -> its Credentials field.
SECRET_KEYS = {
    "accessKeyId": "access_key_id",
    "secretAccessKey": "secret_access_key",
    "sessionToken": "session_token",
}
# Schemes a volume may use. file:// is left out on purpose: through CSI it would hand any pod
# that can name volume attributes (inline volumes) a view of the node's own files.
CSI_SCHEMES = frozenset({"s3", "hdfs"})
READER_ONLY_MODES = frozenset(
    {AccessMode.SINGLE_NODE_READER_ONLY, AccessMode.MULTI_NODE_READER_ONLY}
)
# Modes under which a volume may be published at one target of a node only (spec table for a
# second NodePublishVolume: FAILED_PRECONDITION).
SINGLE_TARGET_MODES = frozenset(
    {
        AccessMode.SINGLE_NODE_WRITER,
        AccessMode.SINGLE_NODE_READER_ONLY,
        AccessMode.SINGLE_NODE_SINGLE_WRITER,
    }
)


@dataclass(frozen=True)
class VolumeSpec:
    """How to mount one volume: everything the `pffs mount` process is started with."""

    source: str  # the URL, or "" when mount_table is given
    # The mount options the attributes set: {attribute: value, as its option's parser read it}.
    options: Mapping[str, object] = field(default_factory=dict)
    # TOML text of a mount table (several sources in one tree), written to a file for the mount.
    mount_table: str | None = None
    # Joins the node's cache group (the driver adds the group's options: VolumeManager).
    cache_group: bool = False

    @property
    def name(self) -> str:
        """What logs and errors call the volume's data."""
        return self.source or "a mount table"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> VolumeSpec:
        """The spec `as_dict` recorded; also a record from before the options were a map, each
        option in a field of its own named by its dest (the endpoint by its attribute)."""
        fields = dict(raw)
        options = dict(fields.pop("options", {}))
        for key, option in VOLUME_OPTIONS.items():
            for former in {option.dest, key}:
                value = fields.pop(former, None)
                if value is not None:
                    options[key] = value
        return cls(options=options, **fields)

    def mount_options(self) -> list[str]:
        """The `pffs mount` options of this spec (no secrets here: they travel in a file)."""
        options: list[str] = []
        for key, option in VOLUME_OPTIONS.items():
            if key in self.options:
                options += option.argv(self.options[key])
        return options


def parse_bool(key: str, text: str) -> bool:
    """A boolean attribute or parameter (pffs.optionvalues' rule); empty is not given: false."""
    return bool(_attribute(key, boolean, text)) if text.strip() else False


def _attribute(key: str, parse: Callable[[str], object], text: str) -> object:
    try:
        return parse(text)
    except BadValue as exc:
        raise invalid(f"{key}={exc}") from None


def check_source(url: str, key: str = "source") -> str:
    try:
        scheme = scheme_of(url)
    except UsageError as exc:
        raise invalid(f"{key}: {exc}") from None
    if scheme not in CSI_SCHEMES:
        allowed = ", ".join(f"{s}://" for s in sorted(CSI_SCHEMES))
        raise invalid(f"{key}: {scheme}:// sources are not served through CSI (use {allowed})")
    return url


def volume_spec(context: dict[str, str]) -> VolumeSpec:
    """The volume context checked: unknown keys and bad values are INVALID_ARGUMENT."""
    context = _renamed_keys(context)
    unknown = sorted(k for k in context if k not in VOLUME_KEYS and not k.startswith(K8S_PREFIX))
    if unknown:
        known = ", ".join(sorted(VOLUME_KEYS))
        raise invalid(f"unknown volume attribute {unknown[0]!r} (known: {known})")
    source = context.get("source", "").strip()
    table = context.get("mountTable", "").strip() or None
    if source and table:
        raise invalid("give the volume a 'source' or a 'mountTable', not both")
    if not source and not table:
        raise invalid("the volume context has no 'source' (the URL to mount, s3://bucket/prefix)")
    if table:
        check_mount_table(table, context.get("endpoint") or None)
    given = {
        key: _attribute(key, option.parse, context[key])
        for key, option in VOLUME_OPTIONS.items()
        if context.get(key, "").strip()
    }
    memory = cast(int, given.get("cacheMemory", CacheConfig.memory_bytes))
    block = cast(int, given.get("blockSize", CacheConfig.block_size))
    if not memory_holds_blocks(memory, block):
        raise invalid(f"cacheMemory={memory} must hold at least two blocks of blockSize={block}")
    return VolumeSpec(
        source=check_source(source) if source else "",
        options=given,
        mount_table=table,
        cache_group=parse_bool("cacheGroup", context.get("cacheGroup", "")),
    )


def _renamed_keys(context: dict[str, str]) -> dict[str, str]:
    """The context with former key names under their names now, each logged once."""
    renamed = dict(context)
    for old, new in RENAMED_KEYS.items():
        if old in renamed:
            log.warning("volume attribute %s is deprecated and will be removed, use %s", old, new)
            value = renamed.pop(old)
            renamed.setdefault(new, value)
    return renamed


def check_mount_table(text: str, endpoint: str | None) -> None:
    """A mount table volume attribute: valid TOML, valid entries, only CSI-served schemes."""
    import tomllib

    from pffs.config import SourceConfig
    from pffs.routing.tablefile import parse_table

    try:
        document = tomllib.loads(text)
        entries = parse_table(document, SourceConfig(url="", endpoint_url=endpoint), "mountTable")
    except tomllib.TOMLDecodeError as exc:
        raise invalid(f"mountTable is not valid TOML: {exc}") from None
    except UsageError as exc:
        raise invalid(str(exc)) from None
    for entry in entries:
        check_source(entry.source.url, f"mountTable entry /{entry.path}")


def volume_credentials(secrets: dict[str, str]) -> Credentials | None:
    """The keys in the secrets, as values; None when none are given (the node's own chain)."""
    found = {}
    for key, name in SECRET_KEYS.items():
        value = secrets.get(key, "")
        if value:
            problem = value_problem(value)
            if problem is not None:
                raise invalid(f"secrets: {key} {problem}")
            found[name] = value
    has_id, has_key = "access_key_id" in found, "secret_access_key" in found
    if has_id != has_key:
        raise invalid("secrets must hold both accessKeyId and secretAccessKey, or neither")
    if "session_token" in found and not has_id:
        raise invalid("secrets: sessionToken needs accessKeyId and secretAccessKey")
    return Credentials(**found) if found else None


def check_capability(capability: csi_pb2.VolumeCapability, field: str) -> None:
    """A capability pffs can serve: a mounted file system with a known access mode."""
    if capability.HasField("block"):
        raise invalid(f"{field}: block volumes are not supported, pffs is a file system")
    if not capability.HasField("mount"):
        raise invalid(f"{field}: access_type mount is required")
    if capability.access_mode.mode == AccessMode.UNKNOWN:
        raise invalid(f"{field}: access_mode is required")

"""Fluid's ThinRuntime config (config.json) as a pffs mount: read, check, translate.

Fluid's controller writes one line of JSON for the FUSE container of a ThinRuntime
(pkg/ddc/thin/transform_config.go, v1.0.x):

    {"mounts": [{"mountPoint": "s3://bucket/prefix", "name": "train", "path": "/train",
                 "options": {...}, "readOnly": true}, ...],
     "targetPath": "/runtime-mnt/thin/<ns>/<dataset>/thin-fuse",
     "runtimeOptions": {...}, "accessModes": ["ReadOnlyMany"], ...}

A mount's `options` are the Dataset's sharedOptions merged with its own; each encryptOption
appears there as the path of a file holding the value (/etc/fluid/secrets/<secret>/<key>).
`runtimeOptions` are the ThinRuntime's fuse.options; the MOUNT_OPTIONS variable holds the
ThinRuntimeProfile's and the ThinRuntime's fuse.options as `k=v,k,...` (and `ro` for a
ReadOnlyMany dataset).

The translation is the one of `pffs mount --config`: each Fluid mount becomes a mount table
entry (pffs.routing.tablefile checks it), at its `path`, else at `/<name>` (Fluid's own rule,
pkg/utils/ufs_path_builder.go; `path: /` puts the only mount at the root). Option keys are
the names of the option table (pffs.optiontable), `pffs mount`'s long options without the
dashes, each value read by the table's parser (a switch given without a value is on):

- per mount: the source options (endpoint-url or endpoint, region, profile, path-style,
  max-concurrency, hdfs-user, kerberos-ticket-cache, replication, buffer-size, `cache`: disk
  or memory), and the S3 credentials access-key-id, secret-access-key, session-token;
- for the whole mount: every other option (cache-dir, cache-size, metadata-ttl, ...). Given
  in a Dataset mount's options (sharedOptions) they must agree across mounts.

Only the profile's own options (`pffs fluid --options`) may be anything; what the Dataset,
the ThinRuntime and MOUNT_OPTIONS ask is held to the profile's policy (pffs.cli.fluidpolicy).
Precedence: the profile's options < MOUNT_OPTIONS < runtimeOptions < a mount's options, but
the profile's read-only stays. A dataset without a writable access mode (ReadOnlyMany is
Fluid's default) is a read-only mount; the mount is allow_other, since other pods read it.
Each S3 mount's keys are values in its source's config (pffs.credentials), never in argv,
logs or a file. Each problem is one UsageError naming the field:
`mounts[1].options.cache-size: ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pffs.cli.argtypes import renamed
from pffs.cli.fluidpolicy import (
    Policy,
    check_node_credentials,
    check_source,
    check_whole_mount_option,
    read_secret,
    secret_path,
)
from pffs.cli.options import source_config, table_mount_config
from pffs.config import MountConfig, SourceConfig
from pffs.credentials import Credentials
from pffs.errors import UsageError
from pffs.optiontable import OPTIONS, VALUE, Option, defaults, find
from pffs.optionvalues import BadValue
from pffs.routing.tablefile import parse_entries

# Where Fluid puts the config: v1.0.1 on, then older releases (v0.9 - v1.0.0).
CONFIG_PATHS = ("/etc/fluid/config/config.json", "/etc/fluid/config.json")
# The options each mount may set for itself, by key; `endpoint` is endpoint-url's short name,
# as in the mount table file.
SOURCE_KEYS = {option.name: option for option in OPTIONS if option.scope == "source"}
SOURCE_KEYS["endpoint"] = SOURCE_KEYS["endpoint-url"]
# S3 credentials -> their Credentials fields.
CREDENTIAL_KEYS = {
    "access-key-id": "access_key_id",
    "secret-access-key": "secret_access_key",
    "session-token": "session_token",
}
# Options that make no sense here: keys come from a Dataset's encryptOptions.
NOT_OPTIONS = {"credentials-file"}
# Access modes under which the dataset may be written (Fluid's default is ReadOnlyMany).
WRITABLE_MODES = {"ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"}
FLUID_PREFIX = "fluid."
# Fluid's own schemes for a directory of the node: local:///path is file:///path.
LOCAL_SCHEME = "local://"


def find_config(given: str | None) -> str:
    """The config file: `given`, else the first of Fluid's places that exists."""
    if given:
        return given
    for path in CONFIG_PATHS:
        if os.path.exists(path):
            return path
    raise UsageError(f"no Fluid config at {' or '.join(CONFIG_PATHS)} (give --config FILE)")


def read_document(path: str) -> dict[str, Any]:
    """The config file's JSON object; UsageError when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read the Fluid config {path}: {exc.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path}: expected a JSON object, not {type(document).__name__}")
    return document


def target_path(document: dict[str, Any], env: Mapping[str, str], path: str) -> str:
    """Where Fluid wants the mount: targetPath, else the MOUNT_POINT variable it also sets."""
    target = document.get("targetPath") or env.get("MOUNT_POINT")
    if not isinstance(target, str) or not target.startswith("/"):
        raise UsageError(f"{path}: targetPath is missing or not an absolute path")
    return target


def translated(
    document: dict[str, Any], env: Mapping[str, str], path: str, policy: Policy
) -> MountConfig:
    """`document` as a pffs mount, the profile's `policy` applied to what it asks."""
    target = target_path(document, env, path)
    modes = _string_list(document.get("accessModes", []), "accessModes")
    mounts = document.get("mounts")
    if not isinstance(mounts, list) or not mounts:
        raise UsageError(f"{path}: mounts is missing or empty (the Dataset has no mounts)")
    raw_mounts = [_mount_object(raw, f"mounts[{i}]", policy) for i, raw in enumerate(mounts)]

    # The profile's options, then the runtime's ({key: (where, text)}), then the whole-mount
    # options the Dataset's mounts give, which must agree with each other.
    trusted = _trusted_options(policy)
    shared = {
        key: (f"MOUNT_OPTIONS.{key}", text)
        for key, text in parse_mount_options(env.get("MOUNT_OPTIONS", "")).items()
    }
    runtime_options = _string_map(document.get("runtimeOptions") or {}, "runtimeOptions")
    shared |= {key: (f"runtimeOptions.{key}", text) for key, text in runtime_options.items()}
    for key, (where, text) in shared.items():
        _check_untrusted(key, text, where, policy)
    wide = trusted | {key: found for key, found in shared.items() if key not in CREDENTIAL_KEYS}
    for i, raw in enumerate(raw_mounts):
        for key, value in raw["options"].items():
            if key in SOURCE_KEYS or key in CREDENTIAL_KEYS:
                continue
            where = f"mounts[{i}].options.{key}"
            earlier = wide.get(key)
            if earlier is not None and earlier[0].startswith("mounts") and earlier[1] != value:
                raise UsageError(
                    f"{where}: {value!r} differs from {earlier[0]} ({earlier[1]!r}); a "
                    "whole-mount option: set it once (sharedOptions or the ThinRuntime)"
                )
            wide[key] = (where, value)
    args = mount_arguments(target, wide)
    # The profile's read-only is for good: the untrusted side may only add it.
    args.read_only = args.read_only or mount_arguments(target, trusted).read_only
    if modes and not WRITABLE_MODES & set(modes):
        args.read_only = True  # ReadOnlyMany: the whole mount refuses writes

    defaults = source_config(args, "", args.read_only)
    runtime_credentials = _credentials(
        {k: v for k, (_, v) in shared.items()}, "runtimeOptions", policy
    )
    labelled = []
    for i, raw in enumerate(raw_mounts):
        where = f"mounts[{i}]"
        entry, credentials = _table_entry(raw, where, args.read_only, runtime_credentials, policy)
        if credentials is not None and "profile" in entry:
            raise UsageError(f"{where}.options: give a profile or credentials, not both")
        source = dataclasses.replace(defaults, credentials=credentials)
        _check_identity(entry, source, where, policy)
        # The table's checks add the path to what an error names: mounts[0] (/a).
        labelled.append((where, entry, source))
    table = parse_entries(labelled)
    return table_mount_config(args, table, _device_name(env, path))


def _trusted_options(policy: Policy) -> dict[str, tuple[str, str]]:
    """The profile's own options (`pffs fluid --options`): any option but credentials."""
    found = {}
    for key, text in parse_mount_options(",".join(policy.options)).items():
        where = f"--options {key}"
        if key in CREDENTIAL_KEYS:
            raise UsageError(f"{where}: keys come from a Dataset's encryptOptions")
        _option(key, where)  # unknown keys fail here
        found[key] = (where, text)
    return found


def _check_untrusted(key: str, text: str, where: str, policy: Policy) -> None:
    """Refuse an option of a Dataset or ThinRuntime that the profile keeps for itself."""
    if key in CREDENTIAL_KEYS or key == "cache":
        return  # keys: read as values, or from files under the secrets directory
    option = _option(key, where, notice=False)  # unknown keys fail here
    if key == "profile":
        check_node_credentials(where, "a named profile", policy)
    elif key == "kerberos-ticket-cache":
        secret_path(text, where, policy)
    elif key not in SOURCE_KEYS:
        check_whole_mount_option(option.dest, where, policy)


def _check_identity(
    entry: dict[str, Any], source: SourceConfig, where: str, policy: Policy
) -> None:
    """Refuse a mount that would act as the node, or show the node's files, unless allowed.
    (A profile or ticket cache in the defaults is the profile's own, or was allowed already.)"""
    parts = urlsplit(entry["source"])
    own_s3 = source.credentials or entry.get("profile") or source.profile
    if parts.scheme == "s3" and not own_s3:
        check_node_credentials(where, "an S3 mount without keys", policy)
    own_hdfs = entry.get("kerberos_ticket_cache") or source.kerberos_ticket_cache
    if parts.scheme == "hdfs" and not own_hdfs:
        check_node_credentials(where, "an HDFS mount without a ticket cache", policy)


def parse_mount_options(text: str) -> dict[str, str]:
    """MOUNT_OPTIONS (`k=v,k,...`) as a map; `ro` is the read-only option."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        options["read-only" if key == "ro" else key] = value or ("true" if key == "ro" else "")
    return options


def _mount_object(raw: object, where: str, policy: Policy) -> dict[str, Any]:
    """One of Fluid's mounts, its fields checked and defaulted."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected an object, not {raw!r}")
    mount_point = raw.get("mountPoint")
    if not isinstance(mount_point, str) or not mount_point:
        raise UsageError(f"{where}.mountPoint is missing")
    name = raw.get("name", "")
    path = raw.get("path", "")
    for field, value in (("name", name), ("path", path)):
        if not isinstance(value, str):
            raise UsageError(f"{where}.{field} must be a string, not {value!r}")
    read_only = raw.get("readOnly", False)
    if not isinstance(read_only, bool):
        raise UsageError(f"{where}.readOnly must be true or false, not {read_only!r}")
    options = _string_map(raw.get("options") or {}, f"{where}.options")
    # Fluid's own options (fluid.fuse.hostvolume: a node directory mounted into the container)
    # are for its controller, and stay in the config.
    options = {k: v for k, v in options.items() if not k.startswith(FLUID_PREFIX)}
    for key, text in options.items():
        _check_untrusted(key, text, f"{where}.options.{key}", policy)
    return {
        "mountPoint": mount_point,
        "name": name,
        "path": path,
        "readOnly": read_only,
        "options": options,
    }


def _table_entry(
    raw: dict[str, Any],
    where: str,
    read_only: bool,
    runtime_credentials: dict[str, str],
    policy: Policy,
) -> tuple[dict[str, Any], Credentials | None]:
    """The mount table entry of one Fluid mount, and its S3 credentials (maybe none)."""
    url = _source_url(raw["mountPoint"], f"{where}.mountPoint", policy)
    entry: dict[str, Any] = {"path": _tree_path(raw), "source": url}
    if raw["readOnly"] or read_only:
        entry["read_only"] = True
    for key, text in raw["options"].items():
        option = SOURCE_KEYS.get(key)
        if option is not None and option.toml is not None:
            entry[option.toml] = _value(option, text, f"{where}.options.{key}")
    found = runtime_credentials | _credentials(raw["options"], f"{where}.options", policy)
    if urlsplit(url).scheme != "s3" or not found:
        return entry, None  # sharedEncryptOptions reach every mount; only S3 uses keys
    return entry, Credentials(**found)


def _tree_path(raw: dict[str, Any]) -> str:
    """Fluid's place of a mount in the tree: its absolute path, else /<name>."""
    path = raw["path"]
    if path.startswith("/"):
        return str(path)
    return "/" + str(raw["name"]).lstrip("/")


def _source_url(mount_point: str, where: str, policy: Policy) -> str:
    """The source URL of a Dataset's mountPoint, once the policy allows it."""
    url = mount_point
    if mount_point.startswith(LOCAL_SCHEME):
        url = "file://" + mount_point[len(LOCAL_SCHEME) :]
    check_source(url, where, policy)
    return url


def _credentials(options: Mapping[str, str], where: str, policy: Policy) -> dict[str, str]:
    """The S3 credentials among `options` ({Credentials field: value}), read as values or from
    their files under the secrets directory (Fluid's encryptOptions)."""
    found = {}
    for key, name in CREDENTIAL_KEYS.items():
        if key in options:
            found[name] = read_secret(options[key], f"{where}.{key}", policy)
    if found and not {"access_key_id", "secret_access_key"} <= set(found):
        raise UsageError(f"{where}: access-key-id and secret-access-key go together")
    return found


def mount_arguments(target: str, options: Mapping[str, tuple[str, str]]) -> argparse.Namespace:
    """What `pffs mount TARGET --foreground` with `options` ({key: (where, text)}) means, each
    value read by the option's own parser."""
    # Fluid hands the mount to other pods, whose processes run as any user (allow-other: false
    # keeps it to root).
    given = defaults() | {"allow_other": True}
    for key, (where, text) in options.items():
        option = _option(key, where)
        if not option.cli:
            raise UsageError(f"{where}: set for each mount (a mount's options), not for all")
        given[option.dest] = _value(option, text, where)
    return argparse.Namespace(
        **given, command="mount", source=None, mountpoint=target, config=None, foreground=True
    )


def option_dest(key: str, where: str) -> str:
    """The dest of the mount option `key` (its long name without the dashes)."""
    return _option(key, where).dest


def _option(key: str, where: str, notice: bool = True) -> Option:
    found = find("endpoint-url" if key == "endpoint" else key)
    if found is None or key in NOT_OPTIONS:
        raise UsageError(f"{where}: unknown option (a `pffs mount` option without the dashes)")
    option, former = found
    if notice and former:
        renamed(where, option.name)
    return option


def _value(option: Option, text: str, where: str) -> object:
    """An option's text as its value; a switch given without one (`ro`, `allow-other`) is on."""
    if option.form != VALUE and not text.strip():
        return True
    try:
        return option.parse(text)
    except BadValue as exc:
        raise UsageError(f"{where}: {exc}") from None


def _string_map(raw: object, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected an object of strings, not {raw!r}")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise UsageError(f"{where}.{key} must be a string, not {value!r}")
    return dict(raw)


def _string_list(raw: object, where: str) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise UsageError(f"{where}: expected a list of strings, not {raw!r}")
    return list(raw)


def _device_name(env: Mapping[str, str], path: str) -> str:
    """What `mount` shows as the device: Fluid's runtime, else the config file."""
    namespace, runtime = env.get("FLUID_RUNTIME_NS"), env.get("FLUID_RUNTIME_NAME")
    return f"fluid:{namespace}/{runtime}" if namespace and runtime else os.path.abspath(path)

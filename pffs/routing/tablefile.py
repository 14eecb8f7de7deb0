"""The mount table file (`pffs mount --config pffs.toml MOUNTPOINT`): read and validate it.

    # pffs.toml: one [[mount]] table per source
    [[mount]]
    path = "/imagenet"                  # where in the tree (required)
    source = "s3://datasets/imagenet"   # the source URL (required)
    read_only = true
    endpoint = "http://minio.local:9000"
    region = "us-east-1"
    profile = "research"
    cache = "disk"                      # or "memory": never write its blocks to disk

    [[mount]]
    path = "/logs"
    source = "hdfs://namenode:8020/logs"
    user = "hadoop"

An entry's keys besides `path` and `source` are the source options of the option table
(pffs.optiontable, its `toml` names), each value checked by the option's own parser.
Everything is checked before anything is mounted: unknown keys, wrong types, duplicate paths,
sources that overlap (the same objects reachable through two entries would be cached twice and
go stale through each other's writes) and malformed URLs each give one line naming the entry.
Options given on the command line are the defaults of every entry.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pffs.backends import open_backend
from pffs.config import SourceConfig, TableEntry
from pffs.errors import PffsError, UsageError
from pffs.optiontable import OPTIONS, Option
from pffs.optionvalues import BadValue
from pffs.routing.table import is_under

# Key in the file -> its option; `path` and `source` are the entry's own.
_OPTION_KEYS: dict[str, Option] = {option.toml: option for option in OPTIONS if option.toml}
_ENTRY_KEYS = ("path", "source", *_OPTION_KEYS)


def load_table_file(file: str, defaults: SourceConfig) -> tuple[TableEntry, ...]:
    """The validated entries of a mount table file; UsageError naming the problem otherwise."""
    try:
        with open(file, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read the mount table {file}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{file} is not valid TOML: {exc}") from None
    return parse_table(document, defaults, file)


def parse_table(
    document: dict[str, Any], defaults: SourceConfig, file: str
) -> tuple[TableEntry, ...]:
    unknown = sorted(set(document) - {"mount"})
    if unknown:
        raise UsageError(f"{file}: unknown key {unknown[0]!r} (the file holds [[mount]] tables)")
    raw_entries = document.get("mount")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise UsageError(f"{file}: no [[mount]] entries")
    labelled = [
        (f"{file}: entry {number}", raw, defaults) for number, raw in enumerate(raw_entries, 1)
    ]
    return parse_entries(labelled)


def parse_entries(
    labelled: Sequence[tuple[str, object, SourceConfig]],
) -> tuple[TableEntry, ...]:
    """Entries given as (what an error calls it, [[mount]] table, the defaults of its source),
    checked one by one and in pairs; the file above and `pffs fluid`'s Dataset mounts
    (pffs.cli.fluidconfig, whose mounts have keys of their own) use it."""
    entries: list[TableEntry] = []
    for where, raw, defaults in labelled:
        entry = _parse_entry(raw, defaults, where)
        for earlier in entries:
            _check_pair(earlier, entry, f"{where} (/{entry.path})")
        entries.append(entry)
    return tuple(entries)


def _parse_entry(raw: object, defaults: SourceConfig, where: str) -> TableEntry:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a [[mount]] table")
    for key, value in raw.items():
        if key not in _ENTRY_KEYS:
            known = ", ".join(_ENTRY_KEYS)
            raise UsageError(f"{where}: unknown key {key!r} (known: {known})")
        _check_value(key, value, where)
    for required in ("path", "source"):
        if required not in raw:
            raise UsageError(f"{where}: {required!r} is missing")
    path = _tree_path(raw["path"], where)
    where = f"{where} (/{path})"
    overrides: dict[str, Any] = {"url": raw["source"]}
    for key, value in raw.items():
        option = _OPTION_KEYS.get(key)
        for field in option.fields_of(SourceConfig) if option is not None else ():
            overrides[field] = value  # (the cache policy is the entry's: TableEntry.cache)
    source = dataclasses.replace(defaults, **overrides)
    try:
        open_backend(source)  # parses and checks the URL and options; no network traffic
    except PffsError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return TableEntry(path, source, raw.get("cache", "disk"))


def _check_value(key: str, value: object, where: str) -> None:
    """A value of the type its key takes (TOML is typed), in its option's range."""
    option = _OPTION_KEYS.get(key)
    types: tuple[type, ...] = (option.toml_type,) if option else (str,)
    # bool is an int in Python; a number of threads given as `true` is still a mistake.
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        raise UsageError(f"{where}: {key} must be a {types[0].__name__}, not {value!r}")
    if option is not None and option.toml_type in (int, str):
        try:
            option.parse(str(value))
        except BadValue as exc:
            raise UsageError(f"{where}: {key} must not be {value!r}: {exc}") from None


def _tree_path(text: str, where: str) -> str:
    if not text.startswith("/"):
        raise UsageError(f"{where}: path {text!r} must start with '/'")
    parts = [part for part in text.strip("/").split("/") if part]
    if any(part in (".", "..") for part in parts) or "//" in text.rstrip("/"):
        raise UsageError(f"{where}: path {text!r} has empty, '.' or '..' parts")
    return "/".join(parts)


def _location(source: SourceConfig) -> tuple[str, str]:
    """(store, path in the store) of a source, to tell whether two sources overlap."""
    parts = urlsplit(source.url)
    store = f"{parts.scheme}://{parts.netloc}@{source.endpoint_url or ''}"
    return store, parts.path.strip("/")


def _check_pair(earlier: TableEntry, entry: TableEntry, where: str) -> None:
    if earlier.path == entry.path:
        raise UsageError(f"{where}: path /{entry.path} is already used by an earlier entry")
    store_a, path_a = _location(earlier.source)
    store_b, path_b = _location(entry.source)
    if store_a == store_b and (is_under(path_a, path_b) or is_under(path_b, path_a)):
        raise UsageError(
            f"{where}: source {entry.source.url} overlaps {earlier.source.url} "
            f"(mounted at /{earlier.path}); mount one and reach the other through it"
        )

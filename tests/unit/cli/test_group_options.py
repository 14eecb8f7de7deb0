"""`--group-self` as the interface states it: the option, else the node name ($NODE_NAME, as a
Kubernetes pod is given it), else the host name; `--group-handover`, 300 s unless given."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
from pathlib import Path

import pytest

from pffs.cli.groupoptions import KUBE_API_ENV, group_config, shared_cache_config
from pffs.cli.options import build_parser
from pffs.config import (
    FuseConfig,
    MembersDns,
    MembersFile,
    MembersKube,
    MemberSource,
    MountConfig,
    from_json,
    to_json,
)
from pffs.errors import UsageError


def args(
    tmp_path: Path, group_self: str | None, group_handover: float | None = None
) -> argparse.Namespace:
    """`pffs mount`'s parsed command line joining a group of one member file."""
    members, secret = tmp_path / "members", tmp_path / "secret"
    members.write_text("node-a http://127.0.0.2:7000\n")
    secret.write_text("a-shared-secret-of-the-group")
    argv = ["mount", "s3://bucket", str(tmp_path / "mnt"), "--group-members", f"file://{members}"]
    argv += ["--group-listen", "127.0.0.2:7000", "--group-secret-file", str(secret)]
    if group_self is not None:
        argv += ["--group-self", group_self]
    if group_handover is not None:
        argv += ["--group-handover", f"{group_handover:g}"]
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    ("option", "node_name", "expected"),
    [("node-a", "node-b", "node-a"), (None, "node-b", "node-b"), (None, None, None)],
)
def test_group_self_defaults_to_the_node_name_then_the_host_name(
    option: str | None,
    node_name: str | None,
    expected: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if node_name is None:
        monkeypatch.delenv("NODE_NAME", raising=False)
    else:
        monkeypatch.setenv("NODE_NAME", node_name)
    config = group_config(args(tmp_path, option))
    assert config is not None
    assert config.self_name == (expected or socket.gethostname())


@pytest.mark.parametrize(("given", "expected"), [(None, 300.0), (0.0, 0.0), (45.5, 45.5)])
def test_group_handover_defaults_to_five_minutes(
    given: float | None, expected: float, tmp_path: Path
) -> None:
    config = group_config(args(tmp_path, "node-a", given))
    assert config is not None
    assert config.handover == expected


def test_the_principal_secret_is_read_and_checked(tmp_path: Path) -> None:
    given = args(tmp_path, "node-a")
    assert group_config(given).principal_secret_file is None  # type: ignore[union-attr]
    secret = tmp_path / "principal-secret"
    secret.write_text("short")
    given.group_principal_secret_file = str(secret)
    with pytest.raises(UsageError, match=r"--group-principal-secret-file .* 16 bytes or more"):
        group_config(given)
    secret.write_text("the-volume-principal-secret")
    config = group_config(given)
    assert config is not None and config.principal_secret_file == str(secret)


def test_a_shared_tier_needs_its_secret(tmp_path: Path) -> None:
    tier = argparse.Namespace(
        shared_cache="s3://near/blocks",
        shared_cache_endpoint=None,
        shared_cache_profile=None,
        shared_cache_secret_file=None,
        group_members=None,
    )
    with pytest.raises(UsageError, match="needs --shared-cache-secret-file"):
        shared_cache_config(tier)
    secret = tmp_path / "tier-secret"
    secret.write_text("the-shared-tier-secret-0123")
    tier.shared_cache_secret_file = str(secret)
    config = shared_cache_config(tier)
    assert config is not None and config.secret_file == str(secret)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("k8s://pffs-system/pffs-group", MembersKube("pffs-system", "pffs-group")),
        ("dns://pffs-group.pffs.svc:7070", MembersDns("pffs-group.pffs.svc", 7070)),
    ],
)
def test_the_member_source_is_parsed_once_into_its_kind(
    url: str, parsed: MemberSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config holds the parsed source: its kind and parts, which the mount's group uses
    as they are (pffs.mounting.grouping), and which a daemon reads back from the config's JSON."""
    monkeypatch.delenv(KUBE_API_ENV, raising=False)
    given = args(tmp_path, "node-a")
    config = group_config(given)
    assert config is not None
    assert config.members == MembersFile(str(tmp_path / "members"))
    given.group_members = (
        build_parser().parse_args(["mount", "s3://b", "/m", "--group-members", url]).group_members
    )
    config = group_config(given)
    assert config is not None and config.members == parsed and str(config.members) == url
    mount = MountConfig(table=(), fuse=FuseConfig(mountpoint="/m"), group=config)
    assert from_json(to_json(mount)).group == config


def test_a_record_from_before_the_parsed_source_reads_its_url(tmp_path: Path) -> None:
    """A mount started by the previous version recorded its member source as the URL: the
    record still reads (pffs warmup takes its settings from it)."""
    config = group_config(args(tmp_path, "node-a"))
    assert config is not None
    mount = MountConfig(table=(), fuse=FuseConfig(mountpoint="/m"), group=config)
    record = json.loads(to_json(mount))
    record["group"]["members"] = str(config.members)
    assert from_json(json.dumps(record)).group == config


@pytest.mark.parametrize(
    ("flag", "text", "complaint"),
    [
        ("--group-members", "http://node-a:7070", "is not file:///PATH, k8s://"),
        ("--group-members", "dns://name", "is not dns://NAME:PORT"),
        ("--group-members", "k8s://NS/svc", "is not k8s://NAMESPACE/SERVICE"),
        ("--group-listen", "node-a", "is not HOST:PORT"),
        ("--group-self", "a/b", "is not a member name"),
        ("--group-handover", "86401", "is not a number of seconds from 0 to 86400"),
        ("--shared-cache", "http://near/blocks", "is not s3://BUCKET/PREFIX"),
    ],
)
def test_a_bad_group_value_is_refused_by_its_parser(
    flag: str, text: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["mount", "s3://b", "/m", flag, text])
    assert exited.value.code == 2
    assert f"argument {flag}: {text!r} {complaint}" in capsys.readouterr().err


def test_the_mount_follows_the_parsed_kind(tmp_path: Path) -> None:
    """pffs.mounting.grouping picks what follows the list by the parsed kind, no URL read."""
    from pffs.group.dnsmembers import DnsMembers
    from pffs.group.members import FileMembers
    from pffs.mounting.grouping import _member_source

    config = group_config(args(tmp_path, "node-a"))
    assert config is not None
    follower = _member_source(config)
    assert isinstance(follower, FileMembers) and follower.path == str(tmp_path / "members")
    follower = _member_source(dataclasses.replace(config, members=MembersDns("localhost", 7070)))
    assert isinstance(follower, DnsMembers) and (follower.name, follower.port) == (
        "localhost",
        7070,
    )

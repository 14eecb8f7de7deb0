"""`--group-self` as the interface states it: the option, else the node name ($NODE_NAME, as a
Kubernetes pod is given it), else the host name; `--group-handover`, 300 s unless given."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from pffs.cli.groupoptions import group_config, shared_cache_config
from pffs.errors import UsageError


def args(
    tmp_path: Path, group_self: str | None, group_handover: float | None = None
) -> argparse.Namespace:
    members, secret = tmp_path / "members", tmp_path / "secret"
    members.write_text("node-a http://127.0.0.2:7000\n")
    secret.write_text("a-shared-secret-of-the-group")
    return argparse.Namespace(
        group_members=f"file://{members}",
        group_listen="127.0.0.2:7000",
        group_secret_file=str(secret),
        group_self=group_self,
        group_handover=group_handover,
    )


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

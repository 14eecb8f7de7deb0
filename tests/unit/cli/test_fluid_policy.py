"""The profile's policy over what a Dataset or ThinRuntime asks of `pffs fluid`
(pffs.cli.fluidpolicy): each thing the untrusted side may not ask is refused with one line
naming the option, and accepted once the profile allows it.

Configs are written as Fluid's controller writes them (tests/fluid_controller.py), secrets as
files in a temp dir given as the profile's `--secrets-dir`. A few refusals also run as
`pffs fluid` processes, for the one line on stderr and exit status 2, in
tests/commands/test_refusals.py; the refusals that guard against a command being run are in
tests/mount/test_credential_injection.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pffs.cli.fluidconfig import read_document, translated
from pffs.cli.fluidpolicy import Policy
from pffs.config import MountConfig
from pffs.errors import UsageError
from tests.fluid_controller import fluid_config, write_secret

TARGET = "/runtime-mnt/thin/default/imagenet/thin-fuse"


def encrypt(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": key}}}


KEYS = [encrypt("access-key-id", "accessKeyId"), encrypt("secret-access-key", "secretAccessKey")]


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    write_secret(folder, "s3-keys", {"accessKeyId": "AKIAFLUID\n", "secretAccessKey": "s3cr3t"})
    return folder


def s3_dataset(**options: str) -> dict[str, Any]:
    """One S3 mount with its keys as encryptOptions, and these options."""
    mount = {"mountPoint": "s3://bucket-a", "name": "a", "options": options}
    return {"mounts": [mount], "sharedEncryptOptions": KEYS}


def load(
    tmp_path: Path, text: str, policy: Policy, env: dict[str, str] | None = None
) -> MountConfig:
    path = tmp_path / "config.json"
    path.write_text(text)
    return translated(read_document(str(path)), env or {}, str(path), policy)


# Each: (what the untrusted side asks, the refusal's line, the profile's setting allowing it).
# A dataset is a Dataset's spec; "runtime" is a ThinRuntime's fuse.options; "env" the
# container's MOUNT_OPTIONS.
CASES: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "cache-dir": (
        {"dataset": s3_dataset(**{"cache-dir": "/etc"})},
        r"^mounts\[0\]\.options\.cache-dir: only the profile sets this option",
        {"allowed_options": frozenset({"cache_dir"})},
    ),
    "log-file": (
        {"dataset": s3_dataset(**{"log-file": "/etc/cron.d/x"})},
        r"^mounts\[0\]\.options\.log-file: only the profile",
        {"allowed_options": frozenset({"log_file"})},
    ),
    "metrics": (
        {"dataset": s3_dataset(), "runtime": {"metrics": "0.0.0.0:9100"}},
        r"^runtimeOptions\.metrics: only the profile",
        {"allowed_options": frozenset({"metrics"})},
    ),
    "uid": (
        {"dataset": s3_dataset(), "env": {"MOUNT_OPTIONS": "uid=1000"}},
        r"^MOUNT_OPTIONS\.uid: only the profile",
        {"allowed_options": frozenset({"uid"})},
    ),
    "gid": (
        {"dataset": s3_dataset(gid="0")},
        r"^mounts\[0\]\.options\.gid: only the profile",
        {"allowed_options": frozenset({"gid"})},
    ),
    "file-mode": (
        {"dataset": s3_dataset(**{"file-mode": "666"})},
        r"^mounts\[0\]\.options\.file-mode: only the profile",
        {"allowed_options": frozenset({"file_mode"})},
    ),
    "allow-other": (
        {"dataset": s3_dataset(**{"allow-other": "false"})},
        r"^mounts\[0\]\.options\.allow-other: only the profile",
        {"allowed_options": frozenset({"allow_other"})},
    ),
    "cache-size": (
        {"dataset": s3_dataset(**{"cache-size": "1T"})},
        r"^mounts\[0\]\.options\.cache-size: only the profile",
        {"allowed_options": frozenset({"cache_size"})},
    ),
    "local mount": (
        {"dataset": {"mounts": [{"mountPoint": "local:///", "name": "root"}]}},
        r"^mounts\[0\]\.mountPoint: local directories are not allowed here",
        {"local_roots": ("/",)},
    ),
    "file mount": (
        {"dataset": {"mounts": [{"mountPoint": "file:///etc", "name": "etc"}]}},
        r"^mounts\[0\]\.mountPoint: local directories are not allowed",
        {"local_roots": ("/etc",)},
    ),
    "arrow+file mount": (
        {"dataset": {"mounts": [{"mountPoint": "arrow+file:///etc", "name": "etc"}]}},
        r"^mounts\[0\]\.mountPoint: local directories are not allowed",
        {"local_roots": ("/etc",)},
    ),
    "arrow+file mount by localhost": (
        {"dataset": {"mounts": [{"mountPoint": "arrow+file://localhost/etc", "name": "etc"}]}},
        r"^mounts\[0\]\.mountPoint: local directories are not allowed",
        {"local_roots": ("/etc",)},
    ),
    "keyless S3 mount": (
        {"dataset": {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}},
        r"^mounts\[0\]: an S3 mount without keys would use the node's own credentials",
        {"node_credentials": True},
    ),
    "keyless HDFS mount": (
        {"dataset": {"mounts": [{"mountPoint": "hdfs://namenode:8020/logs", "name": "l"}]}},
        r"^mounts\[0\]: an HDFS mount without a ticket cache would use the node's own",
        {"node_credentials": True},
    ),
    "a named profile": (
        {"dataset": {"mounts": [{"mountPoint": "s3://b-1", "options": {"profile": "default"}}]}},
        r"^mounts\[0\]\.options\.profile: a named profile would use the node's own credentials",
        {"node_credentials": True},
    ),
}


@pytest.mark.parametrize("asked,refusal,allowing", CASES.values(), ids=CASES.keys())
def test_refused_unless_the_profile_allows(
    tmp_path: Path,
    secrets: Path,
    monkeypatch: pytest.MonkeyPatch,
    asked: dict[str, Any],
    refusal: str,
    allowing: dict[str, Any],
) -> None:
    # A profile `default` for the case that names it, without a process to run.
    config = tmp_path / "aws-config"
    config.write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(config))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    text = fluid_config(asked["dataset"], TARGET, secrets, asked.get("runtime"))
    env = asked.get("env", {})
    strict = Policy(secrets_dir=str(secrets))
    with pytest.raises(UsageError, match=refusal) as refused:
        load(tmp_path, text, strict, env)
    assert "\n" not in str(refused.value)
    load(tmp_path, text, Policy(secrets_dir=str(secrets), **allowing), env)  # now accepted


def test_a_local_root_is_a_boundary(tmp_path: Path, secrets: Path) -> None:
    """Allowed under /srv/data is not /srv/database, nor a way out through .. or %2e%2e."""
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (tmp_path / "database").mkdir()
    policy = Policy(secrets_dir=str(secrets), local_roots=(str(root),))
    for mount_point in (f"local://{root}/train", f"file://{root}"):
        dataset = {"mounts": [{"mountPoint": mount_point, "name": "d"}]}
        load(tmp_path, fluid_config(dataset, TARGET, secrets), policy)
    for mount_point in (
        f"local://{tmp_path}/database",
        f"local://{root}/../database",
        f"file://{root}/%2e%2e/database",
    ):
        dataset = {"mounts": [{"mountPoint": mount_point, "name": "d"}]}
        with pytest.raises(UsageError, match="local directories are not allowed"):
            load(tmp_path, fluid_config(dataset, TARGET, secrets), policy)


def test_data_options_are_the_datasets_to_set(tmp_path: Path, secrets: Path) -> None:
    options = {
        "read-only": "true",
        "readahead-max": "8M",
        "metadata-ttl": "indefinite",
        "preload": "off",
        "retries": "2",
        "region": "eu-west-1",
        "endpoint-url": "http://127.0.0.1:1",
        "path-style": "true",
        "max-concurrency": "4",
        "cache": "memory",
    }
    config = load(
        tmp_path,
        fluid_config(s3_dataset(**options), TARGET, secrets),
        Policy(secrets_dir=str(secrets)),
    )
    assert config.cache.readahead_max == 8 << 20 and not config.dataset.enabled
    [entry] = config.table
    assert entry.cache == "memory" and entry.source.region == "eu-west-1"


def test_the_profiles_read_only_stays(tmp_path: Path, secrets: Path) -> None:
    dataset = {**s3_dataset(**{"read-only": "false"}), "accessModes": ["ReadWriteMany"]}
    text = fluid_config(dataset, TARGET, secrets)
    assert not load(tmp_path, text, Policy(secrets_dir=str(secrets))).fuse.read_only
    assert load(
        tmp_path, text, Policy(secrets_dir=str(secrets), options=("read-only",))
    ).fuse.read_only


def test_the_profiles_options_may_not_hold_keys(tmp_path: Path, secrets: Path) -> None:
    text = fluid_config(s3_dataset(), TARGET, secrets)
    with pytest.raises(UsageError, match=r"^--options access-key-id: keys come from"):
        load(tmp_path, text, Policy(secrets_dir=str(secrets), options=("access-key-id=AKIA",)))


def secret_dataset(path: str) -> dict[str, Any]:
    mount = {
        "mountPoint": "s3://bucket-a",
        "name": "a",
        "options": {"access-key-id": path, "secret-access-key": "plain-value"},
    }
    return {"mounts": [mount]}


def test_secret_files_only_under_the_secrets_dir(tmp_path: Path, secrets: Path) -> None:
    """A path outside it, a way out by .., a link inside it that leads out: each refused.
    Kubernetes' own links (key -> ..data/key -> ..<time>/key) stay inside and are read."""
    outside = tmp_path / "token"
    outside.write_text("SERVICE-ACCOUNT-TOKEN")
    (secrets / "s3-keys" / "escape").symlink_to(outside)
    timestamped = secrets / "kube" / "..2026_11_26"
    timestamped.mkdir(parents=True)
    (timestamped / "id").write_text("AKIAKUBE")
    (secrets / "kube" / "..data").symlink_to("..2026_11_26")
    (secrets / "kube" / "id").symlink_to("..data/id")
    policy = Policy(secrets_dir=str(secrets))
    for path in (str(outside), f"{secrets}/../token", str(secrets / "s3-keys" / "escape")):
        text = fluid_config(secret_dataset(path), TARGET, secrets)
        with pytest.raises(UsageError, match=r"access-key-id: a secret file must be under"):
            load(tmp_path, text, policy)
    text = fluid_config(secret_dataset(str(secrets / "kube" / "id")), TARGET, secrets)
    [entry] = load(tmp_path, text, policy).table
    assert entry.source.credentials is not None
    assert entry.source.credentials.access_key_id == "AKIAKUBE"
    # The same outside path is readable once the profile's secrets dir holds it.
    text = fluid_config(secret_dataset(str(outside)), TARGET, secrets)
    load(tmp_path, text, Policy(secrets_dir=str(tmp_path)))


def test_a_kerberos_ticket_cache_only_from_the_secrets(tmp_path: Path, secrets: Path) -> None:
    dataset = {
        "mounts": [
            {
                "mountPoint": "hdfs://namenode:8020/logs",
                "name": "logs",
                "options": {"kerberos-ticket-cache": "/tmp/krb5cc_0"},
            }
        ]
    }
    with pytest.raises(UsageError, match=r"kerberos-ticket-cache: a secret file must be under"):
        load(tmp_path, fluid_config(dataset, TARGET, secrets), Policy(secrets_dir=str(secrets)))

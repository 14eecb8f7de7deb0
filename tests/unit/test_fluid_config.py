"""`pffs fluid`'s reading of Fluid's config (pffs.cli.fluidconfig), on config files written as
Fluid's controller writes them (tests/fluid_controller.py), secrets as files in a temp dir.

The mount itself, SIGTERM, dead mounts, the liveness check and config changes are in
tests/mount/test_fluid.py."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from pffs.cli.fluidconfig import (
    CREDENTIALS_ENV,
    find_config,
    parse_mount_options,
    read_document,
    translated,
)
from pffs.config import MountConfig, TableEntry
from pffs.errors import UsageError
from tests.fluid_controller import fluid_config, write_secret

TARGET = "/runtime-mnt/thin/default/imagenet/thin-fuse"


def encrypt(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def two_mounts(local_dir: Path) -> dict[str, Any]:
    """The Dataset of deploy/fluid/dataset.yaml: an S3 prefix and a directory of the node."""
    return {
        "sharedOptions": {"cache-size": "20G"},
        "mounts": [
            {
                "mountPoint": "s3://datasets/imagenet/train",
                "name": "train",
                "options": {"endpoint-url": "http://minio.minio:9000", "region": "eu-west-1"},
                "encryptOptions": [
                    encrypt("access-key-id", "s3-keys", "accessKeyId"),
                    encrypt("secret-access-key", "s3-keys", "secretAccessKey"),
                ],
            },
            {
                "mountPoint": f"local://{local_dir}",
                "name": "labels",
                "path": "/meta/labels",
                # Fluid's: mount this node directory into the FUSE container
                "options": {"fluid.fuse.hostvolume": str(local_dir)},
            },
        ],
    }


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    # `kubectl create secret --from-file` keeps a file's trailing newline.
    write_secret(folder, "s3-keys", {"accessKeyId": "AKIAFLUID\n", "secretAccessKey": "s3cr3t/+x"})
    return folder


def fluid_mount(path: Path, env: dict[str, str]) -> AbstractContextManager[MountConfig]:
    """What `pffs fluid` mounts for the config file at `path`, credentials in place."""
    return translated(read_document(str(path)), env, str(path))


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> MountConfig:
    path = tmp_path / "config.json"
    path.write_text(text)
    with fluid_mount(path, env or {}) as config:
        return config


def entries(config: MountConfig) -> dict[str, TableEntry]:
    return {entry.path: entry for entry in config.table}


def test_two_mounts_with_secrets_and_shared_options(tmp_path: Path, secrets: Path) -> None:
    text = fluid_config(
        two_mounts(tmp_path), TARGET, secrets, runtime_options={"cache-dir": "/var/cache/pffs"}
    )
    assert text.count("\n") == 1 and text.endswith("}\n")  # one line, as Fluid writes it
    path = tmp_path / "config.json"
    path.write_text(text)
    with fluid_mount(path, {"FLUID_RUNTIME_NS": "ml", "FLUID_RUNTIME_NAME": "imagenet"}) as c:
        credentials = configparser.ConfigParser()
        credentials.read(os.environ[CREDENTIALS_ENV])
        assert dict(credentials["fluid-0"]) == {
            "aws_access_key_id": "AKIAFLUID",
            "aws_secret_access_key": "s3cr3t/+x",
        }
        assert os.stat(os.environ[CREDENTIALS_ENV]).st_mode & 0o077 == 0
        written = os.environ[CREDENTIALS_ENV]
    assert not os.path.exists(written) and CREDENTIALS_ENV not in os.environ
    assert c.fuse.mountpoint == TARGET
    assert c.name == "fluid:ml/imagenet"
    assert c.fuse.read_only, "Fluid's default access mode is ReadOnlyMany"
    assert c.fuse.allow_other, "the mount serves other pods' users"
    assert c.cache.disk_dir == "/var/cache/pffs" and c.cache.disk_bytes == 20 << 30
    train, labels = entries(c)["train"], entries(c)["meta/labels"]
    assert train.source.url == "s3://datasets/imagenet/train"
    assert train.source.endpoint_url == "http://minio.minio:9000"
    assert train.source.region == "eu-west-1" and train.source.profile == "fluid-0"
    assert labels.source.url == f"file://{tmp_path}" and labels.source.profile is None


def test_where_mounts_go_in_the_tree(tmp_path: Path, secrets: Path) -> None:
    # Fluid's rule (pkg/utils/ufs_path_builder.go): an absolute path, else /<name>.
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == ["a"]
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a", "path": "/"}]}
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == [""]
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a"}]}  # no name, no path: the root
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == [""]


def test_read_only_per_mount_and_writable_dataset(tmp_path: Path, secrets: Path) -> None:
    dataset = {
        "accessModes": ["ReadWriteMany"],
        "mounts": [
            {"mountPoint": "s3://bucket-a", "name": "a", "readOnly": True},
            {"mountPoint": "s3://bucket-b", "name": "b"},
        ],
    }
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets))
    assert not config.fuse.read_only
    assert entries(config)["a"].source.read_only and not entries(config)["b"].source.read_only


def test_option_precedence(tmp_path: Path, secrets: Path) -> None:
    """MOUNT_OPTIONS (profile and runtime) < runtimeOptions < a mount's own options."""
    dataset = {
        "accessModes": ["ReadWriteMany"],
        "mounts": [
            {"mountPoint": "s3://bucket-a", "name": "a", "options": {"region": "us-west-2"}},
            {"mountPoint": "s3://bucket-b", "name": "b"},
        ],
    }
    env = {"MOUNT_OPTIONS": "ro,cache-memory=256M,region=eu-central-1,block-size=1M"}
    runtime = {"cache-memory": "1G", "preload": "off", "allow-other": "false"}
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets, runtime), env)
    assert config.fuse.read_only  # `ro`, as Fluid adds for a ReadOnlyMany dataset
    assert config.cache.memory_bytes == 1 << 30 and config.cache.block_size == 1 << 20
    assert not config.dataset.enabled and not config.fuse.allow_other
    assert entries(config)["a"].source.region == "us-west-2"
    assert entries(config)["b"].source.region == "eu-central-1"


def test_mount_options_of_the_variable() -> None:
    assert parse_mount_options("ro,cache-size=1G,allow-other") == {
        "read-only": "true",
        "cache-size": "1G",
        "allow-other": "",
    }
    assert parse_mount_options("") == {}


def test_secret_config_storage_gives_values(tmp_path: Path, secrets: Path) -> None:
    """With THIN_FUSE_CONFIG_STORAGE=secret Fluid writes the values themselves."""
    dataset = {
        "mounts": [
            {
                "mountPoint": "s3://bucket-a",
                "name": "a",
                "options": {"access-key-id": "AKIAPLAIN", "secret-access-key": "plain"},
            }
        ]
    }
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, TARGET, secrets))
    with fluid_mount(path, {}):
        credentials = configparser.ConfigParser()
        credentials.read(os.environ[CREDENTIALS_ENV])
        assert credentials["fluid-0"]["aws_access_key_id"] == "AKIAPLAIN"


def test_shared_credentials_reach_s3_mounts_only(tmp_path: Path, secrets: Path) -> None:
    dataset = two_mounts(tmp_path)
    dataset["sharedEncryptOptions"] = dataset["mounts"][0].pop("encryptOptions")
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets))
    assert entries(config)["train"].source.profile == "fluid-0"
    assert entries(config)["meta/labels"].source.profile is None


def test_the_config_file_of_each_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_config(str(tmp_path / "given.json")) == str(tmp_path / "given.json")
    monkeypatch.setattr(os.path, "exists", lambda p: p.endswith("/config.json"))
    assert find_config(None) == "/etc/fluid/config/config.json"
    monkeypatch.setattr(os.path, "exists", lambda p: p == "/etc/fluid/config.json")
    assert find_config(None) == "/etc/fluid/config.json"
    monkeypatch.setattr(os.path, "exists", lambda p: False)
    with pytest.raises(UsageError, match=r"no Fluid config at /etc/fluid/config/config\.json"):
        find_config(None)


def s3_mount(**fields: Any) -> dict[str, Any]:
    return {"mountPoint": "s3://bucket-a", "name": "a", **fields}


BAD = {
    "malformed JSON": ('{"mounts": [', "is not valid JSON"),
    "not an object": ("[]", "expected a JSON object"),
    "no mounts": ('{"targetPath": "/t"}', "mounts is missing or empty"),
    "no mountPoint": ('{"mounts": [{"name": "a"}], "targetPath": "/t"}', r"mounts\[0\]\.mountPo"),
    "no targetPath": ('{"mounts": [{"mountPoint": "s3://bucket-a"}]}', "targetPath is missing"),
    "readOnly": (
        '{"mounts": [{"mountPoint": "s3://bucket-a", "readOnly": "yes"}], "targetPath": "/t"}',
        r"mounts\[0\]\.readOnly must be true or false",
    ),
    "option not a string": (
        '{"mounts": [{"mountPoint": "s3://bucket-a", "options": {"replication": 3}}], '
        '"targetPath": "/t"}',
        r"mounts\[0\]\.options\.replication must be a string",
    ),
}


@pytest.mark.parametrize("text,message", BAD.values(), ids=BAD.keys())
def test_bad_documents(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load(tmp_path, text)


BAD_DATASETS = {
    "unknown scheme": (
        {"mounts": [s3_mount(mountPoint="pvc://claim")]},
        r"mounts\[0\]\.mountPoint: 'pvc://claim' has pvc://; pffs mounts s3://",
    ),
    "no scheme": ({"mounts": [s3_mount(mountPoint="bucket-a")]}, "has no scheme"),
    "missing secret file": (
        {
            "mounts": [
                s3_mount(
                    encryptOptions=[
                        encrypt("access-key-id", "gone", "id"),
                        encrypt("secret-access-key", "gone", "key"),
                    ]
                )
            ]
        },
        r"mounts\[0\]\.options\.access-key-id: cannot read the secret file .*gone/id",
    ),
    "half the credentials": (
        {"mounts": [s3_mount(encryptOptions=[encrypt("access-key-id", "s3-keys", "accessKeyId")])]},
        r"mounts\[0\]\.options: access-key-id and secret-access-key go together",
    ),
    "unknown option": (
        {"mounts": [s3_mount(options={"acess-key": "x"})]},
        r"mounts\[0\]\.options\.acess-key: unknown option",
    ),
    "bad size": (
        {"mounts": [s3_mount(options={"cache-size": "lots"})]},
        r"mounts\[0\]\.options\.cache-size: 'lots'",
    ),
    "bad per-mount value": (
        {"mounts": [s3_mount(options={"max-concurrency": "-1"})]},
        r"mounts\[0\]\.options\.max-concurrency: '-1' is not a positive integer",
    ),
    "malformed bucket": (
        {"mounts": [s3_mount(mountPoint="s3://B_ad")]},
        r"mounts\[0\] \(/a\): malformed URL",
    ),
    "two mounts at one path": (
        {"mounts": [s3_mount(), s3_mount(mountPoint="s3://bucket-b")]},
        r"mounts\[1\] \(/a\): path /a is already used",
    ),
    "whole-mount options that differ": (
        {
            "mounts": [
                s3_mount(options={"cache-size": "1G"}),
                s3_mount(name="b", options={"cache-size": "2G"}),
            ]
        },
        r"mounts\[1\]\.options\.cache-size: '2G' differs from mounts\[0\]\.options\.cache-size",
    ),
    "profile and credentials": (
        {
            "mounts": [
                s3_mount(
                    options={"profile": "research"},
                    encryptOptions=[
                        encrypt("access-key-id", "s3-keys", "accessKeyId"),
                        encrypt("secret-access-key", "s3-keys", "secretAccessKey"),
                    ],
                )
            ]
        },
        r"mounts\[0\]\.options: give a profile or credentials, not both",
    ),
}


@pytest.mark.parametrize("dataset,message", BAD_DATASETS.values(), ids=BAD_DATASETS.keys())
def test_bad_datasets(tmp_path: Path, secrets: Path, dataset: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load(tmp_path, fluid_config(dataset, TARGET, secrets))


def test_bad_runtime_option_names_its_field(tmp_path: Path, secrets: Path) -> None:
    text = fluid_config({"mounts": [s3_mount()]}, TARGET, secrets, {"metadata-ttl": "soon"})
    with pytest.raises(UsageError, match=r"runtimeOptions\.metadata-ttl: 'soon'"):
        load(tmp_path, text)
    with pytest.raises(UsageError, match=r"MOUNT_OPTIONS\.nope: unknown option"):
        load(tmp_path, text.replace("soon", "60"), {"MOUNT_OPTIONS": "nope=1"})


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, secrets: Path) -> None:
    dataset = {"mounts": [s3_mount(options={"cache-size": "lots"})]}
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, TARGET, secrets))
    for argv in (["fluid", "--config", str(path)], ["fluid", "--check", "--config", "/nope"]):
        result = subprocess.run(
            [sys.executable, "-m", "pffs", *argv], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("pffs: ")


def test_hdfs_mount_options(tmp_path: Path, secrets: Path) -> None:
    options = {"hdfs-user": "hadoop", "replication": "2", "buffer-size": "1M", "cache": "memory"}
    dataset = {
        "accessModes": ["ReadWriteMany"],
        "mounts": [{"mountPoint": "hdfs://namenode:8020/logs", "name": "logs", "options": options}],
    }
    [entry] = load(tmp_path, fluid_config(dataset, TARGET, secrets)).table
    assert (entry.path, entry.source.url, entry.cache) == (
        "logs",
        "hdfs://namenode:8020/logs",
        "memory",
    )
    assert entry.source.hdfs_user == "hadoop" and entry.source.replication == 2
    assert entry.source.buffer_size == 1 << 20 and not entry.source.read_only


def test_profiles_of_the_users_credentials_file_stay(
    tmp_path: Path, secrets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount may name a profile of a credentials file given to the container while another
    has keys of its own: the file pffs writes holds both."""
    own = tmp_path / "aws-credentials"
    own.write_text("[research]\naws_access_key_id = AKIARESEARCH\naws_secret_access_key = r\n")
    monkeypatch.setenv(CREDENTIALS_ENV, str(own))
    dataset = two_mounts(tmp_path)
    dataset["mounts"][1] = {
        "mountPoint": "s3://bucket-b",
        "name": "b",
        "options": {"profile": "research"},
    }
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, TARGET, secrets))
    with fluid_mount(path, {}) as config:
        credentials = configparser.ConfigParser()
        credentials.read(os.environ[CREDENTIALS_ENV])
        assert set(credentials.sections()) == {"research", "fluid-0"}
        assert entries(config)["b"].source.profile == "research"
    assert os.environ[CREDENTIALS_ENV] == str(own)


def test_a_thin_runtime_joins_a_cache_group(tmp_path: Path, secrets: Path) -> None:
    """The `pffs mount` options of a cache group are Fluid runtime options like any other:
    `fuse.options` of the ThinRuntime (or its profile) join the dataset's FUSE pods to a group."""
    (tmp_path / "group-secret").write_text("0123456789abcdef-group\n")
    runtime = {
        "group-members": "k8s://fluid-system/pffs-group",
        "group-listen": "0.0.0.0:7070",
        "group-secret-file": str(tmp_path / "group-secret"),
    }
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets, runtime))
    assert config.group is not None
    assert config.group.members == "k8s://fluid-system/pffs-group"
    assert config.group.listen == "0.0.0.0:7070"
    assert config.group.secret_file == str(tmp_path / "group-secret")
    bad = {**runtime, "group-listen": "nowhere"}
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        load(tmp_path, fluid_config(dataset, TARGET, secrets, bad))

"""`pffs fluid`'s reading of Fluid's config (pffs.cli.fluidconfig), on config files written as
Fluid's controller writes them (tests/fluid_controller.py), secrets as files in a temp dir
(the profile's `--secrets-dir`).

What the profile's policy refuses is in tests/unit/cli/test_fluid_policy.py; the mount itself,
SIGTERM, dead mounts, the liveness check and config changes in tests/mount/test_fluid.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pffs.cli.fluidconfig import find_config, parse_mount_options, read_document, translated
from pffs.cli.fluidpolicy import Policy
from pffs.config import MountConfig, TableEntry
from pffs.credentials import Credentials
from pffs.errors import UsageError
from tests.fluid_controller import fluid_config, write_secret

TARGET = "/runtime-mnt/thin/default/imagenet/thin-fuse"


def encrypt(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def two_mounts(local_dir: Path) -> dict[str, Any]:
    """The Dataset of deploy/fluid/dataset.yaml: an S3 prefix and a directory of the node."""
    return {
        "sharedOptions": {"metadata-ttl": "indefinite"},
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


def policy_for(tmp_path: Path, **fields: Any) -> Policy:
    """The profile's policy of these tests: the temp dir's secrets, and its directories."""
    return Policy(secrets_dir=str(tmp_path / "secrets"), local_roots=(str(tmp_path),), **fields)


def load(
    tmp_path: Path, text: str, env: dict[str, str] | None = None, policy: Policy | None = None
) -> MountConfig:
    """What `pffs fluid` mounts for the config `text`."""
    path = tmp_path / "config.json"
    path.write_text(text)
    return translated(
        read_document(str(path)), env or {}, str(path), policy or policy_for(tmp_path)
    )


def entries(config: MountConfig) -> dict[str, TableEntry]:
    return {entry.path: entry for entry in config.table}


def test_two_mounts_with_secrets_and_shared_options(tmp_path: Path, secrets: Path) -> None:
    text = fluid_config(two_mounts(tmp_path), TARGET, secrets, {"readahead-max": "8M"})
    assert text.count("\n") == 1 and text.endswith("}\n")  # one line, as Fluid writes it
    profile = policy_for(tmp_path, options=("cache-dir=/var/cache/pffs,cache-size=20G",))
    env = {"FLUID_RUNTIME_NS": "ml", "FLUID_RUNTIME_NAME": "imagenet"}
    before = dict(os.environ)
    c = load(tmp_path, text, env, profile)
    assert dict(os.environ) == before, "credentials are values, never the environment"
    assert c.fuse.mountpoint == TARGET
    assert c.name == "fluid:ml/imagenet"
    assert c.fuse.read_only, "Fluid's default access mode is ReadOnlyMany"
    assert c.fuse.allow_other, "the mount serves other pods' users"
    assert c.cache.disk_dir == "/var/cache/pffs" and c.cache.disk_bytes == 20 << 30
    assert c.cache.readahead_max == 8 << 20 and c.meta.dir_ttl > 86400
    train, labels = entries(c)["train"], entries(c)["meta/labels"]
    assert train.source.url == "s3://datasets/imagenet/train"
    assert train.source.endpoint_url == "http://minio.minio:9000"
    assert train.source.region == "eu-west-1" and train.source.profile is None
    assert train.source.credentials == Credentials("AKIAFLUID", "s3cr3t/+x")
    assert "s3cr3t" not in repr(c), "a logged config never shows a secret"
    assert labels.source.url == f"file://{tmp_path}" and labels.source.credentials is None


KEYS = [
    encrypt("access-key-id", "s3-keys", "accessKeyId"),
    encrypt("secret-access-key", "s3-keys", "secretAccessKey"),
]


def with_keys(dataset: dict[str, Any]) -> dict[str, Any]:
    """`dataset` with the test's keys for every mount (sharedEncryptOptions)."""
    return {**dataset, "sharedEncryptOptions": KEYS}


def test_where_mounts_go_in_the_tree(tmp_path: Path, secrets: Path) -> None:
    # Fluid's rule (pkg/utils/ufs_path_builder.go): an absolute path, else /<name>.
    dataset = with_keys({"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]})
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == ["a"]
    dataset["mounts"] = [{"mountPoint": "s3://bucket-a", "name": "a", "path": "/"}]
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == [""]
    dataset["mounts"] = [{"mountPoint": "s3://bucket-a"}]  # no name, no path: the root
    assert list(entries(load(tmp_path, fluid_config(dataset, TARGET, secrets)))) == [""]


def test_read_only_per_mount_and_writable_dataset(tmp_path: Path, secrets: Path) -> None:
    dataset: dict[str, Any] = {
        "sharedEncryptOptions": KEYS,
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
    """The profile's options < MOUNT_OPTIONS (profile and runtime) < runtimeOptions < a mount's
    own options; the profile's whole-mount options stand."""
    dataset: dict[str, Any] = {
        "sharedEncryptOptions": KEYS,
        "accessModes": ["ReadWriteMany"],
        "mounts": [
            {"mountPoint": "s3://bucket-a", "name": "a", "options": {"region": "us-west-2"}},
            {"mountPoint": "s3://bucket-b", "name": "b"},
        ],
    }
    env = {"MOUNT_OPTIONS": "ro,preload=on,region=eu-central-1,block-size=1M"}
    runtime = {"preload": "off", "metadata-ttl": "30"}
    profile = policy_for(
        tmp_path, options=("cache-memory=1G,allow-other=false", "metadata-ttl=10,block-size=2M")
    )
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets, runtime), env, profile)
    assert config.fuse.read_only  # `ro`, as Fluid adds for a ReadOnlyMany dataset
    assert config.cache.memory_bytes == 1 << 30 and config.cache.block_size == 1 << 20
    assert not config.dataset.enabled and not config.fuse.allow_other
    assert config.meta.attr_ttl == 30
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
    [entry] = load(tmp_path, fluid_config(dataset, TARGET, secrets)).table
    assert entry.source.credentials == Credentials("AKIAPLAIN", "plain")


def test_shared_credentials_reach_s3_mounts_only(tmp_path: Path, secrets: Path) -> None:
    dataset = two_mounts(tmp_path)
    dataset["sharedEncryptOptions"] = dataset["mounts"][0].pop("encryptOptions")
    config = load(tmp_path, fluid_config(dataset, TARGET, secrets))
    assert entries(config)["train"].source.credentials == Credentials("AKIAFLUID", "s3cr3t/+x")
    assert entries(config)["meta/labels"].source.credentials is None


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
        r"mounts\[0\]\.mountPoint: 'pvc://claim' has pvc://; a Dataset may name s3://, hdfs://, "
        r"and local://, file://, arrow\+file:// under the profile's --allow-local$",
    ),
    "no scheme": ({"mounts": [s3_mount(mountPoint="bucket-a")]}, "has no scheme"),
    "hdfs without a namenode": (
        {"mounts": [s3_mount(mountPoint="hdfs:///etc")]},
        r"mounts\[0\]\.mountPoint: hdfs:// without a namenode reads the container's default",
    ),
    "hdfs of the default namenode": (
        {"mounts": [s3_mount(mountPoint="hdfs://default/etc")]},
        r"mounts\[0\]\.mountPoint: hdfs:// without a namenode",
    ),
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
        {"mounts": [s3_mount(options={"readahead-max": "lots"})]},
        r"mounts\[0\]\.options\.readahead-max: 'lots'",
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
                s3_mount(options={"metadata-ttl": "10"}),
                s3_mount(name="b", options={"metadata-ttl": "20"}),
            ]
        },
        r"mounts\[1\]\.options\.metadata-ttl: '20' differs from mounts\[0\]\.options\.metadata",
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
    # Mounts without keys are allowed here: these are about other mistakes.
    with pytest.raises(UsageError, match=message):
        load(
            tmp_path,
            fluid_config(dataset, TARGET, secrets),
            {},
            policy_for(tmp_path, node_credentials=True),
        )


def test_bad_runtime_option_names_its_field(tmp_path: Path, secrets: Path) -> None:
    text = fluid_config({"mounts": [s3_mount()]}, TARGET, secrets, {"metadata-ttl": "soon"})
    with pytest.raises(UsageError, match=r"runtimeOptions\.metadata-ttl: 'soon'"):
        load(tmp_path, text)
    with pytest.raises(UsageError, match=r"MOUNT_OPTIONS\.nope: unknown option"):
        load(tmp_path, text.replace("soon", "60"), {"MOUNT_OPTIONS": "nope=1"})


def test_hdfs_mount_options(tmp_path: Path, secrets: Path) -> None:
    write_secret(secrets, "krb", {"ccache": "a ticket cache"})  # its own credentials
    options = {"hdfs-user": "hadoop", "replication": "2", "buffer-size": "1M", "cache": "memory"}
    options["kerberos-ticket-cache"] = str(secrets / "krb" / "ccache")
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


def test_a_named_profile_is_the_nodes_and_keys_stay_values(
    tmp_path: Path, secrets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the profile's --allow-node-credentials a mount may name a profile of the
    container's AWS config while another has keys of its own, as values."""
    own = tmp_path / "aws-credentials"
    own.write_text("[research]\naws_access_key_id = AKIARESEARCH\naws_secret_access_key = r\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(own))
    dataset = two_mounts(tmp_path)
    dataset["mounts"][1] = {
        "mountPoint": "s3://bucket-b",
        "name": "b",
        "options": {"profile": "research"},
    }
    text = fluid_config(dataset, TARGET, secrets)
    config = load(tmp_path, text, {}, policy_for(tmp_path, node_credentials=True))
    assert entries(config)["b"].source.profile == "research"
    assert entries(config)["b"].source.credentials is None
    assert entries(config)["train"].source.credentials == Credentials("AKIAFLUID", "s3cr3t/+x")


def test_the_profile_joins_a_cache_group(tmp_path: Path, secrets: Path) -> None:
    """The `pffs mount` options of a cache group are whole-mount options: the profile's
    `--options` join the dataset's FUSE pods to a group; a ThinRuntime's `fuse.options` may not
    (its secret file and listener are the node's)."""
    (tmp_path / "group-secret").write_text("0123456789abcdef-group\n")
    group = (
        "group-members=k8s://fluid-system/pffs-group,group-listen=0.0.0.0:7070,"
        f"group-secret-file={tmp_path / 'group-secret'},group-handover=120"
    )
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}
    text = fluid_config(dataset, TARGET, secrets)
    config = load(tmp_path, text, {}, policy_for(tmp_path, options=(group,), node_credentials=True))
    assert config.group is not None
    assert str(config.group.members) == "k8s://fluid-system/pffs-group"
    assert config.group.listen == "0.0.0.0:7070"
    assert config.group.secret_file == str(tmp_path / "group-secret")
    assert config.group.handover == 120.0
    bad = group.replace("0.0.0.0:7070", "nowhere")
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        load(tmp_path, text, {}, policy_for(tmp_path, options=(bad,), node_credentials=True))
    runtime = {"group-members": "k8s://fluid-system/pffs-group"}
    with pytest.raises(UsageError, match="only the profile sets this option"):
        load(
            tmp_path,
            fluid_config(dataset, TARGET, secrets, runtime),
            {},
            policy_for(tmp_path, node_credentials=True),
        )

"""Volume attributes to `pffs mount` options, checked through the real option parser: the
preload attribute."""

from __future__ import annotations

import grpc
import pytest

from pffs.cli.options import build_parser, mount_config
from pffs.credentials import Credentials
from pffs.csi import params
from pffs.csi.status import CsiError


def mounted_with(spec: params.VolumeSpec) -> bool:
    argv = ["mount", spec.source, "/mnt/unused", *spec.mount_options()]
    return mount_config(build_parser().parse_args(argv)).dataset.enabled


@pytest.mark.parametrize(("text", "enabled"), [("false", False), ("true", True), ("", True)])
def test_preload_attribute_becomes_the_mount_option(text: str, enabled: bool) -> None:
    spec = params.volume_spec({"source": "s3://bucket/data", "preload": text})
    assert spec.options.get("preload") is (None if text == "" else enabled)
    assert mounted_with(spec) is enabled


def test_preload_attribute_must_be_a_boolean() -> None:
    with pytest.raises(CsiError) as refused:
        params.volume_spec({"source": "s3://bucket/data", "preload": "sometimes"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message == "preload='sometimes' is not true or false"


@pytest.mark.parametrize(
    ("old", "new", "text", "value"),
    [
        ("datasetPrefetch", "preload", "false", False),
        ("prefetchMax", "readaheadMax", "8M", 8 << 20),
    ],
)
def test_former_attribute_names_still_work_with_a_warning(
    old: str, new: str, text: str, value: object, caplog: pytest.LogCaptureFixture
) -> None:
    spec = params.volume_spec({"source": "s3://bucket/data", old: text})
    assert spec.options[new] == value
    assert f"volume attribute {old} is deprecated and will be removed, use {new}" in caplog.text


@pytest.mark.parametrize("value", ["AKIA\n[evil]\ncredential_process = touch /tmp/x", "AK\rIA"])
def test_a_secret_with_a_control_character_is_invalid(value: str) -> None:
    with pytest.raises(CsiError) as refused:
        params.volume_credentials({"accessKeyId": value, "secretAccessKey": "s3cr3t"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message.startswith("secrets: accessKeyId holds a control character")


def test_secrets_become_values() -> None:
    credentials = params.volume_credentials(
        {"accessKeyId": "AKIA", "secretAccessKey": "s3cr3t", "sessionToken": "tok"}
    )
    assert credentials == Credentials("AKIA", "s3cr3t", "tok")
    assert params.volume_credentials({}) is None


def test_cache_group_attribute_joins_the_nodes_group(tmp_path) -> None:
    from pffs.csi.volumes import Volume, VolumeManager

    assert params.volume_spec({"source": "s3://bucket/data"}).cache_group is False
    assert params.volume_spec({"source": "s3://b", "cacheGroup": "true"}).cache_group is True
    with pytest.raises(CsiError) as refused:
        params.volume_spec({"source": "s3://b", "cacheGroup": "maybe"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # A grouped volume on a node whose driver is in no group is refused before any mount.
    manager = VolumeManager(str(tmp_path / "state"), str(tmp_path / "cache"))
    spec = params.volume_spec({"source": "s3://b", "cacheGroup": "true"})
    with pytest.raises(CsiError) as refused:
        manager._spawn(Volume("v1", spec))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"blockSize": "1K"}, "blockSize='1K' is not a block size from 64K to 64M"),
        ({"blockSize": "128M"}, "blockSize='128M' is not a block size from 64K to 64M"),
        (
            {"cacheMemory": "4M"},
            "cacheMemory=4194304 must hold at least two blocks of blockSize=4194304",
        ),
        (
            {"cacheMemory": "64M", "blockSize": "64M"},
            "cacheMemory=67108864 must hold at least two blocks of blockSize=67108864",
        ),
    ],
)
def test_a_value_the_mount_would_refuse_is_refused_at_publish(
    context: dict[str, str], message: str
) -> None:
    # The mount process would exit on these; CSI names the attribute before any process starts.
    with pytest.raises(CsiError) as refused:
        params.volume_spec({"source": "s3://bucket/data", **context})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message == message


def test_a_volume_recorded_before_the_options_were_a_map_reads_the_same() -> None:
    """A driver upgraded over live volumes re-adopts them (csi/volumes.py's state files): each
    option was a field of its own then, named by its dest, the endpoint by its attribute."""
    context = {"source": "s3://b/d", "endpoint": "http://s3.local", "readOnly": "true"}
    context |= {"cacheMemory": "64M", "preload": "false"}
    recorded = {
        "source": "s3://b/d",
        "endpoint": "http://s3.local",
        "region": None,
        "read_only": True,
        "cache_memory": 64 << 20,
        "cache_size": None,
        "readahead_max": None,
        "block_size": None,
        "mount_table": None,
        "preload": False,
        "cache_group": False,
    }
    spec = params.volume_spec(context)
    assert params.VolumeSpec.from_dict(recorded) == spec
    assert params.VolumeSpec.from_dict(spec.as_dict()) == spec

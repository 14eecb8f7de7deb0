"""Volume attributes to `pffs mount` options, checked through the real option parser: the
datasetPrefetch attribute."""

from __future__ import annotations

import grpc
import pytest

from pffs.cli.options import build_parser, mount_config
from pffs.csi import params
from pffs.csi.status import CsiError


def mounted_with(spec: params.VolumeSpec) -> bool:
    argv = ["mount", spec.source, "/mnt/unused", *spec.mount_options()]
    return mount_config(build_parser().parse_args(argv)).dataset.enabled


@pytest.mark.parametrize(("text", "enabled"), [("false", False), ("true", True), ("", True)])
def test_dataset_prefetch_attribute_becomes_the_mount_option(text: str, enabled: bool) -> None:
    spec = params.volume_spec({"source": "s3://bucket/data", "datasetPrefetch": text})
    assert spec.dataset_prefetch is (None if text == "" else enabled)
    assert mounted_with(spec) is enabled


def test_dataset_prefetch_attribute_must_be_a_boolean() -> None:
    with pytest.raises(CsiError) as refused:
        params.volume_spec({"source": "s3://bucket/data", "datasetPrefetch": "sometimes"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message == "datasetPrefetch='sometimes' is not true or false"

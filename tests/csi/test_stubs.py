"""The committed CSI stubs are what csi/proto/generate.py makes; `pffs csi` rejects bad options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pffs.csi.proto import generate
from tests.conftest import run_pffs

# Lines that name the generator's version; they differ between grpcio-tools releases while
# the protocol stays the same.
VERSION_LINE = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,)$", re.M
)


def normalised(path: Path) -> str:
    return VERSION_LINE.sub("", path.read_text(encoding="utf-8"))


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) regenerates stubs")
    for fresh in generate.generate(tmp_path):
        committed = generate.HERE / fresh.name
        assert normalised(fresh) == normalised(committed), (
            f"{committed.name} is stale: run ./dev.sh proto"
        )


def test_wire_names_and_numbers() -> None:
    from pffs.csi.proto import csi_pb2

    publish = csi_pb2.NodePublishVolumeRequest.DESCRIPTOR.fields_by_name
    assert {name: publish[name].number for name in publish} == {
        "volume_id": 1,
        "publish_context": 2,
        "staging_target_path": 3,
        "target_path": 4,
        "volume_capability": 5,
        "readonly": 6,
        "secrets": 7,
        "volume_context": 8,
    }
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert csi_pb2.DESCRIPTOR.services_by_name["Node"].full_name == "csi.v1.Node"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--endpoint", "relative.sock", "--node-id", "n"], "unix:///"),
        (["--endpoint", "unix:///tmp/x.sock"], "--node-id is required"),
        (["--endpoint", "unix:///tmp/x.sock", "--node-id", "n", "--driver-name=bad."], "63"),
        (["--endpoint", "unix:///tmp/x.sock", "--mode", "both"], "invalid choice"),
        (
            ["--endpoint", "unix:///tmp/x.sock", "--node-id", "n", "--group-handover", "-5"],
            "is not a number of seconds from 0 to 86400",
        ),
        (
            ["--endpoint", "unix:///tmp/x.sock", "--node-id", "n", "--group-handover", "60"],
            "--group-handover needs --group-members",
        ),
    ],
)
def test_csi_usage_errors(argv: list[str], message: str) -> None:
    result = run_pffs("csi", *argv, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

"""The calls of csi-sanity's node suite, in its order, against `pffs csi --mode all`.

csi-sanity (kubernetes-csi/csi-test) is a Go binary that cannot be fetched on this machine.
This test walks the same sequence its node and identity tests make, with the answers they
expect, so a regression shows here first; the real suite is expected to pass too (README,
"CSI driver", says how to run it). Volumes come from the controller (CreateVolume) on a moto
server, as csi-sanity creates them when CREATE_DELETE_VOLUME is advertised.
"""

from __future__ import annotations

import re

import grpc
import pytest

from pffs.csi.proto import csi_pb2
from tests.csi.csi_driver import AccessMode, Driver, capability, status_of

pytestmark = [pytest.mark.mount]
# csi-sanity's default access mode for node tests.
WRITER = AccessMode.SINGLE_NODE_WRITER
DOMAIN_NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9.-]{0,61}[a-zA-Z0-9])?$")


def expect(code: grpc.StatusCode, call, request) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        call(request, timeout=60)
    assert status_of(failed.value) == code, failed.value


def test_sanity_node_sequence(driver: Driver, moto, bucket: str) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    # Identity
    info = driver.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert DOMAIN_NAME.match(info.name) and info.vendor_version
    probe = driver.identity.Probe(csi_pb2.ProbeRequest())
    assert not probe.HasField("ready") or probe.ready.value
    # The node suite's setup asks for the controller's capabilities.
    controller_caps = driver.controller.ControllerGetCapabilities(
        csi_pb2.ControllerGetCapabilitiesRequest()
    )
    assert all(c.rpc.type != 0 for c in controller_caps.capabilities)
    node_caps = driver.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert all(c.rpc.type != 0 for c in node_caps.capabilities)
    assert driver.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id

    # csi-sanity makes <mountdir>/target; the parent exists, the target does not.
    mount_dir = driver.kubelet_dir / "csi-mount"
    mount_dir.mkdir()
    target = mount_dir / "target"
    node = driver.node
    expect(
        invalid,
        node.NodePublishVolume,
        csi_pb2.NodePublishVolumeRequest(target_path=str(target)),
    )
    expect(invalid, node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest(volume_id="id"))
    expect(
        invalid,
        node.NodePublishVolume,
        csi_pb2.NodePublishVolumeRequest(volume_id="id", target_path=str(target)),
    )
    expect(
        invalid,
        node.NodeUnpublishVolume,
        csi_pb2.NodeUnpublishVolumeRequest(target_path=str(target)),
    )
    expect(invalid, node.NodeUnpublishVolume, csi_pb2.NodeUnpublishVolumeRequest(volume_id="id"))
    expect(
        invalid,
        node.NodeGetVolumeStats,
        csi_pb2.NodeGetVolumeStatsRequest(volume_path=str(target)),
    )
    expect(invalid, node.NodeGetVolumeStats, csi_pb2.NodeGetVolumeStatsRequest(volume_id="id"))
    expect(
        grpc.StatusCode.NOT_FOUND,
        node.NodeGetVolumeStats,
        csi_pb2.NodeGetVolumeStatsRequest(volume_id="id", volume_path=str(target)),
    )

    # "should work": create, publish, stats, unpublish (target removed), delete.
    created = driver.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name="sanity-node-full-0123456789",
            volume_capabilities=[capability(WRITER)],
            parameters={"baseSource": f"s3://{bucket}/sanity", "endpoint": moto.endpoint_url},
        )
    ).volume
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=created.volume_id,
        target_path=str(target),
        volume_capability=capability(WRITER),
        volume_context=created.volume_context,
    )
    node.NodePublishVolume(publish, timeout=120)
    node.NodePublishVolume(publish, timeout=120)
    stats = node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=created.volume_id, volume_path=str(target))
    )
    for usage in stats.usage:
        assert usage.unit in (csi_pb2.VolumeUsage.BYTES, csi_pb2.VolumeUsage.INODES)
        assert 0 <= usage.used <= usage.total and 0 <= usage.available <= usage.total
    expect(
        grpc.StatusCode.NOT_FOUND,
        node.NodeGetVolumeStats,
        csi_pb2.NodeGetVolumeStatsRequest(
            volume_id=created.volume_id, volume_path=str(mount_dir / "elsewhere")
        ),
    )
    node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=created.volume_id, target_path=str(target))
    )
    assert not target.exists()
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=created.volume_id))

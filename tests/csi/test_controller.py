"""The CSI controller over real gRPC: dynamic provisioning of S3 prefixes on a moto server.

The driver runs with --mode all (tests/csi/csi_driver.py); CreateVolume's volume is then published
on the node side and read through, as the external-provisioner and kubelet would use it.
"""

from __future__ import annotations

import grpc
import pytest

from pffs.csi.proto import csi_pb2
from tests.conftest import fuse_available
from tests.csi.csi_driver import AccessMode, Driver, capability, status_of

GIB = 1 << 30


def create(driver: Driver, name: str, parameters: dict[str, str], size: int = GIB):
    return driver.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=size),
            volume_capabilities=[capability(AccessMode.MULTI_NODE_READER_ONLY)],
            parameters=parameters,
        ),
        timeout=60,
    ).volume


def keys(s3, bucket: str, prefix: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


@pytest.mark.mount  # NodePublishVolume mounts the new volume for real
def test_create_validate_delete_round_trip(driver: Driver, moto, s3, bucket: str) -> None:
    parameters = {
        "baseSource": f"s3://{bucket}/volumes",
        "endpoint": moto.endpoint_url,
        "deleteOnDelete": "true",
        "cacheMemory": "64M",
        "csi.storage.k8s.io/pvc/name": "claim",  # added by the provisioner: ignored
    }
    volume = create(driver, "pvc-1234", parameters)
    assert volume.volume_id.startswith(f"s3://{bucket}/volumes/pvc-1234?endpoint=")
    assert volume.capacity_bytes == GIB
    assert dict(volume.volume_context) == {
        "source": f"s3://{bucket}/volumes/pvc-1234",
        "endpoint": moto.endpoint_url,
        "cacheMemory": "64M",
    }
    assert keys(s3, bucket, "volumes/") == ["volumes/pvc-1234/"]

    # Idempotent by name; other parameters or a larger size under the same name are refused.
    assert create(driver, "pvc-1234", parameters) == volume
    for changed, size in (({**parameters, "deleteOnDelete": "false"}, GIB), (parameters, 2 * GIB)):
        with pytest.raises(grpc.RpcError) as exists:
            create(driver, "pvc-1234", changed, size)
        assert status_of(exists.value) == grpc.StatusCode.ALREADY_EXISTS
    other = create(driver, "pvc/odd name", parameters)
    assert other.volume_id != volume.volume_id
    assert "/" not in other.volume_context["source"].removeprefix(f"s3://{bucket}/volumes/")

    validated = driver.controller.ValidateVolumeCapabilities(
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=volume.volume_id,
            volume_context=volume.volume_context,
            volume_capabilities=[capability(AccessMode.MULTI_NODE_MULTI_WRITER)],
        )
    )
    assert validated.HasField("confirmed")
    block = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=AccessMode.SINGLE_NODE_WRITER),
    )
    refused = driver.controller.ValidateVolumeCapabilities(
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=volume.volume_id, volume_capabilities=[block]
        )
    )
    assert not refused.HasField("confirmed") and "block" in refused.message

    # Data written into the prefix shows up in the volume on a node.
    reason = fuse_available()
    if reason is not None:
        pytest.skip(reason)
    s3.put_object(Bucket=bucket, Key="volumes/pvc-1234/weights.bin", Body=b"w" * 5000)
    target = driver.target("pod-p")
    driver.node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=volume.volume_id,
            target_path=str(target),
            volume_capability=capability(),
            volume_context=volume.volume_context,
        ),
        timeout=120,
    )
    assert (target / "weights.bin").read_bytes() == b"w" * 5000
    driver.unpublish(volume.volume_id, target)

    # deleteOnDelete=true removes every object of the volume; a repeat is OK.
    request = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id)
    driver.controller.DeleteVolume(request)
    assert keys(s3, bucket, "volumes/pvc-1234/") == []
    driver.controller.DeleteVolume(request)
    with pytest.raises(grpc.RpcError) as gone:
        driver.controller.ValidateVolumeCapabilities(
            csi_pb2.ValidateVolumeCapabilitiesRequest(
                volume_id=volume.volume_id, volume_capabilities=[capability()]
            )
        )
    assert status_of(gone.value) == grpc.StatusCode.NOT_FOUND


def test_delete_keeps_data_by_default(driver: Driver, moto, s3, bucket: str) -> None:
    parameters = {"baseSource": f"s3://{bucket}", "endpoint": moto.endpoint_url}
    volume = create(driver, "keep-me", parameters)
    s3.put_object(Bucket=bucket, Key="keep-me/data.txt", Body=b"kept")
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id))
    assert keys(s3, bucket, "keep-me/") == ["keep-me/data.txt"]


def test_controller_errors(driver: Driver, moto, bucket: str) -> None:
    good = {"baseSource": f"s3://{bucket}/v", "endpoint": moto.endpoint_url}
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        ("", good),  # no name
        ("n", {}),  # no baseSource
        ("n", {**good, "baseSauce": "x"}),  # unknown parameter
        ("n", {**good, "deleteOnDelete": "perhaps"}),
        ("n", {**good, "blockSize": "huge"}),
        ("n", {"baseSource": "file:///srv"}),
    ]
    for name, parameters in cases:
        with pytest.raises(grpc.RpcError) as failed:
            create(driver, name, parameters)
        assert status_of(failed.value) == invalid, (name, parameters)
    with pytest.raises(grpc.RpcError) as no_caps:
        driver.controller.CreateVolume(csi_pb2.CreateVolumeRequest(name="n", parameters=good))
    assert status_of(no_caps.value) == invalid
    missing = {"baseSource": "s3://no-such-bucket-xyz/v", "endpoint": moto.endpoint_url}
    with pytest.raises(grpc.RpcError) as no_bucket:
        create(driver, "n", missing)
    assert status_of(no_bucket.value) == grpc.StatusCode.FAILED_PRECONDITION

    with pytest.raises(grpc.RpcError) as no_id:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest())
    assert status_of(no_id.value) == invalid
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="not-ours"))  # OK
    for request in (
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_capabilities=[capability()]),
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=f"s3://{bucket}/v/x"),
    ):
        with pytest.raises(grpc.RpcError) as failed:
            driver.controller.ValidateVolumeCapabilities(request)
        assert status_of(failed.value) == invalid
    with pytest.raises(grpc.RpcError) as unknown:
        driver.controller.ValidateVolumeCapabilities(
            csi_pb2.ValidateVolumeCapabilitiesRequest(
                volume_id="no-such-volume", volume_capabilities=[capability()]
            )
        )
    assert status_of(unknown.value) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as unimplemented:
        driver.controller.ListVolumes(csi_pb2.ListVolumesRequest())
    assert status_of(unimplemented.value) == grpc.StatusCode.UNIMPLEMENTED

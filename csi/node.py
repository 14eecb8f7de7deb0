"""The CSI Node service: publish a volume at a pod's target path, unpublish it, report on it.

Checks the request (the spec's INVALID_ARGUMENT cases, target paths confined to the kubelet
dir) and leaves the mounting to VolumeManager. Stage/Unstage are not offered: one FUSE mount
per volume is shared by all its targets already, so there is nothing to stage.
"""

from __future__ import annotations

import errno
import os

import grpc

from pffs.csi.params import (
    check_capability,
    volume_credentials,
    volume_spec,
)
from pffs.csi.proto import csi_pb2, csi_pb2_grpc
from pffs.csi.status import CsiError, invalid, rpc
from pffs.csi.volumes import Publication, VolumeManager

TOPOLOGY_KEY = "topology.pffs.io/node"
Capability = csi_pb2.NodeServiceCapability
Usage = csi_pb2.VolumeUsage


def confined(path: str, root: str, field: str) -> str:
    """`path` made absolute and checked to lie under `root` (no '..' or symlink escapes)."""
    if not path:
        raise invalid(f"{field} is required")
    if not os.path.isabs(path):
        raise invalid(f"{field} {path!r} is not an absolute path")
    normal = os.path.normpath(path)
    # The parent is resolved (the target itself may not exist yet, or be a dead mount).
    parent = os.path.realpath(os.path.dirname(normal))
    if os.path.commonpath([parent, root]) != root:
        raise invalid(f"{field} {path!r} is outside the kubelet directory {root}")
    return os.path.join(parent, os.path.basename(normal))


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, node_id: str, volumes: VolumeManager, kubelet_dir: str) -> None:
        self.node_id = node_id
        self.volumes = volumes
        self.kubelet_dir = os.path.realpath(kubelet_dir)

    @rpc
    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        kinds = [Capability.RPC.GET_VOLUME_STATS, Capability.RPC.VOLUME_CONDITION]
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[Capability(rpc=Capability.RPC(type=kind)) for kind in kinds]
        )

    @rpc
    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(
            node_id=self.node_id,
            accessible_topology=csi_pb2.Topology(segments={TOPOLOGY_KEY: self.node_id}),
        )

    @rpc
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        if not request.volume_id:
            raise invalid("volume_id is required")
        target = confined(request.target_path, self.kubelet_dir, "target_path")
        if not request.HasField("volume_capability"):
            raise invalid("volume_capability is required")
        capability = request.volume_capability
        check_capability(capability, "volume_capability")
        context_map = dict(request.volume_context)
        spec = volume_spec(context_map)
        credentials = volume_credentials(dict(request.secrets))
        mode = capability.access_mode.mode
        publication = Publication(
            readonly=request.readonly,
            access_mode=mode,
            context=context_map,
        )
        with self.volumes.operation(request.volume_id):
            self.volumes.publish(request.volume_id, target, spec, publication, credentials)
        return csi_pb2.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        if not request.volume_id:
            raise invalid("volume_id is required")
        target = confined(request.target_path, self.kubelet_dir, "target_path")
        with self.volumes.operation(request.volume_id):
            self.volumes.unpublish(request.volume_id, target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    @rpc
    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        if not request.volume_id:
            raise invalid("volume_id is required")
        if not request.volume_path:
            raise invalid("volume_path is required")
        normal = os.path.normpath(request.volume_path)
        # Targets are recorded with their parent resolved, as confined() makes them.
        path = os.path.join(os.path.realpath(os.path.dirname(normal)), os.path.basename(normal))
        if not self.volumes.is_publication(request.volume_id, path):
            raise CsiError(
                grpc.StatusCode.NOT_FOUND,
                f"volume {request.volume_id} is not published at {request.volume_path}",
            )
        try:
            st = os.statvfs(path)
        except OSError as exc:
            if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
                condition = csi_pb2.VolumeCondition(
                    abnormal=True, message=f"the mount is dead: {exc.strerror}"
                )
                return csi_pb2.NodeGetVolumeStatsResponse(volume_condition=condition)
            if exc.errno == errno.ENOENT:
                raise CsiError(grpc.StatusCode.NOT_FOUND, f"{path} does not exist") from None
            raise
        block = st.f_frsize
        usage = [
            Usage(
                unit=Usage.BYTES,
                total=st.f_blocks * block,
                available=st.f_bavail * block,
                used=(st.f_blocks - st.f_bfree) * block,
            ),
            Usage(
                unit=Usage.INODES,
                total=st.f_files,
                available=st.f_favail,
                used=st.f_files - st.f_ffree,
            ),
        ]
        return csi_pb2.NodeGetVolumeStatsResponse(
            usage=usage, volume_condition=csi_pb2.VolumeCondition(abnormal=False, message="ok")
        )

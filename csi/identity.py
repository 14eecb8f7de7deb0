"""The CSI Identity service: the plugin's name, its capabilities, and whether it can work."""

from __future__ import annotations

import os
import shutil

import grpc
from google.protobuf import wrappers_pb2

from pffs.csi.proto import csi_pb2, csi_pb2_grpc
from pffs.csi.status import CsiError, rpc
from pffs.version import __version__

Service = csi_pb2.PluginCapability.Service


def missing_dependencies() -> list[str]:
    """What a node needs to mount FUSE file systems and does not have."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse (load the fuse module; give the container the device)")
    if shutil.which("fusermount3") is None:
        missing.append("fusermount3 (install fuse3)")
    return missing


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def __init__(self, driver_name: str, serves_node: bool) -> None:
        self.driver_name = driver_name
        self.serves_node = serves_node

    @rpc
    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self.driver_name, vendor_version=__version__)

    @rpc
    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        # The same answer from every instance, whatever its --mode (the spec asks for that).
        kinds = [Service.CONTROLLER_SERVICE, Service.VOLUME_ACCESSIBILITY_CONSTRAINTS]
        return csi_pb2.GetPluginCapabilitiesResponse(
            capabilities=[csi_pb2.PluginCapability(service=Service(type=kind)) for kind in kinds]
        )

    @rpc
    def Probe(
        self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ProbeResponse:
        if self.serves_node:
            missing = missing_dependencies()
            if missing:
                raise CsiError(
                    grpc.StatusCode.FAILED_PRECONDITION, "missing: " + "; ".join(missing)
                )
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))

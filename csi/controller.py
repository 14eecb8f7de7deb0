"""The CSI Controller service: CreateVolume / DeleteVolume on S3 and ValidateVolumeCapabilities.

The storage work is in pffs.csi.provision; this module checks requests and applies the spec's
idempotency rules. An instance started with --mode node answers ControllerGetCapabilities with
no capabilities (csi-sanity's node tests ask it) and UNIMPLEMENTED to the rest.
"""

from __future__ import annotations

import threading

import grpc

from pffs.csi.params import check_capability, parse_bool
from pffs.csi.proto import csi_pb2, csi_pb2_grpc
from pffs.csi.provision import (
    S3Store,
    VolumeRef,
    decode_marker,
    segment_for,
    storage_parameters,
)
from pffs.csi.status import CsiError, invalid, log, rpc

Capability = csi_pb2.ControllerServiceCapability


def capacity_of(request: csi_pb2.CreateVolumeRequest) -> int:
    """The capacity to record: object stores have no size, so what was asked for (or 0)."""
    wanted = request.capacity_range
    if wanted.required_bytes < 0 or wanted.limit_bytes < 0:
        raise CsiError(grpc.StatusCode.OUT_OF_RANGE, "capacity_range must not be negative")
    if wanted.limit_bytes and wanted.required_bytes > wanted.limit_bytes:
        raise CsiError(grpc.StatusCode.OUT_OF_RANGE, "required_bytes exceeds limit_bytes")
    return int(wanted.required_bytes or wanted.limit_bytes)


def fits(capacity: int, wanted: csi_pb2.CapacityRange) -> bool:
    """Whether an existing volume of `capacity` bytes satisfies `wanted` (spec idempotency)."""
    if wanted.required_bytes and capacity < wanted.required_bytes:
        return False
    return not (wanted.limit_bytes and capacity > wanted.limit_bytes)


class ControllerService(csi_pb2_grpc.ControllerServicer):
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._guard = threading.Lock()
        self._busy: set[str] = set()

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise CsiError(
                grpc.StatusCode.UNIMPLEMENTED,
                "this instance serves only the node service (start it with --mode controller)",
            )

    def _claim(self, name: str) -> None:
        with self._guard:
            if name in self._busy:
                raise CsiError(grpc.StatusCode.ABORTED, f"an operation on {name} is in progress")
            self._busy.add(name)

    def _release(self, name: str) -> None:
        with self._guard:
            self._busy.discard(name)

    @rpc
    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        kinds = [Capability.RPC.CREATE_DELETE_VOLUME] if self.enabled else []
        return csi_pb2.ControllerGetCapabilitiesResponse(
            capabilities=[Capability(rpc=Capability.RPC(type=kind)) for kind in kinds]
        )

    @rpc
    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeResponse:
        self._require_enabled()
        if not request.name:
            raise invalid("name is required")
        if not request.volume_capabilities:
            raise invalid("volume_capabilities is required")
        for index, capability in enumerate(request.volume_capabilities):
            check_capability(capability, f"volume_capabilities[{index}]")
        if request.HasField("volume_content_source"):
            raise invalid("volume_content_source: pffs volumes cannot be made from a snapshot")
        parameters = storage_parameters(dict(request.parameters))
        capacity = capacity_of(request)
        base = parameters["baseSource"]
        ref = VolumeRef(
            source=f"{base}/{segment_for(request.name)}",
            endpoint=parameters.get("endpoint") or None,
            region=parameters.get("region") or None,
        )
        self._claim(ref.source)
        try:
            store = S3Store(ref, dict(request.secrets))
            existing = store.marker()
            if existing is None:
                store.create_marker(request.name, parameters, capacity)
                log.info("created volume %s for %s", ref.volume_id(), request.name)
            else:
                name, old_parameters, capacity = decode_marker(existing)
                if name != request.name or old_parameters != parameters:
                    raise CsiError(
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"volume {request.name} exists with other parameters",
                    )
                if not fits(capacity, request.capacity_range):
                    raise CsiError(
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"volume {request.name} exists with capacity {capacity}",
                    )
        finally:
            self._release(ref.source)
        volume = csi_pb2.Volume(
            volume_id=ref.volume_id(),
            capacity_bytes=capacity,
            volume_context=ref.volume_context(parameters),
        )
        return csi_pb2.CreateVolumeResponse(volume=volume)

    @rpc
    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeResponse:
        self._require_enabled()
        if not request.volume_id:
            raise invalid("volume_id is required")
        ref = VolumeRef.parse(request.volume_id)
        if ref is None:
            log.info("DeleteVolume: %s is not a volume this driver made", request.volume_id)
            return csi_pb2.DeleteVolumeResponse()  # the spec: a volume that is gone is OK
        self._claim(ref.source)
        try:
            store = S3Store(ref, dict(request.secrets))
            marker = store.marker()
            if marker is None:
                return csi_pb2.DeleteVolumeResponse()
            _, parameters, _ = decode_marker(marker)
            everything = parse_bool("deleteOnDelete", parameters.get("deleteOnDelete", "false"))
            count = store.delete(everything)
            log.info("deleted volume %s (%d objects)", request.volume_id, count)
        finally:
            self._release(ref.source)
        return csi_pb2.DeleteVolumeResponse()

    @rpc
    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        self._require_enabled()
        if not request.volume_id:
            raise invalid("volume_id is required")
        if not request.volume_capabilities:
            raise invalid("volume_capabilities is required")
        ref = VolumeRef.parse(request.volume_id)
        if ref is None or S3Store(ref, dict(request.secrets)).marker() is None:
            raise CsiError(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} not found")
        for index, capability in enumerate(request.volume_capabilities):
            try:
                check_capability(capability, f"volume_capabilities[{index}]")
            except CsiError as exc:
                # Unsupported is answered without `confirmed`, not as an error (spec).
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=exc.message)
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=dict(request.volume_context),
            volume_capabilities=list(request.volume_capabilities),
            parameters=dict(request.parameters),
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

"""`pffs csi`: the CSI driver's gRPC server on a unix socket.

--mode node serves Identity + Node (the DaemonSet on every node), --mode controller serves
Identity + Controller (the provisioner's sidecar), --mode all serves everything (one process,
as csi-sanity and small clusters use it). The server stops on SIGTERM/SIGINT without touching
the volumes' mount processes, which run in their own sessions and are re-adopted on start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

import grpc

from pffs.errors import UsageError
from pffs.optiontable import BY_NAME, add_argument, argtype
from pffs.optionvalues import seconds

if TYPE_CHECKING:
    from pffs.csi.affinity.publisher import NodeCachePublisher

log = logging.getLogger("pffs.csi")
DEFAULT_DRIVER_NAME = "csi.pffs.io"
MODES = ("node", "controller", "all")
# The cache group's options the driver takes, rows of the option table as `pffs mount`'s are
# (the member name is each node's: $NODE_NAME), and where a node's mounts serve peers.
# `pffs mount` options that are the node's: its disk, not a volume's.
NODE_OPTIONS = (BY_NAME["cache-free-ratio"],)
GROUP_OPTIONS = tuple(
    BY_NAME[name]
    for name in (
        "group-members",
        "group-listen",
        "group-secret-file",
        "group-handover",
        "group-principal-secret-file",
    )
)
GROUP_LISTEN = "0.0.0.0:7070"


@dataclass(frozen=True)
class DriverConfig:
    """What `pffs csi` was started with."""

    endpoint: str
    node_id: str
    driver_name: str = DEFAULT_DRIVER_NAME
    mode: str = "all"
    # One disk cache per node for all its volumes: one diskcache index, so the node's cache
    # inventory (what the affinity scheduler reads) is in one place.
    cache_dir: str = "/var/cache/pffs"
    state_dir: str = "/var/lib/pffs-csi"
    # Target paths must lie under it (kubelet hands out .../pods/<uid>/volumes/...).
    kubelet_dir: str = "/var/lib/kubelet"
    # Seconds between looks at the cache for the Node's data-affinity labels; 0 disables.
    publish_interval: float = 10.0
    # The API server for publishing; None means the in-cluster service account (when there).
    kube_api: str | None = None
    # Mount options of the node's own, the operator's alone (no volume attribute sets them):
    # the disk tier's free-space floor on the node's disk ({dest: value}, as parsed).
    node: Mapping[str, object] = field(default_factory=dict)
    # The cache group volumes with cacheGroup "true" join (pffs.group): the values of the
    # driver's GROUP_OPTIONS ({dest: value}, as parsed; None: not given), handed to each such
    # volume's `pffs mount` (its member name is the mount's default, $NODE_NAME).
    group: Mapping[str, object] = field(default_factory=dict)

    def node_options(self) -> list[str]:
        """The `pffs mount` options every volume of this node gets."""
        return [
            arg
            for option in NODE_OPTIONS
            if self.node.get(option.dest) is not None
            for arg in option.argv(self.node[option.dest])
        ]

    def group_options(self) -> list[str]:
        """The `pffs mount` options of a volume in the node's cache group ([] without one)."""
        if not self.group.get("group_members"):
            return []
        return [
            arg
            for option in GROUP_OPTIONS
            if self.group.get(option.dest) is not None
            for arg in option.argv(self.group[option.dest])
        ]

    @property
    def serves_node(self) -> bool:
        return self.mode in ("node", "all")

    @property
    def serves_controller(self) -> bool:
        return self.mode in ("controller", "all")


Parser = TypeVar("Parser", bound=argparse.ArgumentParser)


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    """The `pffs csi` subcommand (hooked into pffs.cli.main)."""
    csi = commands.add_parser(
        "csi",
        help="run the CSI driver (Kubernetes)",
        description="Serve the Container Storage Interface on a unix socket.",
    )
    defaults = DriverConfig(endpoint="", node_id="")
    csi.add_argument("--endpoint", required=True, help="unix:///csi/csi.sock")
    csi.add_argument("--node-id", default="", help="this node's name (required for node|all)")
    csi.add_argument("--driver-name", default=defaults.driver_name, help="(csi.pffs.io)")
    csi.add_argument("--mode", choices=MODES, default=defaults.mode, help="services served (all)")
    csi.add_argument("--cache-dir", default=defaults.cache_dir, help="shared disk cache")
    for option in NODE_OPTIONS:
        add_argument(csi, option)
    csi.add_argument("--state-dir", default=defaults.state_dir, help="volume state, staging")
    csi.add_argument("--kubelet-dir", default=defaults.kubelet_dir, help="target paths root")
    csi.add_argument(
        "--publish-interval",
        type=argtype(seconds),
        default=defaults.publish_interval,
        help="node mode: seconds between updates of this Node's data-affinity labels from the "
        "cache (10; 0 disables; on in a cluster or with --kube-api)",
    )
    csi.add_argument("--kube-api", help="API server URL (default: the in-cluster service account)")
    group = csi.add_argument_group('cache group (volumes with cacheGroup: "true" join it)')
    for option in GROUP_OPTIONS:
        # The same rows as `pffs mount`'s flags; peers reach a node's mounts from other nodes.
        if option.name == "group-listen":
            add_argument(
                group, option, default=GROUP_LISTEN, help=f"{option.help} ({GROUP_LISTEN})"
            )
        else:
            add_argument(group, option)


def config_from_args(args: argparse.Namespace) -> DriverConfig:
    config = DriverConfig(
        endpoint=args.endpoint,
        node_id=args.node_id,
        driver_name=args.driver_name,
        mode=args.mode,
        cache_dir=os.path.abspath(args.cache_dir),
        state_dir=os.path.abspath(args.state_dir),
        kubelet_dir=os.path.abspath(args.kubelet_dir),
        publish_interval=args.publish_interval,
        kube_api=args.kube_api,
        node={option.dest: getattr(args, option.dest) for option in NODE_OPTIONS},
        group={option.dest: getattr(args, option.dest) for option in GROUP_OPTIONS},
    )
    members, secret_file = config.group.get("group_members"), config.group.get("group_secret_file")
    if bool(members) != bool(secret_file):
        raise UsageError("--group-members and --group-secret-file go together")
    for option in GROUP_OPTIONS:
        given = config.group.get(option.dest)
        if not members and given is not None and option.name != "group-listen":
            raise UsageError(f"{option.flag} needs --group-members")
    if config.serves_node and not config.node_id:
        raise UsageError("--node-id is required with --mode node or all")
    name = config.driver_name
    if not (0 < len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()):
        raise UsageError(f"--driver-name {name!r}: at most 63 characters, alphanumeric ends")
    socket_path(config.endpoint)
    return config


def socket_path(endpoint: str) -> str:
    """The socket file of unix:///path (or unix:/path, or a bare absolute path)."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    else:
        path = endpoint
    if not path.startswith("/"):
        raise UsageError(f"--endpoint {endpoint!r}: use unix:///absolute/path.sock")
    return path


def build_server(config: DriverConfig) -> grpc.Server:
    from pffs.csi.controller import ControllerService
    from pffs.csi.identity import IdentityService
    from pffs.csi.node import NodeService
    from pffs.csi.proto import csi_pb2_grpc
    from pffs.csi.volumes import VolumeManager

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    # The generated stubs carry no annotations (the ignores below).
    csi_pb2_grpc.add_IdentityServicer_to_server(  # type: ignore[no-untyped-call]
        IdentityService(config.driver_name, config.serves_node), server
    )
    # The controller service is there in every mode: csi-sanity's node tests and the
    # external-provisioner ask ControllerGetCapabilities; a node-only instance answers none.
    csi_pb2_grpc.add_ControllerServicer_to_server(  # type: ignore[no-untyped-call]
        ControllerService(config.serves_controller), server
    )
    if config.serves_node:
        os.makedirs(config.cache_dir, mode=0o700, exist_ok=True)
        volumes = VolumeManager(
            config.state_dir, config.cache_dir, config.group_options(), config.node_options()
        )
        volumes.recover()
        csi_pb2_grpc.add_NodeServicer_to_server(  # type: ignore[no-untyped-call]
            NodeService(config.node_id, volumes, config.kubelet_dir), server
        )
    path = socket_path(config.endpoint)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)  # a socket left by an earlier run
    server.add_insecure_port(f"unix://{path}")
    return server


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT."""
    config = config_from_args(args)
    server = build_server(config)
    server.start()
    log.info(
        "%s serving %s (mode %s, node %s)",
        config.driver_name,
        config.endpoint,
        config.mode,
        config.node_id or "-",
    )
    publisher = start_publisher(config)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    log.info("stopping; the volumes' mounts stay up and are re-adopted on the next start")
    if publisher is not None:
        publisher.stop()
    server.stop(grace=5).wait()
    return 0


def start_publisher(config: DriverConfig) -> NodeCachePublisher | None:
    """Publish this node's cache contents on its Node object (node mode, in a cluster)."""
    if not config.serves_node or config.publish_interval <= 0:
        return None
    if config.kube_api is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        log.info("not in a Kubernetes cluster and no --kube-api: node labels not published")
        return None
    from pffs.csi.affinity.publisher import NodeCachePublisher
    from pffs.kube import KubeClient, KubeError

    try:
        api = KubeClient.from_url(config.kube_api)
    except KubeError as exc:
        log.warning("node labels not published: %s", exc)
        return None
    publisher = NodeCachePublisher(
        config.node_id, config.cache_dir, api, interval=config.publish_interval
    )
    publisher.start()
    log.info("publishing the cache of node %s every %gs", config.node_id, config.publish_interval)
    return publisher

"""The CSI node service over real gRPC: publish S3 volumes from a moto server, read through them.

A `pffs csi --mode all` driver runs in a subprocess (tests/csi/csi_driver.py) with a temporary
kubelet dir; volumes are real FUSE mounts (one `pffs mount` process per volume) bind mounted
into the targets. No Kubernetes here: the tests play the kubelet's part, making the calls
kubelet makes. csi-sanity (kubernetes-csi/csi-test, a Go binary) cannot be fetched on this
machine; it is expected to pass against `--mode all` (see docs/KUBERNETES.md, "CSI driver"), and
test_sanity_node_sequence walks the calls of its node suite.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import uuid
from pathlib import Path

import grpc
import pytest

from pffs.csi.proto import csi_pb2
from pffs.jobs import preload_order
from pffs.mounting.kernel import FSTYPE, find_mount
from tests.csi.csi_driver import AccessMode, Driver, capability, mount_daemons, running, status_of
from tests.fusecheck import is_dead
from tests.waiting import eventually

pytestmark = [pytest.mark.mount]

CREDENTIAL_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@pytest.fixture
def driver_env() -> dict[str, str]:
    """No credentials in the driver's environment: a mount can only get them from the secrets."""
    return {k: v for k, v in os.environ.items() if k not in CREDENTIAL_NAMES}


@pytest.fixture
def secrets() -> dict[str, str]:
    token = uuid.uuid4().hex
    return {"accessKeyId": f"AKID{token[:12]}", "secretAccessKey": f"secret-{token}"}


@pytest.fixture
def dataset(s3, bucket: str) -> dict[str, bytes]:
    files = {
        "train/a.bin": os.urandom(3 * 1024 * 1024 + 17),
        "train/b.txt": b"hello pffs\n" * 1000,
        "meta.json": json.dumps({"n": 2}).encode(),
    }
    for key, body in files.items():
        s3.put_object(Bucket=bucket, Key=f"data/{key}", Body=body)
    return files


def context_for(moto, bucket: str, **extra: str) -> dict[str, str]:
    return {"source": f"s3://{bucket}/data", "endpoint": moto.endpoint_url, **extra}


def assert_reads(target: Path, files: dict[str, bytes]) -> None:
    for key, body in files.items():
        assert (target / key).read_bytes() == body, key
    assert sorted(os.listdir(target)) == ["meta.json", "train"]


def volume_states(driver: Driver) -> list[dict]:  # type: ignore[type-arg]
    root = driver.state_dir / "volumes"
    return [json.loads((p / "state.json").read_text()) for p in sorted(root.iterdir())]


def test_identity_and_node_info(driver: Driver) -> None:
    info = driver.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "csi.pffs.io" and info.vendor_version
    caps = driver.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    kinds = {c.service.type for c in caps.capabilities}
    assert csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE in kinds
    assert driver.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    node = driver.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert node.node_id == "node-1"
    assert dict(node.accessible_topology.segments) == {"topology.pffs.io/node": "node-1"}
    node_caps = driver.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    rpcs = {c.rpc.type for c in node_caps.capabilities}
    assert csi_pb2.NodeServiceCapability.RPC.GET_VOLUME_STATS in rpcs
    assert csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME not in rpcs
    ctrl = driver.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    assert {c.rpc.type for c in ctrl.capabilities} == {
        csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME
    }


def test_publish_two_targets_share_one_mount(
    driver: Driver, moto, bucket: str, dataset: dict[str, bytes], secrets: dict[str, str]
) -> None:
    context = context_for(moto, bucket, cacheMemory="64M", readaheadMax="8M")
    first, second = driver.target("pod-a"), driver.target("pod-b")
    driver.publish("vol-1", first, context, secrets)
    assert_reads(first, dataset)
    driver.publish("vol-1", first, context, secrets)  # the same publish again: OK
    driver.publish("vol-1", second, context, secrets, readonly=True)
    assert_reads(second, dataset)

    # One mount process for the volume, bound at both targets (same device).
    volumes_dir = str(driver.state_dir / "log")
    daemons = mount_daemons(volumes_dir)
    assert len(daemons) == 1, daemons
    [state] = volume_states(driver)
    assert state["volume_id"] == "vol-1" and sorted(state["targets"]) == sorted(
        [str(first), str(second)]
    )
    assert state["pid"] == daemons[0]
    devices = {find_mount(str(t)).device for t in (first, second)}  # type: ignore[union-attr]
    assert len(devices) == 1

    # The read-only target refuses writes at the kernel; the other lets them reach pffs.
    with pytest.raises(OSError) as refused:
        (second / "new.txt").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS
    # A job there still hands its order over, through .pffs/preload.sock; the socket keeps
    # no unmount below from working.
    assert preload_order(str(second), ["train/b.txt", "nope"]) == ["nope: no such file"]

    # Secrets: values the mount read from a 0600 file of the volume's state, never on its
    # command line, in its environment or in a log.
    pid = daemons[0]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    logs = driver.log() + "".join(
        p.read_text(errors="replace") for p in (driver.state_dir / "log").iterdir()
    )
    for value in secrets.values():
        assert value.encode() not in cmdline and value.encode() not in environ
        assert value not in logs
    secret_files = list((driver.state_dir / "volumes").glob("*/credentials"))
    assert [oct(p.stat().st_mode & 0o777) for p in secret_files] == ["0o600"]

    stats = driver.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id="vol-1", volume_path=str(first))
    )
    assert not stats.volume_condition.abnormal
    assert {u.unit for u in stats.usage} == {csi_pb2.VolumeUsage.BYTES, csi_pb2.VolumeUsage.INODES}

    # Unpublish one: the other target still reads, the process lives on.
    driver.unpublish("vol-1", first)
    assert not first.exists()
    assert_reads(second, dataset)
    assert mount_daemons(volumes_dir) == daemons
    # Unpublish the last: the mount and its process go away.
    driver.unpublish("vol-1", second)
    assert not second.exists()
    eventually(lambda: mount_daemons(volumes_dir) == [], 15, "the mount's process gone")
    assert volume_states(driver) == []
    assert not [e for e in _mounts_under(driver.root)]
    driver.unpublish("vol-1", second)  # again: OK


def _mounts_under(root: Path) -> list[str]:
    from pffs.mounting.kernel import mount_table

    return [e.mountpoint for e in mount_table() if e.mountpoint.startswith(f"{root}/")]


def test_publish_errors(
    driver: Driver, moto, bucket: str, dataset: dict[str, bytes], secrets: dict[str, str]
) -> None:
    context = context_for(moto, bucket)
    target = driver.target("pod-e")

    def code_of(**fields) -> grpc.StatusCode:
        request = csi_pb2.NodePublishVolumeRequest(
            volume_id=fields.get("volume_id", "vol-e"),
            target_path=fields.get("target_path", str(target)),
            volume_context=fields.get("context", context),
            secrets=secrets,
        )
        if fields.get("capability", True):
            request.volume_capability.CopyFrom(fields.get("cap", capability()))
        with pytest.raises(grpc.RpcError) as failed:
            driver.node.NodePublishVolume(request, timeout=60)
        return status_of(failed.value)

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(volume_id="") == invalid
    assert code_of(target_path="") == invalid
    assert code_of(target_path="relative/path") == invalid
    assert code_of(target_path=str(driver.root / "outside" / "mount")) == invalid
    assert code_of(target_path=str(driver.kubelet_dir / ".." / "escape")) == invalid
    assert code_of(capability=False) == invalid
    block = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=AccessMode.SINGLE_NODE_WRITER),
    )
    assert code_of(cap=block) == invalid
    assert code_of(context={"endpoint": moto.endpoint_url}) == invalid  # no source
    assert code_of(context={**context, "cacheSise": "1G"}) == invalid  # a typo is named
    assert code_of(context={**context, "cacheMemory": "lots"}) == invalid
    assert code_of(context={**context, "readOnly": "maybe"}) == invalid
    assert code_of(context={**context, "blockSize": "1K"}) == invalid  # the mount would refuse it
    assert code_of(context={**context, "cacheMemory": "4M"}) == invalid  # two blocks at least
    assert code_of(context={"source": "file:///etc"}) == invalid
    missing_bucket = {"source": "s3://no-such-bucket-here", "endpoint": moto.endpoint_url}
    assert code_of(context=missing_bucket) == grpc.StatusCode.NOT_FOUND
    assert not target.exists() or not os.listdir(target)

    with pytest.raises(grpc.RpcError) as bad_secret:
        driver.publish("vol-e", target, context, {"accessKeyId": "only-the-id"})
    assert status_of(bad_secret.value) == invalid
    with pytest.raises(grpc.RpcError) as unknown_key:
        driver.unpublish("", target)
    assert status_of(unknown_key.value) == invalid
    with pytest.raises(grpc.RpcError) as no_target:
        driver.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-e"))
    assert status_of(no_target.value) == invalid
    driver.unpublish("never-published", driver.target("pod-x"))  # unknown target: OK

    # Incompatible repeats at the same target, single-node modes at a second target.
    driver.publish("vol-e", target, context, secrets)
    with pytest.raises(grpc.RpcError) as again:
        driver.publish("vol-e", target, context, secrets, readonly=True)
    assert status_of(again.value) == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as other_source:
        driver.publish("vol-e", driver.target("pod-f"), {**context, "region": "eu-west-1"}, secrets)
    assert status_of(other_source.value) == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as taken:
        driver.publish("vol-other", target, context, secrets)
    assert status_of(taken.value) == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as single:
        driver.publish(
            "vol-e", driver.target("pod-g"), context, secrets, mode=AccessMode.SINGLE_NODE_WRITER
        )
    assert status_of(single.value) == grpc.StatusCode.FAILED_PRECONDITION

    for volume_id, path in (("vol-e", "/nowhere"), ("unknown", str(target))):
        with pytest.raises(grpc.RpcError) as not_found:
            driver.node.NodeGetVolumeStats(
                csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=path)
            )
        assert status_of(not_found.value) == grpc.StatusCode.NOT_FOUND
    driver.unpublish("vol-e", target)
    assert not target.exists()


def test_restart_readopts_live_mounts_and_revives_dead_ones(
    driver: Driver, moto, bucket: str, dataset: dict[str, bytes], secrets: dict[str, str]
) -> None:
    context = context_for(moto, bucket)
    a1, a2, b1 = driver.target("pod-1"), driver.target("pod-2"), driver.target("pod-3")
    driver.publish("vol-a", a1, context, secrets)
    driver.publish("vol-a", a2, context, secrets)
    driver.publish("vol-b", b1, context, secrets)
    logs = str(driver.state_dir / "log")
    before = sorted(mount_daemons(logs))
    assert len(before) == 2

    # A restart of the driver leaves the mounts alone and adopts them.
    driver.restart()
    assert sorted(mount_daemons(logs)) == before
    assert_reads(a1, dataset)
    assert_reads(b1, dataset)
    driver.publish("vol-a", a1, context, secrets)  # still known: an idempotent repeat

    # While the driver is down: one bind of vol-a goes away (its count must drop to 1) and
    # vol-b's mount process dies, leaving "Transport endpoint is not connected" behind.
    driver.stop()
    assert os.system(f"umount {a2}") == 0
    b_state = next(s for s in volume_states(driver) if s["volume_id"] == "vol-b")
    os.kill(b_state["pid"], signal.SIGKILL)
    # At once, though the kernel still holds the root's attributes (is_dead asks with statfs).
    eventually(lambda: is_dead(str(b1)), 10, f"{b1} seen dead")

    driver.start()
    states = {s["volume_id"]: s for s in volume_states(driver)}
    assert list(states["vol-a"]["targets"]) == [str(a1)]
    assert states["vol-b"]["pid"] != b_state["pid"]
    assert not is_dead(str(b1))
    assert_reads(b1, dataset)  # mounted again with the saved credentials, bound again
    entry = find_mount(str(b1))
    assert entry is not None and entry.fstype == FSTYPE
    assert "clearing dead mount" in driver.log()

    # The recovered counts drive unpublish: the last target of each volume ends its mount.
    driver.unpublish("vol-a", a2)  # not mounted any more: OK
    driver.unpublish("vol-a", a1)
    driver.unpublish("vol-b", b1)
    eventually(lambda: mount_daemons(logs) == [], 15, "every mount's process gone")
    assert _mounts_under(driver.root) == []


def test_probe_fails_without_fusermount(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    with running(tmp_path, env={**os.environ, "PATH": str(empty_bin)}) as d:
        with pytest.raises(grpc.RpcError) as failed:
            d.identity.Probe(csi_pb2.ProbeRequest())
        assert status_of(failed.value) == grpc.StatusCode.FAILED_PRECONDITION
        assert "fusermount3" in failed.value.details()


def test_node_publishes_its_cache_for_the_scheduler(
    tmp_path: Path, moto, bucket: str, dataset: dict[str, bytes]
) -> None:
    """After a pod reads a volume, the node's labels say it holds that dataset.

    The Node lives in tests/csi/kube_apiserver.py, a stand-in for the API server (none runs here).
    """
    from pffs.csi.affinity.labels import CACHE_ANNOTATION, dataset_id, decode_annotation, label_key
    from tests.csi.kube_apiserver import FakeApiServer

    with FakeApiServer() as api:
        api.add_node("node-1", {}, {})
        args = ("--kube-api", api.url, "--publish-interval", "0.3")
        with running(tmp_path, extra_args=args) as driver:
            context = context_for(moto, bucket)
            target = driver.target("pod-a")
            driver.publish("vol-1", target, context, {})
            assert_reads(target, dataset)
            wanted = label_key(dataset_id(context))

            def labelled() -> bool:
                metadata = api.nodes["node-1"]["metadata"]
                return bool(metadata.get("labels", {}).get(wanted) == "true")

            eventually(labelled, 30, f"the {wanted} label on the node")
            metadata = api.nodes["node-1"]["metadata"]
            published = decode_annotation(metadata["annotations"][CACHE_ANNOTATION])
            assert dataset_id(context) in published, published
            driver.unpublish("vol-1", target)


def test_mount_table_volume(
    driver: Driver, moto, s3, bucket: str, dataset: dict[str, bytes], secrets: dict[str, str]
) -> None:
    """A volume of two sources in one tree; file:// entries are refused through CSI."""
    s3.put_object(Bucket=bucket, Key="logs/run.log", Body=b"epoch 1\n")
    table = f"""
[[mount]]
path = "/dataset"
source = "s3://{bucket}/data"
read_only = true

[[mount]]
path = "/logs"
source = "s3://{bucket}/logs"
"""
    context = {"mountTable": table, "endpoint": moto.endpoint_url}
    target = driver.target("pod-t")
    driver.publish("vol-t", target, context, secrets)
    try:
        assert sorted(os.listdir(target)) == ["dataset", "logs"]
        assert_reads(target / "dataset", dataset)
        assert (target / "logs/run.log").read_bytes() == b"epoch 1\n"
    finally:
        driver.unpublish("vol-t", target)
    table_files = list((driver.state_dir / "volumes").glob("*/pffs.toml"))
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in table_files)

    bad = {"mountTable": '[[mount]]\npath = "/etc"\nsource = "file:///etc"\n'}
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id="vol-bad",
        target_path=str(driver.target("pod-u")),
        volume_context=bad,
        volume_capability=capability(),
    )
    with pytest.raises(grpc.RpcError) as failed:
        driver.node.NodePublishVolume(request, timeout=60)
    assert status_of(failed.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "file://" in failed.value.details()

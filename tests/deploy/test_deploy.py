"""deploy/: the manifests, checked against the code (the Helm chart: test_chart.py; the image
recipe and the systemd unit: test_image.py).

What is checked here: every manifest (and the chart, rendered by the real `helm template`)
against the Kubernetes 1.31 schemas with kubernetes-validate (strict: unknown fields fail);
that the kustomizations cover every file and render (`kubectl kustomize`); that the chart at its
default values renders exactly deploy/kubernetes; that each pffs container's args are accepted
by pffs's own parser and agree with the volumes, sockets, ports and names the code uses; that
the example volumes, StorageClass and secret pass the CSI driver's own checks; that the RBAC
rules allow every API call the extender and the node publisher really make (recorded on a
stand-in API server over HTTP) and nothing more.

What cannot be checked on this machine: no Kubernetes API
server or kubelet (nothing is applied; the sidecar images are not pulled, so their flags are
as documented by their projects, not tested). helm and kubectl come from dev.sh setup; without
them the rendering tests skip with that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from pffs.cli import options
from pffs.csi import params, provision
from pffs.csi.affinity.extender import parse_listen
from pffs.csi.affinity.publisher import NodeCachePublisher
from pffs.csi.affinity.scoring import REQUIRE, pod_mode
from pffs.csi.server import DEFAULT_DRIVER_NAME, DriverConfig, config_from_args, socket_path
from pffs.kube import KubeClient
from pffs.testing.servers import free_port, wait_for_port
from pffs.version import __version__
from tests.csi.kube_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "pffs"
KUBE_VERSION = "1.31.0"  # the kube-scheduler image's minor version
VENV_BIN = Path(sys.executable).parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

Doc = dict[str, Any]


def _tool(name: str) -> str | None:
    found = VENV_BIN / name
    return str(found) if found.exists() else shutil.which(name)


HELM, KUBECTL = _tool("helm"), _tool("kubectl")
requires_helm = pytest.mark.skipif(HELM is None, reason="helm is missing (./dev.sh setup)")
requires_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is missing (./dev.sh setup)")


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


BASE = by_key([d for p in manifest_files() if p.parent == K8S for d in load(p)])
EXAMPLES = by_key([d for p in manifest_files() if p.parent == K8S / "examples" for d in load(p)])


def container(workload: Doc, name: str) -> Doc:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def volume_for(workload: Doc, mount_path: str, container_name: str) -> tuple[Doc, Doc]:
    """(volumeMount, volume) of the container's mount at `mount_path`."""
    mounts = container(workload, container_name)["volumeMounts"]
    mount = next(m for m in mounts if m["mountPath"] == mount_path)
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return mount, next(v for v in volumes if v["name"] == mount["name"])


def pffs_args(c: Doc) -> argparse.Namespace:
    """A pffs container's args parsed by pffs's own CLI parser ($(VAR) from its env)."""
    env = {e["name"]: e for e in c.get("env", [])}
    args = []
    for arg in c["args"]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            assert var in env, f"{c['name']}: $({var}) has no env entry"
            arg = arg.replace(f"$({var})", f"value-of-{var}")
        args.append(arg)
    return options.build_parser().parse_args(args)


def flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} in {args}"
    return values[0]


# --- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    docs = load(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The validation above can fail: a misspelt field and a wrong type are errors."""
    daemonset = json.loads(json.dumps(BASE[("DaemonSet", "pffs-csi-node")]))
    daemonset["spec"]["template"]["spec"]["containers"][0]["mountPropgation"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSION, strict=True)
    driver = json.loads(json.dumps(BASE[("CSIDriver", DEFAULT_DRIVER_NAME)]))
    driver["spec"]["attachRequired"] = "no"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(driver, KUBE_VERSION, strict=True)


def test_kustomizations_list_every_manifest_once() -> None:
    listed: list[Path] = []
    for kustomization in (K8S / "kustomization.yaml", K8S / "examples" / "kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        assert doc["kind"] == "Kustomization"
        listed += [kustomization.parent / r for r in doc["resources"]]
    assert sorted(listed) == manifest_files()


@requires_kubectl
@pytest.mark.parametrize("directory", [K8S, K8S / "examples"], ids=["base", "examples"])
def test_kustomize_renders_the_manifests(directory: Path) -> None:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    rendered = by_key([d for d in yaml.safe_load_all(out) if d])
    assert rendered == (BASE if directory == K8S else EXAMPLES)


# --- the CSI driver ----------------------------------------------------------------------------


def test_driver_name_is_the_codes_everywhere() -> None:
    name = DEFAULT_DRIVER_NAME
    driver = BASE[("CSIDriver", name)]["spec"]
    assert driver["attachRequired"] is False and driver["podInfoOnMount"] is True
    assert EXAMPLES[("StorageClass", "pffs")]["provisioner"] == name
    assert EXAMPLES[("PersistentVolume", "pffs-imagenet")]["spec"]["csi"]["driver"] == name
    for workload, mode in (("DaemonSet", "node"), ("Deployment", "controller")):
        plugin = container(BASE[(workload, f"pffs-csi-{mode}")], "pffs-plugin")
        assert pffs_args(plugin).driver_name == name


def test_node_plugin_args_volumes_and_sidecars_agree() -> None:
    daemonset = BASE[("DaemonSet", "pffs-csi-node")]
    plugin = container(daemonset, "pffs-plugin")
    args = pffs_args(plugin)
    assert args.command == "csi" and args.mode == "node"
    config = config_from_args(args)  # the checks `pffs csi` itself makes at start
    assert plugin["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert args.node_id == "value-of-NODE_NAME"
    assert args.publish_interval > 0  # publishing for the scheduler extender is on

    # The manifests use the code's defaults (docs/KUBERNETES.md's table), so `pffs csi` run by
    # hand and in the cluster agree; each directory is the same path on the host and in the
    # container.
    defaults = DriverConfig(endpoint="", node_id="")
    for path, default in (
        (config.cache_dir, defaults.cache_dir),
        (config.state_dir, defaults.state_dir),
        (config.kubelet_dir, defaults.kubelet_dir),
    ):
        assert path == default
        _, volume = volume_for(daemonset, path, "pffs-plugin")
        assert volume["hostPath"]["path"] == path
    for path in (config.kubelet_dir, config.state_dir):
        mount, _ = volume_for(daemonset, path, "pffs-plugin")
        assert mount["mountPropagation"] == "Bidirectional"
    _, fuse = volume_for(daemonset, "/dev/fuse", "pffs-plugin")
    assert fuse["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    security = plugin["securityContext"]
    assert security["privileged"] is True and security["runAsUser"] == 0
    assert plugin["resources"]["requests"] and plugin["resources"]["limits"]

    # The socket: the plugin's endpoint, the sidecars' --csi-address, the kubelet's path.
    sock = socket_path(config.endpoint)
    assert sock == "/csi/csi.sock"
    _, socket_volume = volume_for(daemonset, os.path.dirname(sock), "pffs-plugin")
    host_socket = f"{socket_volume['hostPath']['path']}/{os.path.basename(sock)}"
    assert host_socket == f"{config.kubelet_dir}/plugins/{config.driver_name}/csi.sock"
    registrar = container(daemonset, "node-driver-registrar")
    assert flag(registrar["args"], "--csi-address") == sock
    assert flag(registrar["args"], "--kubelet-registration-path") == host_socket
    _, registration = volume_for(daemonset, "/registration", "node-driver-registrar")
    assert registration["hostPath"]["path"] == f"{config.kubelet_dir}/plugins_registry"
    probe = container(daemonset, "liveness-probe")
    assert flag(probe["args"], "--csi-address") == sock
    port = next(
        p for p in plugin["ports"] if p["name"] == plugin["livenessProbe"]["httpGet"]["port"]
    )
    assert flag(probe["args"], "--health-port") == str(port["containerPort"])
    for sidecar in (registrar, probe):
        assert volume_for(daemonset, "/csi", sidecar["name"])[1] == socket_volume


def test_controller_args_and_socket_agree() -> None:
    deployment = BASE[("Deployment", "pffs-csi-controller")]
    plugin = container(deployment, "pffs-plugin")
    config = config_from_args(pffs_args(plugin))
    assert config.mode == "controller" and config.serves_controller and not config.serves_node
    sock = socket_path(config.endpoint)
    provisioner = container(deployment, "csi-provisioner")
    assert flag(provisioner["args"], "--csi-address") == sock
    assert volume_for(deployment, os.path.dirname(sock), "csi-provisioner")[1]["emptyDir"] == {}
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_images_are_the_projects_version() -> None:
    version = __version__
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    pffs_images = set()
    for doc in BASE.values():
        if doc["kind"] in ("DaemonSet", "Deployment"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("ghcr.io/pffs/"):
                    pffs_images.add(c["image"])
                    assert c.get("command") is None, "the image's ENTRYPOINT (tini) must stay"
                    pffs_args(c)  # every pffs container's args are a pffs command line
    assert pffs_images == {f"ghcr.io/pffs/pffs:{version}"}


# --- examples: what the driver itself would say of them ----------------------------------------


def test_example_volumes_pass_the_drivers_checks() -> None:
    secret = EXAMPLES[("Secret", "pffs-s3-credentials")]
    credentials = params.volume_credentials(secret["stringData"])
    assert credentials is not None and credentials.session_token is None
    pv = EXAMPLES[("PersistentVolume", "pffs-imagenet")]["spec"]["csi"]
    spec = params.volume_spec(pv["volumeAttributes"])
    assert spec.source == "s3://datasets/imagenet" and spec.options["readOnly"]
    sc = EXAMPLES[("StorageClass", "pffs")]
    own = provision.storage_parameters(sc["parameters"])
    assert own["baseSource"] == "s3://my-bucket/volumes"
    secret_ref = (secret["metadata"]["name"], secret["metadata"]["namespace"])
    assert (pv["nodePublishSecretRef"]["name"], pv["nodePublishSecretRef"]["namespace"]) == (
        secret_ref
    )
    for use in ("provisioner", "node-publish"):
        name = sc["parameters"][f"csi.storage.k8s.io/{use}-secret-name"]
        namespace = sc["parameters"][f"csi.storage.k8s.io/{use}-secret-namespace"]
        assert (name, namespace) == secret_ref
    # The provisioner may read that one secret and no other.
    role = BASE[("Role", "pffs-csi-provisioner")]
    [secrets_rule] = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets_rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": [secret_ref[0]],
        "verbs": ["get"],
    }
    assert role["metadata"]["namespace"] == secret_ref[1]
    claim = EXAMPLES[("PersistentVolumeClaim", "checkpoints")]
    assert claim["spec"]["storageClassName"] == sc["metadata"]["name"]


def test_training_job_uses_the_scheduler_and_the_claims() -> None:
    job = EXAMPLES[("Job", "train-resnet")]
    pod = job["spec"]["template"]
    assert pod_mode(pod) == REQUIRE
    profiles = _scheduler_config()["profiles"]
    assert pod["spec"]["schedulerName"] in {p["schedulerName"] for p in profiles}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]}
    assert claims == {"imagenet", "checkpoints"}
    assert all(("PersistentVolumeClaim", c) in EXAMPLES for c in claims)


# --- scheduler extender and its scheduler --------------------------------------------------------


def _scheduler_config() -> Doc:
    config: Doc = yaml.safe_load(
        BASE[("ConfigMap", "pffs-scheduler-config")]["data"]["config.yaml"]
    )
    return config


# Go field names of kube-scheduler's Extender (kubescheduler.config.k8s.io/v1).
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}


def test_scheduler_configuration_points_at_the_extender_service() -> None:
    config = _scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= {"apiVersion", "kind", "leaderElection", "profiles", "extenders"}
    [extender] = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True
    url = urlsplit(extender["urlPrefix"])
    service = BASE[("Service", "pffs-scheduler-extender")]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert url.hostname == f"{name}.{namespace}.svc"
    [port] = service["spec"]["ports"]
    assert url.port == port["port"]
    deployment = BASE[("Deployment", "pffs-scheduler-extender")]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    ext = container(deployment, "extender")
    named = {p["name"]: p["containerPort"] for p in ext["ports"]}
    args = pffs_args(ext)
    assert args.command == "scheduler-extender"
    assert parse_listen(args.listen)[1] == named[port["targetPort"]]
    # kube-scheduler reads the config from the mounted ConfigMap.
    scheduler = BASE[("Deployment", "pffs-scheduler")]
    command = container(scheduler, "kube-scheduler")["command"]
    mount, volume = volume_for(scheduler, "/etc/pffs-scheduler", "kube-scheduler")
    assert volume["configMap"]["name"] == "pffs-scheduler-config"
    assert flag(command, "--config") == f"{mount['mountPath']}/config.yaml"


def test_only_the_scheduler_reaches_the_extender() -> None:
    """The extender binds every interface (spelled out: `:PORT` alone is 127.0.0.1, which the
    Service could not reach), and its NetworkPolicy admits only the pffs-scheduler's pods to
    its named port."""
    deployment = BASE[("Deployment", "pffs-scheduler-extender")]
    ext = container(deployment, "extender")
    assert parse_listen(pffs_args(ext).listen)[0] == "0.0.0.0"
    policy = BASE[("NetworkPolicy", "pffs-scheduler-extender")]
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert (
        spec["podSelector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"]
    )
    [rule] = spec["ingress"]
    [source] = rule["from"]
    scheduler = BASE[("Deployment", "pffs-scheduler")]
    assert source == {
        "podSelector": {"matchLabels": scheduler["spec"]["template"]["metadata"]["labels"]}
    }
    [port] = rule["ports"]
    assert port["port"] in {p["name"] for p in ext["ports"]}


def test_the_metrics_policy_admits_prometheus_to_the_metrics_port_only() -> None:
    policy = EXAMPLES[("NetworkPolicy", "pffs-metrics")]["spec"]
    [rule] = policy["ingress"]
    assert [p["port"] for p in rule["ports"]] == [9567]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert policy["podSelector"]["matchLabels"] == {"pffs.io/metrics": "true"}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        pv = EXAMPLES[("PersistentVolume", "pffs-imagenet")]
        claim = EXAMPLES[("PersistentVolumeClaim", "imagenet")]
        server.add_pffs_claim(
            claim["metadata"]["namespace"],
            claim["metadata"]["name"],
            pv["metadata"]["name"],
            pv["spec"]["csi"]["volumeAttributes"],
        )
        server.add_node("node-1")
        yield server


def _post(url: str, body: Doc) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _rules_allow(rules: list[Doc], verb: str, resource: str) -> bool:
    return any(
        "" in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def _api_calls(api: FakeApiServer) -> set[tuple[str, str]]:
    """(verb, resource) of the recorded requests, as RBAC names them."""
    calls = set()
    for method, path, _, _ in api.requests:
        parts = urlsplit(path).path.strip("/").split("/")[2:]  # after api/v1
        if parts[0] == "namespaces":
            parts = parts[2:]
        named = len(parts) > 1
        verb = {"GET": "get" if named else "list", "PATCH": "patch"}[method]
        calls.add((verb, parts[0]))
    return calls


def test_extender_runs_as_deployed_and_rbac_allows_exactly_its_calls(api: FakeApiServer) -> None:
    """The extender started with the Deployment's args (on a free port, with the stand-in API
    server instead of the in-cluster one) answers the verbs of the scheduler configuration."""
    ext = container(BASE[("Deployment", "pffs-scheduler-extender")], "extender")
    port = free_port()
    args = [a for a in ext["args"] if not a.startswith("--listen")]
    args += [f"--listen=127.0.0.1:{port}", f"--api={api.url}"]
    options.build_parser().parse_args(args)
    proc = subprocess.Popen([sys.executable, "-m", "pffs", *args], stderr=subprocess.PIPE)
    try:
        wait_for_port(port)
        config = _scheduler_config()["extenders"][0]
        base = f"http://127.0.0.1:{port}{urlsplit(config['urlPrefix']).path}"
        probe = ext["readinessProbe"]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe}", timeout=10) as r:
            assert r.status == 200
        pod = {
            "metadata": {"name": "p", "namespace": "default", "annotations": {}},
            "spec": EXAMPLES[("Job", "train-resnet")]["spec"]["template"]["spec"],
        }
        names = {"Pod": pod, "Nodes": None, "NodeNames": ["node-1", "node-2"]}
        filtered = _post(f"{base}/{config['filterVerb']}", names)
        assert filtered["NodeNames"] == ["node-1", "node-2"] and not filtered.get("Error")
        scores = _post(f"{base}/{config['prioritizeVerb']}", names)
        assert [s["Host"] for s in scores] == ["node-1", "node-2"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    calls = _api_calls(api)
    assert ("get", "persistentvolumeclaims") in calls and ("list", "nodes") in calls
    rules = BASE[("ClusterRole", "pffs-scheduler-extender")]["rules"]
    assert all(_rules_allow(rules, verb, resource) for verb, resource in calls), calls
    granted = {(v, res) for r in rules for res in r["resources"] for v in r["verbs"]}
    # get nodes: the extender's KubeClient may read single nodes (docs/KUBERNETES.md:
    # "get ... nodes").
    assert granted <= calls | {("get", "nodes")}


def test_node_publisher_rbac_allows_exactly_its_calls(tmp_path: Path, api: FakeApiServer) -> None:
    publisher = NodeCachePublisher(
        "node-1", str(tmp_path / "cache"), KubeClient(api.url), list_totals=False
    )
    publisher.publish_once(force=True)
    calls = _api_calls(api)
    assert calls == {("get", "nodes"), ("patch", "nodes")}
    rules = BASE[("ClusterRole", "pffs-csi-node")]["rules"]
    granted = {(v, res) for r in rules for res in r["resources"] for v in r["verbs"]}
    assert granted == calls


# --- the Helm chart ------------------------------------------------------------------------------


def test_documented_kubernetes_examples_are_valid() -> None:
    """The YAML of docs/KUBERNETES.md's install section: valid objects naming the real driver."""
    page = (ROOT / "docs" / "KUBERNETES.md").read_text()
    section = page[page.index("## Installing in a cluster") : page.index("## CSI driver")]
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    docs = [yaml.safe_load(block) for block in blocks]
    assert {d["kind"] for d in docs} == {"StorageClass", "Pod"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    [sc] = [d for d in docs if d["kind"] == "StorageClass"]
    assert sc["provisioner"] == DEFAULT_DRIVER_NAME
    provision.storage_parameters(sc["parameters"])
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    assert pod["spec"]["schedulerName"] == _scheduler_config()["profiles"][0]["schedulerName"]
    assert pod_mode(pod) == REQUIRE

"""deploy/helm/pffs: the Helm chart rendered by the real `helm template`, checked against the
Kubernetes schemas and against what the code accepts: at its defaults it renders exactly
deploy/kubernetes; its values reach the containers' args and volumes consistently; its switches
add or drop their optional objects (the extender's NetworkPolicy, metrics, a cache group). The
manifests themselves: test_deploy.py. Without helm (./dev.sh setup) these skip with that reason.
"""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit

import kubernetes_validate
import yaml

from pffs.cli import options
from pffs.csi.affinity.extender import parse_listen
from pffs.csi.server import config_from_args
from tests.deploy.test_deploy import (
    BASE,
    CHART,
    EXAMPLES,
    HELM,
    KUBE_VERSION,
    Doc,
    by_key,
    container,
    flag,
    pffs_args,
    requires_helm,
    volume_for,
)


def helm_template(*values: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    command = [HELM, "template", "pffs", str(CHART), "--namespace", "kube-system"]
    for value in values:
        command += ["--set", value]
    return subprocess.run(command, capture_output=True, text=True, check=check)


def rendered(*values: str) -> dict[tuple[str, str], Doc]:
    return by_key([d for d in yaml.safe_load_all(helm_template(*values).stdout) if d])


@requires_helm
def test_chart_lints_and_renders_the_manifests_at_its_defaults() -> None:
    assert HELM is not None
    lint = subprocess.run([HELM, "lint", str(CHART)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = rendered()
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert docs == BASE


@requires_helm
def test_chart_values_reach_args_and_volumes_consistently() -> None:
    docs = rendered(
        "cache.dir=/mnt/nvme/pffs",
        "kubeletDir=/data/kubelet",
        "image.repository=registry.example.com/pffs",
        "image.tag=dev",
        "extender.port=9999",
        "publishInterval=0",
    )
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    daemonset = docs[("DaemonSet", "pffs-csi-node")]
    plugin = container(daemonset, "pffs-plugin")
    assert plugin["image"] == "registry.example.com/pffs:dev"
    config = config_from_args(pffs_args(plugin))
    assert (config.cache_dir, config.kubelet_dir, config.publish_interval) == (
        "/mnt/nvme/pffs",
        "/data/kubelet",
        0,
    )
    for path in (config.cache_dir, config.kubelet_dir):
        assert volume_for(daemonset, path, "pffs-plugin")[1]["hostPath"]["path"] == path
    registrar = container(daemonset, "node-driver-registrar")
    assert flag(registrar["args"], "--kubelet-registration-path") == (
        "/data/kubelet/plugins/csi.pffs.io/csi.sock"
    )
    ext = container(docs[("Deployment", "pffs-scheduler-extender")], "extender")
    assert parse_listen(pffs_args(ext).listen)[1] == 9999
    url = yaml.safe_load(docs[("ConfigMap", "pffs-scheduler-config")]["data"]["config.yaml"])
    assert urlsplit(url["extenders"][0]["urlPrefix"]).port == 9999


@requires_helm
def test_chart_switches_and_optional_objects() -> None:
    off = rendered("extender.enabled=false", "controller.enabled=false")
    kinds = {key for key in off}
    assert ("Deployment", "pffs-scheduler-extender") not in kinds
    assert ("Deployment", "pffs-scheduler") not in kinds  # no scheduler without its extender
    assert ("Deployment", "pffs-csi-controller") not in kinds
    assert ("ClusterRole", "pffs-csi-provisioner") not in kinds
    assert ("DaemonSet", "pffs-csi-node") in kinds

    example_sc = EXAMPLES[("StorageClass", "pffs")]
    docs = rendered(
        "storageClass.create=true",
        f"storageClass.baseSource={example_sc['parameters']['baseSource']}",
        f"storageClass.endpoint={example_sc['parameters']['endpoint']}",
        f"storageClass.region={example_sc['parameters']['region']}",
        "credentials.create=true",
        "credentials.accessKeyId=REPLACE-WITH-ACCESS-KEY-ID",
        "credentials.secretAccessKey=REPLACE-WITH-SECRET-ACCESS-KEY",
    )
    for key in (("StorageClass", "pffs"), ("Secret", "pffs-s3-credentials")):
        doc = docs[key]
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        doc["metadata"].pop("labels")
        assert doc == EXAMPLES[key]

    assert ("NetworkPolicy", "pffs-scheduler-extender") not in rendered(
        "extender.networkPolicy=false"
    )
    metrics = rendered("metricsNetworkPolicy.create=true")[("NetworkPolicy", "pffs-metrics")]
    kubernetes_validate.validate(metrics, KUBE_VERSION, strict=True)
    metrics["metadata"].pop("labels")
    assert metrics == EXAMPLES[("NetworkPolicy", "pffs-metrics")]

    missing = helm_template("storageClass.create=true", check=False)
    assert missing.returncode != 0 and "storageClass.baseSource" in missing.stderr


@requires_helm
def test_chart_cache_group() -> None:
    """cacheGroup.enabled: the headless Service over the node plugin pods, the NetworkPolicy
    opening its port to them only, the RBAC to list EndpointSlices, the Secret, and the node
    plugin's --group-* options agreeing with them."""
    off = rendered()
    assert ("Service", "pffs-group") not in off and ("Role", "pffs-group-members") not in off
    docs = rendered(
        "cacheGroup.enabled=true",
        "cacheGroup.port=7171",
        "cacheGroup.handover=60",
        "cacheGroup.create=true",
        "cacheGroup.secret=0123456789abcdef0123",
    )
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    daemonset = docs[("DaemonSet", "pffs-csi-node")]
    plugin = container(daemonset, "pffs-plugin")
    config = config_from_args(pffs_args(plugin))
    assert config.group_options() == [
        *("--group-members", "k8s://kube-system/pffs-group"),
        *("--group-listen", "0.0.0.0:7171"),
        *("--group-secret-file", "/etc/pffs-group/secret"),
        *("--group-handover", "60"),
    ]
    mount, volume = volume_for(daemonset, "/etc/pffs-group", "pffs-plugin")
    assert mount["readOnly"] and volume["secret"]["secretName"] == "pffs-group-secret"
    assert "secret" in docs[("Secret", "pffs-group-secret")]["stringData"]
    peer = next(p for p in plugin["ports"] if p["name"] == "peer")
    assert peer["containerPort"] == 7171
    service = docs[("Service", "pffs-group")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "peer", "port": 7171, "targetPort": "peer", "protocol": "TCP"}
    ]
    policy = docs[("NetworkPolicy", "pffs-group-peers")]["spec"]
    assert policy["podSelector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
    assert policy["ingress"][0]["from"][0]["podSelector"] == policy["podSelector"]
    # principals without keys of their own: the Secret's second key, passed on
    proving = rendered(
        "cacheGroup.enabled=true",
        "cacheGroup.create=true",
        "cacheGroup.secret=0123456789abcdef0123",
        "cacheGroup.principalsWithoutKeys=true",
        "cacheGroup.principalSecret=fedcba9876543210fedc",
    )
    plugin = container(proving[("DaemonSet", "pffs-csi-node")], "pffs-plugin")
    proving_options = config_from_args(pffs_args(plugin)).group_options()
    assert proving_options[-2:] == [
        "--group-principal-secret-file",
        "/etc/pffs-group/principal-secret",
    ]
    assert "principal-secret" in proving[("Secret", "pffs-group-secret")]["stringData"]
    assert "principal-secret" not in docs[("Secret", "pffs-group-secret")]["stringData"]
    role = docs[("Role", "pffs-group-members")]
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        }
    ]
    binding = docs[("RoleBinding", "pffs-group-members")]
    assert (
        binding["subjects"][0]["name"]
        == daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    )
    # The mount's own parser takes the options the driver hands a grouped volume.
    mount_args = options.build_parser().parse_args(
        ["mount", "s3://b", "/mnt", *config.group_options()]
    )
    assert str(mount_args.group_members) == "k8s://kube-system/pffs-group"
    missing = helm_template("cacheGroup.enabled=true", "cacheGroup.create=true", check=False)
    assert missing.returncode != 0 and "cacheGroup.secret" in missing.stderr

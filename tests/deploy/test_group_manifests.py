"""deploy/kubernetes-group: the cache group as a kustomize overlay of deploy/kubernetes, rendered
by the real `kubectl kustomize` (from dev.sh setup; without it these skip with that reason).

It renders exactly what the Helm chart renders with cacheGroup.enabled=true (its Secret aside:
made from a file here, from a value there); its objects pass the Kubernetes schemas; the node
plugin's --group-* options are accepted by pffs's own parser; without the secret file it does
not render at all, so no group runs on a default or empty secret.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import yaml

from pffs.csi.server import config_from_args
from tests.deploy.test_chart import rendered
from tests.deploy.test_deploy import (
    DEPLOY,
    K8S,
    KUBE_VERSION,
    KUBECTL,
    Doc,
    by_key,
    container,
    load,
    pffs_args,
    requires_helm,
    requires_kubectl,
    volume_for,
)

OVERLAY = DEPLOY / "kubernetes-group"
PRINCIPALS = DEPLOY / "kubernetes-group-principals"
SECRET = "0123456789abcdef0123456789abcdef"
PRINCIPAL_SECRET = "fedcba9876543210fedcba9876543210"


def kustomize(
    tmp_path: Path, secret: str | None, principal_secret: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The overlay rendered from a copy of deploy/ (the secret file, when given, beside it);
    with a principal secret, the principals overlay on top of it."""
    assert KUBECTL is not None
    for directory in (K8S, OVERLAY, PRINCIPALS):
        shutil.copytree(directory, tmp_path / directory.name)
    if secret is not None:
        (tmp_path / OVERLAY.name / "group-secret").write_text(secret)
    top = OVERLAY
    if principal_secret is not None:
        (tmp_path / PRINCIPALS.name / "principal-secret").write_text(principal_secret)
        top = PRINCIPALS
    return subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path / top.name)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_group_objects_are_valid_kubernetes() -> None:
    docs = load(OVERLAY / "group.yaml")
    assert {d["kind"] for d in docs} == {"Service", "NetworkPolicy", "Role", "RoleBinding"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@requires_kubectl
def test_the_overlay_adds_the_group_to_the_node_plugin(tmp_path: Path) -> None:
    done = kustomize(tmp_path, SECRET)
    assert done.returncode == 0, done.stderr
    docs = by_key([d for d in yaml.safe_load_all(done.stdout) if d])
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    daemonset = docs[("DaemonSet", "pffs-csi-node")]
    config = config_from_args(pffs_args(container(daemonset, "pffs-plugin")))
    assert config.group_options() == [
        *("--group-members", "k8s://kube-system/pffs-group"),
        *("--group-listen", "0.0.0.0:7070"),
        *("--group-secret-file", "/etc/pffs-group/secret"),
        *("--group-handover", "300"),
    ]
    mount, volume = volume_for(daemonset, "/etc/pffs-group", "pffs-plugin")
    assert mount["readOnly"] and volume["secret"] == {
        "secretName": "pffs-group-secret",
        "defaultMode": 0o400,
    }
    secret = docs[("Secret", "pffs-group-secret")]
    assert secret["metadata"]["namespace"] == "kube-system"
    assert base64.b64decode(secret["data"]["secret"]).decode() == SECRET
    # The peer port is the Service's and the NetworkPolicy's, opened to the node pods only.
    service = docs[("Service", "pffs-group")]["spec"]
    assert service["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    policy = docs[("NetworkPolicy", "pffs-group-peers")]["spec"]
    assert policy["ingress"][0] == {
        "from": [{"podSelector": {"matchLabels": service["selector"]}}],
        "ports": [{"port": "peer", "protocol": "TCP"}],
    }


@requires_kubectl
@requires_helm
def test_the_overlay_renders_what_the_chart_renders_with_a_group(tmp_path: Path) -> None:
    done = kustomize(tmp_path, SECRET)
    assert done.returncode == 0, done.stderr
    overlay = by_key([d for d in yaml.safe_load_all(done.stdout) if d])
    chart = rendered(
        "cacheGroup.enabled=true", "cacheGroup.create=true", f"cacheGroup.secret={SECRET}"
    )
    key = ("Secret", "pffs-group-secret")
    from_file: Doc = overlay.pop(key)
    from_value: Doc = chart.pop(key)
    assert overlay == chart
    assert from_file["metadata"] == from_value["metadata"]
    assert (
        base64.b64decode(from_file["data"]["secret"]).decode() == from_value["stringData"]["secret"]
    )


@requires_kubectl
@requires_helm
def test_the_principals_overlay_renders_what_the_chart_renders_with_principals(
    tmp_path: Path,
) -> None:
    done = kustomize(tmp_path, SECRET, PRINCIPAL_SECRET)
    assert done.returncode == 0, done.stderr
    overlay = by_key([d for d in yaml.safe_load_all(done.stdout) if d])
    chart = rendered(
        "cacheGroup.enabled=true",
        "cacheGroup.create=true",
        f"cacheGroup.secret={SECRET}",
        "cacheGroup.principalsWithoutKeys=true",
        f"cacheGroup.principalSecret={PRINCIPAL_SECRET}",
    )
    key = ("Secret", "pffs-group-secret")
    from_files: Doc = overlay.pop(key)
    from_values: Doc = chart.pop(key)
    assert overlay == chart
    config = config_from_args(
        pffs_args(container(overlay[("DaemonSet", "pffs-csi-node")], "pffs-plugin"))
    )
    assert "--group-principal-secret-file" in config.group_options()
    decoded = {k: base64.b64decode(v).decode() for k, v in from_files["data"].items()}
    assert decoded == from_values["stringData"]


@requires_kubectl
def test_without_the_secret_file_nothing_renders(tmp_path: Path) -> None:
    done = kustomize(tmp_path, None)
    assert done.returncode != 0 and "group-secret" in done.stderr, done.stderr
    assert not done.stdout

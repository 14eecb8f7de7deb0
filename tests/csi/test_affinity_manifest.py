"""`pffs affinity MANIFEST`: node-affinity terms for the nodes holding a workload's data.

PVCs, PVs and Nodes come from tests/csi/kube_apiserver.py, a local stand-in for the Kubernetes API
server (none can run on this machine), over real HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pffs.csi.affinity.labels import dataset_id, label_key
from pffs.csi.affinity.manifest import annotate
from tests.csi.kube_apiserver import FakeApiServer

ATTRS = {"source": "s3://datasets/imagenet/train", "endpoint": "http://minio:9000"}
LABEL = label_key(dataset_id(ATTRS))
INLINE = {"source": "s3://datasets/coco"}
INLINE_LABEL = label_key(dataset_id(INLINE))

JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: ml
spec:
  template:
    spec:
      restartPolicy: Never
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 10
            preference:
              matchExpressions:
              - {key: topology.kubernetes.io/zone, operator: In, values: [zone-a]}
      containers:
      - name: trainer
        image: pytorch/pytorch:2.3.0
        volumeMounts: [{name: data, mountPath: /data}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: imagenet}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {epochs: "3"}
"""

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "coco", "csi": {"driver": "csi.pffs.io", "volumeAttributes": INLINE}}],
    },
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_pffs_claim("ml", "imagenet", "pv-1", ATTRS)
        server.add_node("holder", {LABEL: "true"})
        server.add_node("empty")
        yield server


def _pffs(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return subprocess.run(
        [sys.executable, "-m", "pffs", "affinity", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _node_affinity(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
    affinity: dict[str, Any] = spec["affinity"]["nodeAffinity"]
    return affinity


def test_preferred_terms_for_a_job(tmp_path: Path, api: FakeApiServer) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(JOB)
    result = _pffs(str(manifest), "--api", api.url)
    assert result.returncode == 0, result.stderr
    job, config = yaml.safe_load_all(result.stdout)
    preferred = _node_affinity(job)["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["weight"] == 10  # the manifest's own term stays
    assert preferred[1] == {
        "weight": 100,
        "preference": {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]},
    }
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in _node_affinity(job)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "pytorch/pytorch:2.3.0"
    assert config == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings"},
        "data": {"epochs": "3"},
    }
    assert "ConfigMap/settings: not a workload" in result.stderr
    # Running it on its own output changes nothing: its terms are replaced, not added again.
    again = _pffs("-", "--api", api.url, stdin=result.stdout)
    assert again.returncode == 0 and again.stdout == result.stdout


def test_required_terms_are_anded_into_every_existing_term(api: FakeApiServer) -> None:
    doc = yaml.safe_load(JOB.split("---")[0])
    doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ] = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
        ]
    }
    from pffs.kube import KubeClient

    out = yaml.safe_load(annotate(yaml.safe_dump(doc), KubeClient(api.url), required=True))
    terms = _node_affinity(out)["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [t["matchExpressions"] for t in terms] == [
        [
            {"key": "gpu", "operator": "In", "values": ["a100"]},
            {"key": LABEL, "operator": "Exists"},
        ],
        [
            {"key": "gpu", "operator": "In", "values": ["h100"]},
            {"key": LABEL, "operator": "Exists"},
        ],
    ]
    # The preferred list keeps only the manifest's own term.
    assert len(_node_affinity(out)["preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    # Back to preferred: the required pffs expressions go away again.
    back = yaml.safe_load(annotate(yaml.safe_dump(out), KubeClient(api.url), required=False))
    terms = _node_affinity(back)["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert all(e["key"] == "gpu" for t in terms for e in t["matchExpressions"])


def test_required_falls_back_when_no_node_holds_the_data(
    tmp_path: Path, api: FakeApiServer
) -> None:
    api.nodes["holder"]["metadata"]["labels"].pop(LABEL)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(JOB)
    result = _pffs(str(manifest), "--required", "--api", api.url)
    assert result.returncode == 0, result.stderr
    assert "no node holds its data yet" in result.stderr
    job = next(yaml.safe_load_all(result.stdout))
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in _node_affinity(job)
    assert (
        _node_affinity(job)["preferredDuringSchedulingIgnoredDuringExecution"][1]["weight"] == 100
    )


def test_inline_volumes_need_no_api_and_json_stays_json(tmp_path: Path) -> None:
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(POD))
    result = _pffs(str(manifest), "--required")
    assert result.returncode == 0, result.stderr
    pod = json.loads(result.stdout)
    terms = _node_affinity(pod)["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": INLINE_LABEL, "operator": "Exists"}]}]
    }


def test_a_pvc_without_an_api_is_a_clear_error(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(JOB)
    result = _pffs(str(manifest))
    assert result.returncode == 5
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "needs the Kubernetes API" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("kind: [unclosed", "not valid YAML"),
        ("{bad json", "not valid JSON"),
        ("", "empty"),
        ("- just\n- a list\n", "object with a kind"),
    ],
)
def test_bad_manifests(tmp_path: Path, content: str | None, message: str) -> None:
    manifest = tmp_path / "m.yaml"
    if content is not None:
        manifest.write_text(content)
    result = _pffs(str(manifest))
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1

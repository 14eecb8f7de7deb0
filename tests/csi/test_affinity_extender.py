"""The scheduler extender over real HTTP, with ExtenderArgs shaped as kube-scheduler sends them.

kube-scheduler POSTs `{"Pod": v1.Pod, "Nodes": v1.NodeList}` (or `"NodeNames": [...]` when the
extender is nodeCacheCapable) to <urlPrefix>/filter and /prioritize. PVCs, PVs and Nodes are
served by tests/csi/kube_apiserver.py, a local stand-in for the Kubernetes API server (none can run
on this machine).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pffs.csi.affinity.extender import Extender, make_server
from pffs.csi.affinity.labels import (
    CACHE_ANNOTATION,
    DatasetCache,
    dataset_id,
    encode_annotation,
    node_labels,
)
from pffs.kube import KubeClient
from tests.csi.kube_apiserver import FakeApiServer

ATTRS_A = {"source": "s3://datasets/imagenet", "endpoint": "http://minio.storage:9000"}
ATTRS_B = {"source": "s3://datasets/coco", "region": "us-east-1"}
A, B = dataset_id(ATTRS_A), dataset_id(ATTRS_B)
GIB = 1 << 30


def _node(api: FakeApiServer, name: str, held: dict[str, tuple[float, int]]) -> dict[str, Any]:
    """A node whose cache holds {dataset: (ratio, total bytes)}, published as the plugin does."""
    caches = {
        sid: DatasetCache(sid, int(r * t), max(1, int(r * t) // (4 << 20)), t, r)
        for sid, (r, t) in held.items()
    }
    return api.add_node(name, node_labels(caches), {CACHE_ANNOTATION: encode_annotation(caches)})


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_pffs_claim("ml", "imagenet", "pvc-1111", ATTRS_A)
        server.add_pffs_claim(
            "ml", "scratch", "pvc-2222", {"source": "x"}, driver="ebs.csi.aws.com"
        )
        _node(server, "n1", {A: (1.0, 100 * GIB)})
        _node(server, "n2", {A: (0.3, 100 * GIB), B: (1.0, 300 * GIB)})
        _node(server, "n3", {})
        _node(server, "n4", {"s3://other/data": (1.0, GIB)})
        yield server


@pytest.fixture
def extender(api: FakeApiServer) -> Iterator[str]:
    server = make_server(Extender(KubeClient(api.url)), "127.0.0.1:0", "/pffs")
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _pod(volumes: list[dict[str, Any]], annotations: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    """A v1.Pod as the scheduler has it: metadata, spec with containers and volumes, status."""
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "3f1c0b7e-3a53-4a57-9d65-0f4c0a1b2c3d",
            "annotations": annotations or {},
            "creationTimestamp": "2024-05-01T10:00:00Z",
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "trainer",
                    "image": "pytorch/pytorch:2.3.0",
                    "volumeMounts": [
                        {"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes
                    ],
                    "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}},
                }
            ],
            "volumes": volumes,
        },
        "status": {"phase": "Pending"},
    }


PVC_A = {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}}
INLINE_B = {"name": "coco", "csi": {"driver": "csi.pffs.io", "volumeAttributes": ATTRS_B}}
OTHER = [
    {"name": "cfg", "configMap": {"name": "train-config"}},
    {"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch"}},
    {"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {}}]}},
]


def _args(api: FakeApiServer, pod: dict, by_name: bool, names: list[str] | None = None) -> dict:  # type: ignore[type-arg]
    names = names or ["n1", "n2", "n3", "n4"]
    if by_name:
        return {"Pod": pod, "Nodes": None, "NodeNames": names}
    items = [json.loads(json.dumps(api.nodes[n])) for n in names]
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}


def _post(where: str, path: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(where, timeout=10)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, json.loads(payload)


def _scores(answer: list[dict[str, Any]]) -> dict[str, int]:
    return {entry["Host"]: entry["Score"] for entry in answer}


@pytest.mark.parametrize("by_name", [False, True], ids=["Nodes", "NodeNames"])
def test_prioritize_scores_by_cached_share(
    api: FakeApiServer, extender: str, by_name: bool
) -> None:
    status, answer = _post(extender, "/pffs/prioritize", _args(api, _pod([PVC_A, *OTHER]), by_name))
    assert status == 200
    assert answer == [
        {"Host": "n1", "Score": 10},
        {"Host": "n2", "Score": 3},
        {"Host": "n3", "Score": 0},
        {"Host": "n4", "Score": 0},
    ]


@pytest.mark.parametrize("by_name", [False, True], ids=["Nodes", "NodeNames"])
def test_prioritize_adds_up_several_datasets(
    api: FakeApiServer, extender: str, by_name: bool
) -> None:
    pod = _pod([PVC_A, INLINE_B])
    status, answer = _post(extender, "/pffs/prioritize", _args(api, pod, by_name))
    assert status == 200
    # 400 GiB wanted: n1 holds 100 (2.5 -> 3), n2 holds 30 + 300 (8.25 -> 9).
    assert _scores(answer) == {"n1": 3, "n2": 9, "n3": 0, "n4": 0}


def test_lookups_are_remembered(api: FakeApiServer, extender: str) -> None:
    for _ in range(3):
        _post(extender, "/pffs/prioritize", _args(api, _pod([PVC_A]), by_name=True))
    assert api.count("GET", "/api/v1/namespaces/ml/persistentvolumeclaims/imagenet") == 1
    assert api.count("GET", "/api/v1/persistentvolumes/pvc-1111") == 1
    assert api.count("GET", "/api/v1/nodes") == 1


@pytest.mark.parametrize("by_name", [False, True], ids=["Nodes", "NodeNames"])
def test_filter_prefer_mode_passes_every_node_without_asking_the_api(
    api: FakeApiServer, extender: str, by_name: bool
) -> None:
    status, answer = _post(extender, "/pffs/filter", _args(api, _pod([PVC_A]), by_name))
    assert status == 200
    assert answer["Error"] == "" and answer["FailedNodes"] == {}
    assert answer["FailedAndUnresolvableNodes"] == {}
    if by_name:
        assert answer["NodeNames"] == ["n1", "n2", "n3", "n4"] and answer["Nodes"] is None
    else:
        assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["n1", "n2", "n3", "n4"]
    assert api.requests == []


@pytest.mark.parametrize("by_name", [False, True], ids=["Nodes", "NodeNames"])
def test_filter_required_keeps_the_nodes_holding_the_data(
    api: FakeApiServer, extender: str, by_name: bool
) -> None:
    pod = _pod([PVC_A], {"pffs.io/data-affinity": "required"})
    status, answer = _post(extender, "/pffs/filter", _args(api, pod, by_name))
    assert status == 200 and answer["Error"] == ""
    failed = answer["FailedAndUnresolvableNodes"]
    assert sorted(failed) == ["n3", "n4"]
    assert all("holds none of the pod's data" in reason for reason in failed.values())
    if by_name:
        assert answer["NodeNames"] == ["n1", "n2"]
    else:
        items = answer["Nodes"]["items"]
        assert [n["metadata"]["name"] for n in items] == ["n1", "n2"]
        assert items[0] == api.nodes["n1"]  # whole Node objects come back


def test_filter_required_lets_a_first_run_go_anywhere(api: FakeApiServer, extender: str) -> None:
    pod = _pod([PVC_A], {"pffs.io/data-affinity": "required"})
    status, answer = _post(extender, "/pffs/filter", _args(api, pod, True, ["n3", "n4"]))
    assert status == 200
    assert answer["NodeNames"] == ["n3", "n4"] and answer["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("annotation", [None, "none"])
def test_pods_without_pffs_data_are_left_alone(
    api: FakeApiServer, extender: str, annotation: str | None
) -> None:
    pod = _pod(
        OTHER if annotation is None else [PVC_A], {"pffs.io/data-affinity": annotation or ""}
    )
    _, answer = _post(extender, "/pffs/prioritize", _args(api, pod, by_name=False))
    assert set(_scores(answer).values()) == {0}
    _, answer = _post(extender, "/pffs/filter", _args(api, pod, by_name=True))
    assert answer["NodeNames"] == ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize(
    ("path", "raw", "status", "message"),
    [
        ("/pffs/filter", b"{not json", 400, "not JSON"),
        ("/pffs/filter", b"[]", 400, "must be a JSON object"),
        ("/pffs/prioritize", b'{"Nodes": null, "NodeNames": ["n1"]}', 400, "no Pod"),
        ("/pffs/prioritize", b'{"Pod": {}, "Nodes": null, "NodeNames": null}', 400, "neither"),
        ("/pffs/filter", b'{"Pod": {}, "Nodes": {"items": [{}]}}', 400, "metadata.name"),
        ("/pffs/filter", b'{"Pod": {}, "Nodes": [1, 2]}', 400, "NodeList"),
        ("/pffs/prioritize", b'{"Pod": {}, "NodeNames": "n1"}', 400, "list of names"),
        ("/pffs/bind", b"{}", 404, "no such verb"),
        ("/filter", b"{}", 404, "no such verb"),  # outside the url prefix
    ],
)
def test_malformed_requests_get_an_error(
    extender: str, path: str, raw: bytes, status: int, message: str
) -> None:
    got, answer = _post(extender, path, None, raw=raw)
    assert got == status
    assert message in answer["Error"]


def test_api_failures_are_reported_not_fatal(api: FakeApiServer, extender: str) -> None:
    api.fail_with = 500
    pod = _pod([PVC_A], {"pffs.io/data-affinity": "required"})
    status, answer = _post(extender, "/pffs/filter", _args(api, pod, by_name=True))
    assert status == 200
    assert "cannot find the pod's datasets" in answer["Error"] and "HTTP 500" in answer["Error"]
    assert answer["NodeNames"] == []
    status, answer = _post(extender, "/pffs/prioritize", _args(api, pod, by_name=True))
    assert status == 200 and set(_scores(answer).values()) == {0}
    api.fail_with = None  # the server is still serving
    status, answer = _post(extender, "/pffs/prioritize", _args(api, pod, by_name=True))
    assert _scores(answer)["n1"] == 10


def test_healthz(extender: str) -> None:
    conn = http.client.HTTPConnection(extender, timeout=10)
    conn.request("GET", "/pffs/healthz")
    assert conn.getresponse().status == 200


def test_the_command_serves_until_sigterm(api: FakeApiServer) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pffs",
            "scheduler-extender",
            "--listen",
            "127.0.0.1:0",
            "--api",
            api.url,
            "--url-prefix",
            "/scheduler",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, proc.stderr.read() if proc.stderr else ""
        port = int(line.rsplit(":", 1)[1])
        status, answer = _post(
            f"127.0.0.1:{port}", "/scheduler/prioritize", _args(api, _pod([PVC_A]), by_name=False)
        )
        assert status == 200 and _scores(answer)["n1"] == 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nowhere"], "use HOST:PORT"),
        (["--listen", ":99999"], "0..65535"),
        (["--listen", ":0"], "--api URL"),  # not in a pod and no --api
    ],
)
def test_the_command_refuses_bad_options(args: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    result = subprocess.run(
        [sys.executable, "-m", "pffs", "scheduler-extender", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1

"""A stand-in for the Kubernetes API server, for the data-affinity tests.

No API server can run on this machine (no Docker, no kind, no etcd), so this serves the few
endpoints pffs uses over real HTTP (or HTTPS) on 127.0.0.1, in the API's own shapes:
GET a PVC, a PV, a Node; LIST Nodes, and the EndpointSlices of a namespace (pffs.group's
members), with a label selector (existence `key`, `key=value`, `!key`,
comma for AND); PATCH a Node with a JSON merge patch (RFC 7386). Unknown objects answer 404 with
a Status body, like the real server. It records every request, can demand a bearer token, and
can be told to fail (`fail_with`) to test error handling.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _selected(labels: dict[str, str], selector: str) -> bool:
    for requirement in filter(None, (r.strip() for r in selector.split(","))):
        if requirement.startswith("!"):
            if requirement[1:] in labels:
                return False
        elif "=" in requirement:
            key, value = requirement.split("=", 1)
            if labels.get(key.rstrip("=!")) != value.lstrip("="):
                return False
        elif requirement not in labels:
            return False
    return True


def _status(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }


class FakeApiServer:
    def __init__(self, token: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.pvcs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pvs: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.endpoint_slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str | None, Any]] = []  # method, path, type, body
        self.token = token
        self.fail_with: int | None = None  # answer every request with this HTTP status
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- objects -----------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                "annotations": dict(annotations or {}),
            },
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi"}},
        }
        self.nodes[name] = node
        return node

    def add_pffs_claim(
        self,
        namespace: str,
        claim: str,
        pv: str,
        attributes: dict[str, str],
        driver: str = "csi.pffs.io",
    ) -> None:
        self.pvcs[(namespace, claim)] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {"volumeName": pv, "accessModes": ["ReadOnlyMany"]},
            "status": {"phase": "Bound"},
        }
        self.pvs[pv] = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {"csi": {"driver": driver, "volumeHandle": pv, "volumeAttributes": attributes}},
        }

    def set_endpoint_slice(
        self, namespace: str, name: str, service: str, port: int, endpoints: list[dict[str, Any]]
    ) -> None:
        """An EndpointSlice (discovery.k8s.io/v1) of `service`, its port named `peer`."""
        self.endpoint_slices[(namespace, name)] = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": "peer", "port": port, "protocol": "TCP"}],
            "endpoints": endpoints,
        }

    def count(self, method: str, path_start: str) -> int:
        return sum(1 for m, p, _, _ in self.requests if m == method and p.startswith(path_start))

    # --- HTTP --------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                parts = urlsplit(self.path)
                with fake._lock:
                    fake.requests.append(
                        (method, parts.path, self.headers.get("Content-Type"), body)
                    )
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    self._send(401, _status(401, "Unauthorized"))
                    return
                if fake.fail_with:
                    self._send(fake.fail_with, _status(fake.fail_with, "injected failure"))
                    return
                self._dispatch(method, unquote(parts.path), parse_qs(parts.query), body)

            def _dispatch(
                self, method: str, path: str, query: dict[str, list[str]], body: Any
            ) -> None:
                with fake._lock:
                    if m := re.fullmatch(
                        r"/api/v1/namespaces/([^/]+)/persistentvolumeclaims/([^/]+)", path
                    ):
                        found = fake.pvcs.get((m[1], m[2]))
                    elif m := re.fullmatch(r"/api/v1/persistentvolumes/([^/]+)", path):
                        found = fake.pvs.get(m[1])
                    elif path == "/api/v1/nodes" and method == "GET":
                        selector = (query.get("labelSelector") or [""])[0]
                        items = [
                            copy.deepcopy(n)
                            for n in fake.nodes.values()
                            if _selected(n["metadata"].get("labels") or {}, selector)
                        ]
                        self._send(200, {"kind": "NodeList", "apiVersion": "v1", "items": items})
                        return
                    elif m := re.fullmatch(
                        r"/apis/discovery.k8s.io/v1/namespaces/([^/]+)/endpointslices", path
                    ):
                        selector = (query.get("labelSelector") or [""])[0]
                        items = [
                            copy.deepcopy(item)
                            for (namespace, _), item in fake.endpoint_slices.items()
                            if namespace == m[1] and _selected(item["metadata"]["labels"], selector)
                        ]
                        kind = "EndpointSliceList"
                        self._send(200, {"kind": kind, "apiVersion": "v1", "items": items})
                        return
                    elif m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
                        found = fake.nodes.get(m[1])
                        if found is not None and method == "PATCH":
                            if self.headers.get("Content-Type") != "application/merge-patch+json":
                                self._send(415, _status(415, "unsupported patch type"))
                                return
                            fake.nodes[m[1]] = found = merge_patch(found, body)
                    else:
                        self._send(404, _status(404, f"the server could not find {path}"))
                        return
                    if found is None:
                        self._send(404, _status(404, f"{path} not found"))
                        return
                    self._send(200, copy.deepcopy(found))

            def do_GET(self) -> None:
                self._route("GET")

            def do_PATCH(self) -> None:
                self._route("PATCH")

        return Handler

"""A small Kubernetes API client: the few calls pffs makes (the data-affinity code of csi/affinity/,
a cache group's membership in pffs.group), over HTTPS. It imports nothing of pffs.

In a pod it uses the service account: the token and CA from
/var/run/secrets/kubernetes.io/serviceaccount and the API server from KUBERNETES_SERVICE_HOST /
KUBERNETES_SERVICE_PORT. Elsewhere it takes a base URL (`kubectl proxy` gives one on
http://127.0.0.1:8001). The token is read again for every request, because projected service
account tokens are rotated on disk while the process runs.

Calls: GET a PVC, a PV, a Node, LIST Nodes (optionally by label selector), a JSON merge
patch (RFC 7386) of a Node, and LIST the EndpointSlices of a Service. RBAC needed: the node
plugin `get` and `patch` on nodes (and `list` on endpointslices in a cache group); the
scheduler extender `get` on persistentvolumeclaims and persistentvolumes, `get` and `list` on
nodes.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeError(Exception):
    """A failed API call; `status` is the HTTP status, or None when the server was not reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeClient:
    def __init__(
        self,
        base_url: str,
        token_file: str | None = None,
        ca_file: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_file = token_file
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self.base_url.startswith("https://"):
            self._ssl = ssl.create_default_context(cafile=ca_file)

    @classmethod
    def in_cluster(
        cls, account_dir: str = SERVICE_ACCOUNT_DIR, environ: dict[str, str] | None = None
    ) -> KubeClient:
        """The API server of the cluster this pod runs in, as its service account."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        token = os.path.join(account_dir, "token")
        if not host or not port or not os.path.exists(token):
            raise KubeError(
                "not running in a Kubernetes pod (no KUBERNETES_SERVICE_HOST or service account "
                "token): give the API server with --api URL"
            )
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", token, os.path.join(account_dir, "ca.crt"))

    @classmethod
    def from_url(cls, api: str | None) -> KubeClient:
        """`api` when given (tests, `kubectl proxy`), else the in-cluster service account."""
        return cls(api) if api else cls.in_cluster()

    # --- the calls ---------------------------------------------------------------------------

    def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/api/v1/namespaces/{quote(namespace, '')}/persistentvolumeclaims/{quote(name, '')}"
        return self._get_optional(path)

    def get_pv(self, name: str) -> dict[str, Any] | None:
        return self._get_optional(f"/api/v1/persistentvolumes/{quote(name, '')}")

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self._get_optional(f"/api/v1/nodes/{quote(name, '')}")

    def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = f"?{urlencode({'labelSelector': label_selector})}" if label_selector else ""
        doc = self.request("GET", f"/api/v1/nodes{query}")
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise KubeError("the node list has no items")
        return [item for item in items if isinstance(item, dict)]

    def list_endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """The EndpointSlices (discovery.k8s.io/v1) of a Service."""
        query = urlencode({"labelSelector": f"kubernetes.io/service-name={service}"})
        path = f"/apis/discovery.k8s.io/v1/namespaces/{quote(namespace, '')}/endpointslices"
        doc = self.request("GET", f"{path}?{query}")
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise KubeError("the EndpointSlice list has no items")
        return [item for item in items if isinstance(item, dict)]

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the Node (null removes a label or annotation)."""
        return self.request(
            "PATCH",
            f"/api/v1/nodes/{quote(name, '')}",
            patch,
            content_type="application/merge-patch+json",
        )

    # --- transport ---------------------------------------------------------------------------

    def _get_optional(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "User-Agent": "pffs"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            except OSError as exc:
                raise KubeError(f"cannot read the service account token: {exc}") from None
        url = self.base_url + path
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            raise KubeError(
                f"{method} {path}: HTTP {exc.code} {_status_message(exc)}", exc.code
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubeError(f"{method} {path}: API server unreachable: {reason}") from None
        try:
            doc = json.loads(payload or b"{}")
        except ValueError:
            raise KubeError(f"{method} {path}: the answer is not JSON") from None
        if not isinstance(doc, dict):
            raise KubeError(f"{method} {path}: the answer is not a JSON object")
        return doc


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The `message` of a Kubernetes Status body, else the HTTP reason."""
    try:
        doc = json.loads(exc.read() or b"{}")
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
    except (ValueError, OSError):
        pass
    return str(exc.reason)

"""`pffs scheduler-extender`: the kube-scheduler extender protocol over HTTP.

kube-scheduler POSTs JSON to `<urlPrefix>/filter` and `<urlPrefix>/prioritize` with an
ExtenderArgs document: `{"Pod": Pod, "Nodes": NodeList | null, "NodeNames": [..] | null}` (names
when the extender is configured `nodeCacheCapable: true`). Field names are Go's (no JSON tags).

- prioritize answers a HostPriorityList, `[{"Host": name, "Score": 0..10}]`: the share of the
  pod's pffs data each node's cache holds (scoring.py). A pod without pffs volumes gets 0
  everywhere, so the extender changes nothing for it.
- filter answers an ExtenderFilterResult `{"Nodes" | "NodeNames", "FailedNodes",
  "FailedAndUnresolvableNodes", "Error"}`. In prefer mode (the default) every node passes. In
  require mode (`--mode require`, or the pod annotation `pffs.io/data-affinity: required`) the
  nodes holding none of the pod's data fail ("unresolvable": preempting pods would not help),
  unless no candidate holds any, in which case all pass, so a first run still schedules.

What nodes hold is read from their `pffs.io/cache` annotations: from the Node objects in the
request, or, with NodeNames, from the nodes carrying the datasets' labels (one LIST by label
selector per dataset, remembered for `node_ttl` seconds); nodes without the label hold none.

Errors: a request that is not an ExtenderArgs document gets HTTP 400 with `{"Error": ...}`.
When the API cannot be asked (unreachable, denied), filter answers 200 with its `Error` set,
and prioritize neutral scores (0 everywhere; the scheduler ignores prioritize failures anyway).
GET /healthz answers "ok". The HTTP side, bounded in connections, time and memory against
clients that are not the scheduler, is httpserve.py's.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Mapping
from http import HTTPStatus
from types import FrameType
from typing import Any

from pffs.csi.affinity.httpserve import Handler, HttpLimits, HttpServer
from pffs.csi.affinity.labels import DatasetCache, label_key, node_cache
from pffs.csi.affinity.scoring import (
    OFF,
    PREFER,
    REQUIRE,
    LookupFailed,
    TTLCache,
    VolumeResolver,
    holders,
    pod_mode,
    score_nodes,
)
from pffs.errors import UsageError
from pffs.kube import KubeClient, KubeError

log = logging.getLogger("pffs.csi.extender")

# Where a listen address without a host binds: only this host's own clients.
LOCALHOST = "127.0.0.1"


class BadRequest(Exception):
    """The request is not an ExtenderArgs document."""


class Extender:
    """The decisions, apart from HTTP (the server below calls these)."""

    def __init__(self, api: KubeClient | None, mode: str = PREFER, node_ttl: float = 5.0) -> None:
        self.api = api
        self.mode = mode
        self.volumes = VolumeResolver(api)
        self._holders: TTLCache[str, dict[str, dict[str, DatasetCache]]] = TTLCache(node_ttl)

    # --- parsing -----------------------------------------------------------------------------

    @staticmethod
    def parse(args: Any) -> tuple[dict[str, Any], list[dict[str, Any]] | None, list[str]]:
        """(pod, node objects or None, node names) of an ExtenderArgs document."""
        if not isinstance(args, dict):
            raise BadRequest("ExtenderArgs must be a JSON object")
        pod = args.get("Pod")
        if not isinstance(pod, dict):
            raise BadRequest("ExtenderArgs has no Pod")
        nodes, names = args.get("Nodes"), args.get("NodeNames")
        if nodes is not None:
            items = nodes.get("items") if isinstance(nodes, dict) else None
            if items is None and isinstance(nodes, dict):
                items = []  # an empty NodeList may come without items
            if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
                raise BadRequest("ExtenderArgs.Nodes must be a NodeList with items")
            node_names = []
            for node in items:
                name = (node.get("metadata") or {}).get("name")
                if not isinstance(name, str) or not name:
                    raise BadRequest("a node in ExtenderArgs.Nodes has no metadata.name")
                node_names.append(name)
            return pod, items, node_names
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of names")
            return pod, None, list(names)
        raise BadRequest("ExtenderArgs has neither Nodes nor NodeNames")

    # --- what nodes hold ---------------------------------------------------------------------

    def _labelled_nodes(self, dataset: str) -> dict[str, dict[str, DatasetCache]]:
        found, cached = self._holders.get(dataset)
        if found and cached is not None:
            return cached
        if self.api is None:
            raise LookupFailed("NodeNames requests need the Kubernetes API (--api URL)")
        try:
            nodes = self.api.list_nodes(label_selector=label_key(dataset))
        except KubeError as exc:
            raise LookupFailed(str(exc)) from None
        result = {
            str((n.get("metadata") or {}).get("name")): node_cache(n)
            for n in nodes
            if (n.get("metadata") or {}).get("name")
        }
        self._holders.put(dataset, result)
        return result

    def caches(
        self, datasets: list[str], nodes: list[dict[str, Any]] | None, names: list[str]
    ) -> dict[str, dict[str, DatasetCache]]:
        """name -> what its cache holds, for the candidate nodes."""
        if nodes is not None:
            return {name: node_cache(node) for name, node in zip(names, nodes, strict=True)}
        out: dict[str, dict[str, DatasetCache]] = {name: {} for name in names}
        for dataset in datasets:
            for name, cache in self._labelled_nodes(dataset).items():
                if name in out and dataset in cache:
                    out[name][dataset] = cache[dataset]
        return out

    # --- the verbs ---------------------------------------------------------------------------

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        pod, nodes, names = self.parse(args)
        zeros = [{"Host": name, "Score": 0} for name in names]
        if pod_mode(pod, self.mode) == OFF:
            return zeros
        try:
            datasets = self.volumes.pod_datasets(pod)
            if not datasets:
                return zeros
            scores = score_nodes(datasets, self.caches(datasets, nodes, names))
        except LookupFailed as exc:
            log.warning("prioritize %s: neutral scores: %s", _pod_name(pod), exc)
            return zeros
        return [{"Host": name, "Score": scores[name].score} for name in names]

    def filter(self, args: Any) -> dict[str, Any]:
        pod, nodes, names = self.parse(args)
        result: dict[str, Any] = {
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        passing = names
        if pod_mode(pod, self.mode) == REQUIRE:
            try:
                datasets = self.volumes.pod_datasets(pod)
                if datasets:
                    have = set(holders(score_nodes(datasets, self.caches(datasets, nodes, names))))
                    if have:  # nobody holds it: let the first run go anywhere
                        passing = [n for n in names if n in have]
                        reason = "pffs: the node's cache holds none of the pod's data"
                        result["FailedAndUnresolvableNodes"] = {
                            n: reason for n in names if n not in have
                        }
            except LookupFailed as exc:
                log.warning("filter %s: %s", _pod_name(pod), exc)
                result["Error"] = f"pffs: cannot find the pod's datasets: {exc}"
                passing = []
        if nodes is not None:
            keep = set(passing)
            items = [n for n, name in zip(nodes, names, strict=True) if name in keep]
            result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
            result["NodeNames"] = None
        else:
            result["Nodes"] = None
            result["NodeNames"] = passing
        return result


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def _handler(extender: Extender, prefix: str) -> Handler:
    """The extender's answers by method and path: (HTTP status, JSON document)."""

    def handle(method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method == "GET":
            if path.rstrip("/") in (f"{prefix}/healthz", "/healthz"):
                return HTTPStatus.OK, "ok"
            return HTTPStatus.NOT_FOUND, {"Error": f"no such path {path}"}
        verb = path[len(prefix) :].strip("/") if path.startswith(prefix) else None
        if method != "POST" or verb not in ("filter", "prioritize"):
            return HTTPStatus.NOT_FOUND, {"Error": f"no such verb at {path}"}
        try:
            try:
                args = json.loads(body)
            except ValueError as exc:
                raise BadRequest(f"the request is not JSON: {exc}") from None
            return HTTPStatus.OK, (
                extender.filter(args) if verb == "filter" else extender.prioritize(args)
            )
        except BadRequest as exc:
            return HTTPStatus.BAD_REQUEST, {"Error": str(exc)}
        except Exception as exc:  # a bug must cost one answer, not the server
            log.exception("%s failed", verb)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"Error": f"pffs: {exc}"}

    return handle


def parse_listen(address: str) -> tuple[str, int]:
    """'host:port', ':port' or 'port' -> (host, port); no host means 127.0.0.1 (every
    interface is `0.0.0.0:PORT`, spelled out)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--listen {address!r}: use HOST:PORT or :PORT") from None
    if not 0 <= number < 65536:
        raise UsageError(f"--listen {address!r}: the port must be 0..65535")
    return host or LOCALHOST, number


def make_server(
    extender: Extender, listen: str, prefix: str = "", limits: HttpLimits | None = None
) -> HttpServer:
    host, port = parse_listen(listen)
    prefix = ("/" + prefix.strip("/")) if prefix.strip("/") else ""
    try:
        return HttpServer(_handler(extender, prefix), host, port, limits or HttpLimits())
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen}: {exc.strerror}") from None


def run(listen: str, api_url: str | None, mode: str, prefix: str = "") -> int:
    """The `pffs scheduler-extender` command: serve until SIGTERM or SIGINT."""
    if mode not in (PREFER, REQUIRE):
        raise UsageError(f"--mode {mode!r}: use prefer or require")
    parse_listen(listen)  # a bad address is reported before the API question
    try:
        api = KubeClient.from_url(api_url)
    except KubeError as exc:
        raise UsageError(str(exc)) from None
    server = make_server(Extender(api, mode), listen, prefix)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    log.info("scheduler extender on %s:%s (mode %s, API %s)", host, port, mode, api.base_url)
    print(f"pffs: scheduler extender listening on {host}:{port}", flush=True)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0

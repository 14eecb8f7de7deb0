"""`pffs affinity MANIFEST`: node-affinity hints for clusters that cannot add an extender.

Reads Pods, Jobs, CronJobs, Deployments, StatefulSets, ReplicaSets, DaemonSets (or a List of
them) as YAML or JSON, finds each pod template's pffs datasets (PVCs resolved through the API,
inline CSI volumes directly) and prints the manifest again with node-affinity terms on the
datasets' node labels (`data.pffs.io/<name>`, set by the node plugins):

- preferred (default): one `preferredDuringSchedulingIgnoredDuringExecution` term of weight 100
  per dataset, so a node holding two of the pod's datasets outranks one holding one;
- `--required`: every dataset label must exist on the node (added to each existing
  `nodeSelectorTerms` entry, since those are ORed). When the API shows that no node holds all
  of them, the hint falls back to preferred with a warning, so the pod is not left unschedulable.

Running it again replaces its own terms (any term on a `data.pffs.io/` key) instead of adding
more. Manifests without pffs volumes come out unchanged.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from pffs.csi.affinity.labels import is_pffs_label, label_key
from pffs.csi.affinity.scoring import LookupFailed, VolumeResolver
from pffs.errors import BackendError, UsageError
from pffs.kube import KubeClient, KubeError

PREFERRED_WEIGHT = 100
_TEMPLATE_KINDS = {
    "Job",
    "Deployment",
    "StatefulSet",
    "ReplicaSet",
    "DaemonSet",
    "ReplicationController",
}


def pod_templates(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod objects (or templates) of a manifest document, for editing in place."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        yield doc
    elif kind in _TEMPLATE_KINDS and isinstance(spec.get("template"), dict):
        yield spec["template"]
    elif kind == "CronJob":
        template = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
        if isinstance(template, dict):
            yield template
    elif kind == "List" or (isinstance(kind, str) and kind.endswith("List")):
        for item in doc.get("items") or []:
            if isinstance(item, dict):
                yield from pod_templates(item)


def _strip_ours(expressions: list[Any]) -> list[Any]:
    return [
        e for e in expressions if not (isinstance(e, dict) and is_pffs_label(str(e.get("key"))))
    ]


def add_affinity(template: dict[str, Any], datasets: list[str], required: bool) -> None:
    """Put node-affinity terms for `datasets` into a pod (template), replacing earlier ones."""
    spec = template.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {}) or {}
    spec["affinity"] = affinity
    node_affinity = affinity.setdefault("nodeAffinity", {}) or {}
    affinity["nodeAffinity"] = node_affinity
    keys = [label_key(d) for d in datasets]

    preferred = [
        term
        for term in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        if not any(
            is_pffs_label(str(e.get("key")))
            for e in ((term.get("preference") or {}).get("matchExpressions") or [])
            if isinstance(e, dict)
        )
    ]
    required_block = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required_block, dict):
        for term in required_block.get("nodeSelectorTerms") or []:
            if isinstance(term, dict) and term.get("matchExpressions"):
                term["matchExpressions"] = _strip_ours(term["matchExpressions"])
        terms = [
            t
            for t in required_block.get("nodeSelectorTerms") or []
            if isinstance(t, dict) and (t.get("matchExpressions") or t.get("matchFields"))
        ]
        if terms:
            required_block["nodeSelectorTerms"] = terms
        else:
            node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution")

    ours = [{"key": key, "operator": "Exists"} for key in keys]
    if required:
        block = node_affinity.setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        terms = block.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({"matchExpressions": []})
        for term in terms:  # terms are ORed: each must also demand the data
            term.setdefault("matchExpressions", []).extend(copy.deepcopy(ours))
    else:
        preferred += [
            {"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [expression]}}
            for expression in ours
        ]
    if preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    else:
        node_affinity.pop("preferredDuringSchedulingIgnoredDuringExecution", None)


def _load(text: str) -> tuple[list[Any], bool]:
    """(documents, is_json)."""
    if text.lstrip().startswith(("{", "[")):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"the manifest is not valid JSON: {exc}") from None
        return (doc if isinstance(doc, list) else [doc]), True
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        raise UsageError(
            f"the manifest is not valid YAML{f' (line {where.line + 1})' if where else ''}"
        ) from None
    return docs, False


def _dump(docs: list[Any], as_json: bool) -> str:
    if as_json:
        return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2) + "\n"
    import yaml

    text: str = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
    return text


def _nodes_holding_all(api: KubeClient, datasets: list[str]) -> int:
    selector = ",".join(label_key(d) for d in datasets)
    return len(api.list_nodes(label_selector=selector))


def annotate(
    text: str,
    api: KubeClient | None,
    required: bool,
    namespace: str | None = None,
    warn: Callable[[str], object] | None = None,
) -> str:
    """The manifest text with affinity terms added; warnings go to `warn(line)`."""
    say = warn or (lambda line: sys.stderr.write(f"pffs: {line}\n"))
    docs, as_json = _load(text)
    if not docs:
        raise UsageError("the manifest is empty")
    resolver = VolumeResolver(api)
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise UsageError("each manifest document must be an object with a kind")
        templates = list(pod_templates(doc))
        what = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
        if not templates:
            say(f"{what}: not a workload with a pod template; left as it is")
            continue
        ns = (doc.get("metadata") or {}).get("namespace") or namespace or "default"
        for template in templates:
            pod = {
                "metadata": {**(template.get("metadata") or {}), "namespace": ns},
                "spec": template.get("spec") or {},
            }
            try:
                datasets = resolver.pod_datasets(pod)
                want_required = required
                if (
                    required
                    and datasets
                    and api is not None
                    and _nodes_holding_all(api, datasets) == 0
                ):
                    say(f"{what}: no node holds its data yet; adding preferred terms instead")
                    want_required = False
            except (LookupFailed, KubeError) as exc:
                raise BackendError(f"{what}: cannot resolve its volumes: {exc}") from None
            if not datasets:
                say(f"{what}: no pffs volumes; left as it is")
                continue
            add_affinity(template, datasets, want_required)
    return _dump(docs, as_json)


def run(manifest: str, required: bool, api_url: str | None, namespace: str | None) -> int:
    """The `pffs affinity` command."""
    try:
        if manifest == "-":
            text = sys.stdin.read()
        else:
            with open(manifest, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {manifest}: {exc.strerror}") from None
    api: KubeClient | None
    try:
        api = KubeClient.from_url(api_url)
    except KubeError:
        api = None  # only PVC volumes need it; they say so when met
    sys.stdout.write(annotate(text, api, required, namespace))
    return 0

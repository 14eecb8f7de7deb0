"""The import rules of docs/ARCHITECTURE.md, checked on the source: every import (lazy ones
included) goes to a layer the importer may use, and no modules import each other in a circle."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folders of the repository and the import names they ship as (pyproject's package-dir).
PACKAGES = {"pffs": "pffs", "backends": "pffs.backends", "csi": "pffs.csi", "bench": "bench"}
GENERATED = {"pffs.csi.proto.csi_pb2", "pffs.csi.proto.csi_pb2_grpc"}

CORE = (
    "pffs.version",
    "pffs.config",
    "pffs.credentials",
    "pffs.errors",
    "pffs.sizes",
    "pffs.optionvalues",
    "pffs.optiontable",
    "pffs.retry",
    "pffs.logs",
    "pffs.logfile",
    "pffs.workers",
    "pffs.flow",
    "pffs.privatefiles",
    "pffs.kube",
)
# Layer of a module: the longest matching prefix wins.
LAYERS = {
    **dict.fromkeys(CORE, "core"),
    "pffs.metrics": "metrics",
    "pffs.testing": "testing",
    "pffs.backends": "backends",
    "pffs.cache": "cache",
    "pffs.group": "group",
    "pffs.routing": "routing",
    "pffs.store": "store",
    "pffs.fs": "fs",
    "pffs.fuse_ops": "kernel edge",
    "pffs.mounting": "mounting",
    # The scheduler side of csi/ (data affinity, csi/affinity/); the rest of csi/ is the driver.
    "pffs.csi.affinity": "scheduler",
    "pffs.csi": "csi driver",
    "pffs.cli": "cli",
    "pffs.__main__": "cli",  # `python -m pffs` is the `pffs` command
    "bench": "bench",
    "pffs": "api",  # pffs/__init__.py: the version and mount(), for programs that embed pffs
}
BELOW = {
    "core": set(),
    "metrics": {"core"},
    "testing": {"core"},
    "backends": {"core", "metrics"},
    "cache": {"core", "metrics"},
    "routing": {"core", "metrics", "backends"},
    # The store adapter: a source as a fetch sees it.
    "store": {"core", "metrics", "backends", "routing", "cache"},
    # On the store: the owner's side of a peer's ask loads through it; the cache and the store
    # never import the group.
    "group": {"core", "metrics", "routing", "cache", "store"},
    "fs": {"core", "metrics", "backends", "routing", "cache", "group", "store"},
    "kernel edge": {"core", "metrics", "fs"},
    "scheduler": {"core", "metrics", "backends", "routing"},
    "csi driver": {"core", "metrics", "backends", "routing", "mounting", "scheduler"},
    "api": {"core", "mounting"},
}
BELOW["mounting"] = BELOW["fs"] | {"fs", "kernel edge"}
BELOW["cli"] = set(BELOW) - {"cli"} | {"testing"}
BELOW["bench"] = set(BELOW) - {"bench"} | {"testing", "cli"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join([name, *parts])
            if module not in GENERATED:
                found[module] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
    # `from pffs.x import y` names module pffs.x.y when it exists, else pffs.x: keep the deepest.
    return {t for t in targets if not any(o.startswith(t + ".") for o in targets)}


def layer(module: str) -> str:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


@functools.cache  # the tree is read once for the three tests (none changes the graph)
def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports_of(m, p, set(found)) for m, p in found.items()}


def test_every_import_goes_down_a_layer() -> None:
    wrong = [
        f"{module} ({layer(module)}) imports {target} ({layer(target)})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer(target) != layer(module) and layer(target) not in BELOW[layer(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_circles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not circles, circles


def test_the_checker_sees_the_layers() -> None:
    """A guard against a checker that passes because it read nothing."""
    edges = graph()
    assert "pffs.fs.vfs" in edges and "pffs.cache.blocks" in edges["pffs.fs.vfs"]
    assert "pffs.fs.vfs" in edges["pffs.fuse_ops"]
    assert layer("pffs.csi.affinity.scoring") == "scheduler"
    assert layer("pffs.csi.node") == "csi driver"
    assert "pffs.csi.affinity.publisher" in edges["pffs.csi.server"]

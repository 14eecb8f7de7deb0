"""Backends: one module per store, chosen by URL scheme and imported lazily.

A scheme maps to "module:Class". The module is imported only when a source with that scheme is
opened, so a missing optional dependency (say pyarrow's HDFS support) costs nothing until used,
and then fails with an install hint rather than a traceback.

What every backend must do, and what it may declare beyond reads, is in base.py.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from pffs.backends.base import Backend, ObjectInfo
from pffs.config import SourceConfig
from pffs.errors import UsageError

__all__ = ["REGISTRY", "Backend", "BackendEntry", "ObjectInfo", "open_backend", "scheme_of"]


@dataclass(frozen=True)
class BackendEntry:
    """One scheme's backend: where its class is, and what the front ends must know of it."""

    target: str  # module:Class
    install: str  # what to install when the import fails
    # It reads the files of the machine it runs on, at the URL's path (file:///dir): a front
    # end taking URLs from someone less trusted (Fluid, CSI) holds these to the directories it
    # allows. Every backend that opens a path of this machine says so here.
    node_files: bool = False


REGISTRY: dict[str, BackendEntry] = {
    "s3": BackendEntry("pffs.backends.s3:S3Backend", "pip install boto3"),
    "hdfs": BackendEntry(
        "pffs.backends.hdfs:HdfsBackend", "pip install pyarrow (and Java + Hadoop)"
    ),
    "file": BackendEntry("pffs.backends.local:LocalBackend", "(part of pffs)", node_files=True),
    # A local directory through pyarrow's filesystem layer: the HDFS code paths, no cluster.
    "arrow+file": BackendEntry(
        "pffs.backends.arrow:ArrowLocalBackend", "pip install pyarrow", node_files=True
    ),
}


def scheme_of(url: str) -> str:
    """The URL's scheme, or a UsageError naming the schemes pffs knows."""
    scheme = urlsplit(url).scheme.lower()
    if not scheme:
        known = ", ".join(f"{s}://" for s in REGISTRY)
        raise UsageError(f"source {url!r} has no scheme: use one of {known}")
    if scheme not in REGISTRY:
        known = ", ".join(f"{s}://" for s in REGISTRY)
        raise UsageError(f"unknown scheme {scheme}:// in {url!r}: use one of {known}")
    return scheme


def open_backend(source: SourceConfig) -> Backend:
    """Build the backend for `source` (no network traffic; call .check() for that)."""
    entry = REGISTRY[scheme_of(source.url)]
    module_name, class_name = entry.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"the {scheme_of(source.url)}:// backend needs {exc.name}: {entry.install}"
        ) from exc
    backend: Backend = getattr(module, class_name)(source)
    return backend

"""Backends: one module per store, chosen by URL scheme and imported lazily.

A scheme maps to "module:Class". The module is imported only when a source with that scheme is
opened, so a missing optional dependency (say pyarrow's HDFS support) costs nothing until used,
and then fails with an install hint rather than a traceback.

What every backend must do, and what it may declare beyond reads, is in base.py.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from pffs.backends.base import Backend, ObjectInfo
from pffs.config import SourceConfig
from pffs.errors import UsageError

__all__ = ["REGISTRY", "Backend", "ObjectInfo", "open_backend", "scheme_of"]

REGISTRY: dict[str, tuple[str, str]] = {
    # scheme: (module:Class, what to install when the import fails)
    "s3": ("pffs.backends.s3:S3Backend", "pip install boto3"),
    "hdfs": ("pffs.backends.hdfs:HdfsBackend", "pip install pyarrow (and Java + Hadoop)"),
    "file": ("pffs.backends.local:LocalBackend", "(part of pffs)"),
    # A local directory through pyarrow's filesystem layer: the HDFS code paths, no cluster.
    "arrow+file": ("pffs.backends.arrow:ArrowLocalBackend", "pip install pyarrow"),
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
    target, hint = REGISTRY[scheme_of(source.url)]
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"the {scheme_of(source.url)}:// backend needs {exc.name}: {hint}"
        ) from exc
    backend: Backend = getattr(module, class_name)(source)
    return backend

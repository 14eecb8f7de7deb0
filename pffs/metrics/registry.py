"""The one registry every pffs metric is in (the package's docstring says who reads it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics

# The `_created` series double every counter for little use; Prometheus has its own resets.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
REGISTRY = CollectorRegistry(auto_describe=True)
# Memory and CPU of the mount process: "memory growth until OOM" is the top complaint of peers.
ProcessCollector(namespace="pffs", registry=REGISTRY)

"""Wiring a mount to pffs.metrics: the cache's counters, its sources' paces, the mount's facts
shown in the snapshot, the slow-request threshold and the Prometheus endpoint (`--metrics ADDR`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from pffs import metrics
from pffs.config import MountConfig
from pffs.errors import UsageError
from pffs.fs.vfs import Vfs

log = logging.getLogger(__name__)


def cache_reader(vfs: Vfs) -> Callable[[], Mapping[str, int]]:
    """What the metrics collector reads of a mount's cache (called from any thread)."""
    cache = vfs.cache

    def read() -> Mapping[str, int]:
        values = cache.gauges() | vfs.datasets.gauges()
        values["staged_files"] = len(vfs.writer.staged)
        return values

    return read


def pace_reader(vfs: Vfs) -> Callable[[], Mapping[str, Mapping[str, int]]]:
    """What the metrics collector reads of the sources' flows (pffs.flow.permits), by source id."""
    mounted = list(vfs.table.mounted)

    def read() -> Mapping[str, Mapping[str, int]]:
        return {entry.backend.source_id: entry.flow.gauges() for entry in mounted}

    return read


def start_observing(config: MountConfig, vfs: Vfs) -> Callable[[], None]:
    """Connect a mount to pffs.metrics; returns the function that disconnects it.

    The Prometheus endpoint is started here, before the mount: an address in use is a
    one-line error, not a mount without the metrics the operator asked for.
    """
    observe = config.observe
    metrics.SETTINGS.slow_request = observe.slow_request
    metrics.set_info(
        mountpoint=config.fuse.mountpoint,
        name=config.name,
        sources=[m.backend.source_id for m in vfs.table.mounted],
        metrics_address=observe.metrics_address,
    )
    reader = cache_reader(vfs)
    metrics.cache.watch(reader)
    paces = pace_reader(vfs)
    metrics.paces.watch(paces)
    datasets = vfs.cache.room.describe
    metrics.cache.watch_datasets(datasets)
    server = None
    if observe.metrics_address:
        try:
            server, _ = metrics.serve_http(observe.metrics_address)
        except OSError as exc:
            metrics.cache.unwatch(reader)
            metrics.paces.unwatch(paces)
            metrics.cache.unwatch_datasets(datasets)
            raise UsageError(
                f"--metrics {observe.metrics_address}: cannot listen ({exc.strerror or exc})"
            ) from None
        log.info("Prometheus metrics at http://%s/metrics", observe.metrics_address)

    def stop() -> None:
        metrics.cache.unwatch(reader)
        metrics.paces.unwatch(paces)
        metrics.cache.unwatch_datasets(datasets)
        if server is not None:
            server.shutdown()
            server.server_close()

    return stop

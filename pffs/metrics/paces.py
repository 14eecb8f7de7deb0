"""Each source's pace of loading ahead (pffs.flow.permits) as metrics: its permits, what each
priority holds and waits for, and the store's throttling; plain integers read at scrape time,
one sample per source (and priority, the `use` label). The metric names keep their first words
(places, push backs), which dashboards and `pffs stats` read.

A mount hands `watch` a reader of its sources' `SourceFlow.gauges()` by source id
(pffs.mounting.observe); the collector turns them into metrics when the registry is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pffs.metrics.registry import REGISTRY

# SourceFlow.gauges() field -> (gauge, help), one sample per source.
_GAUGES = {
    "permits": ("pffs_pace_places", "Permits for loading ahead a source's pace gives now"),
    "ceiling": ("pffs_pace_ceiling", "Permits for loading ahead a source's pace grows back to"),
}
_COUNTERS = {
    "throttled": ("pffs_pace_pushbacks", "Requests the store throttled (503 SlowDown, timeouts)"),
    "halvings": ("pffs_pace_halvings", "Times a source's pace halved its permits"),
}
# Per priority (readahead, preload, warmup): "<priority>_<field>" -> (gauge, help).
_BY_USE = {
    "in_flight": ("pffs_pace_in_flight", "Requests loading ahead holding a permit, by use"),
    "waiting": ("pffs_pace_waiting", "Requests loading ahead waiting for a permit, by use"),
}

PaceReader = Callable[[], Mapping[str, Mapping[str, int]]]


class _PaceCollector(Collector):
    def __init__(self) -> None:
        self.readers: list[PaceReader] = []

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, dict[str, int]] = {}
        for reader in list(self.readers):
            for source, values in reader().items():
                summed = totals.setdefault(source, {})
                for name, value in values.items():
                    summed[name] = summed.get(name, 0) + int(value)
        for field, (name, doc) in _GAUGES.items():
            gauge = GaugeMetricFamily(name, doc, labels=["source"])
            for source, values in totals.items():
                gauge.add_metric([source], values.get(field, 0))
            yield gauge
        for field, (name, doc) in _COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["source"])
            for source, values in totals.items():
                counter.add_metric([source], values.get(field, 0))
            yield counter
        for field, (name, doc) in _BY_USE.items():
            gauge = GaugeMetricFamily(name, doc, labels=["source", "use"])
            for source, values in totals.items():
                for key, value in values.items():
                    if key.endswith(f"_{field}"):
                        gauge.add_metric([source, key.removesuffix(f"_{field}")], value)
            yield gauge

    def describe(self) -> Iterator[Metric]:
        return self.collect()


_PACES = _PaceCollector()
REGISTRY.register(_PACES)


def watch(reader: PaceReader) -> None:
    """Report the flows `reader()` returns: `SourceFlow.gauges()` by source id."""
    _PACES.readers.append(reader)


def unwatch(reader: PaceReader) -> None:
    if reader in _PACES.readers:
        _PACES.readers.remove(reader)

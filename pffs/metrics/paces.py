"""Each source's pace (pffs.pace) as metrics: its places, what each use holds and waits for, and
the store's push backs; plain integers read at scrape time, one sample per source (and use).

A mount hands `watch` a reader of its sources' `Pace.gauges()` by source id
(pffs.mounting.observe); the collector turns them into metrics when the registry is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pffs.metrics.registry import REGISTRY

# Pace.gauges() field -> (gauge, help), one sample per source.
_GAUGES = {
    "places": ("pffs_pace_places", "Places for loading ahead a source's pace gives now"),
    "ceiling": ("pffs_pace_ceiling", "Places for loading ahead a source's pace grows back to"),
}
_COUNTERS = {
    "pushbacks": ("pffs_pace_pushbacks", "Store push backs (503 SlowDown, timeouts) a pace heard"),
    "halvings": ("pffs_pace_halvings", "Times a source's pace halved its places"),
}
# Per use (readahead, preload, warmup): "<use>_<field>" -> (gauge, help).
_BY_USE = {
    "in_flight": ("pffs_pace_in_flight", "Requests loading ahead in a source's places, by use"),
    "waiting": ("pffs_pace_waiting", "Requests loading ahead waiting for a place, by use"),
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
    """Report the paces `reader()` returns: `Pace.gauges()` by source id."""
    _PACES.readers.append(reader)


def unwatch(reader: PaceReader) -> None:
    if reader in _PACES.readers:
        _PACES.readers.remove(reader)

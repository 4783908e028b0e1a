"""Prometheus exposition of the catalogue: a prometheus-client ``Collector`` that reads the snapshot at scrape time.

There is no second bookkeeping: every scrape takes one snapshot and turns each catalogue metric into a metric
family. Names come from :mod:`specscope.export.catalogue` and contain no colon, so they are the same whatever
exposition format the scraper negotiates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from specscope.core.model import Histogram, Snapshot
from specscope.export import catalogue

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def label_name(attribute: str) -> str:
    """OpenTelemetry attribute key → Prometheus label name (invalid characters become ``_``)."""
    return _INVALID.sub("_", attribute)


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    out, total = [], 0
    for bound, n in zip(h.bounds, h.counts, strict=False):
        total += n
        out.append((repr(float(bound)), float(total)))
    out.append(("+Inf", float(h.count)))
    return out


class SnapshotCollector(Collector):
    """Yields every catalogue metric from ``source()`` (a hub's ``snapshot`` method, usually)."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus-client at each scrape."""
        snap = self._source()
        for m in catalogue.METRICS:
            samples = list(m.read(snap))
            labels = [label_name(a) for a in m.attributes]
            name = m.prometheus_name
            fam: Any
            if m.kind == "counter":
                fam = CounterMetricFamily(name.removesuffix("_total"), m.description, labels=labels)
            elif m.kind == "histogram":
                fam = HistogramMetricFamily(name, m.description, labels=labels)
            else:
                fam = GaugeMetricFamily(name, m.description, labels=labels)
            for attrs, value in samples:
                values = [attrs.get(a, "") for a in m.attributes]
                if isinstance(value, Histogram):
                    fam.add_metric(values, _buckets(value), sum_value=value.total)
                else:
                    fam.add_metric(values, value)
            yield fam

"""A fleet read from Prometheus-compatible storage (Prometheus, VictoriaMetrics, Thanos, Mimir) instead of polling
every replica: two instant queries per refresh return every replica's ``vllm:*`` series, and specscope's exported
``specscope_*`` series where Prometheus scrapes specscope's endpoint too, split by replica (``job`` and
``instance``) and mapped into a snapshot each, as ``--vllm`` maps one server's ``/metrics`` page (engines by
vLLM's ``engine`` label): the series' current values (lifetime counters, gauges), and each counter's
``increase()`` over the window (``rate()`` times its length) from the storage's own history, so the first frame
already has a window and it survives a restart of the dashboard. A specscope endpoint is a replica of its own
(another target than vLLM's port); its snapshot adds the draft, the method and the tokenizer check. Series
stored as ``vllm_*`` (underscore escaping) read as ``vllm:*``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from typing import Any

from specscope.core.auth import base_url
from specscope.core.model import Snapshot
from specscope.export.alerts.recording import duration
from specscope.read.metrics_snapshot import (
    SPECSCOPE_COUNTERS,
    SPECSCOPE_SERIES,
    VLLM_COUNTERS,
    VLLM_HISTOGRAMS,
    VLLM_SERIES,
    as_vllm,
    specscope_snapshot,
    vllm_snapshot,
    with_window,
)
from specscope.read.promtext import Samples
from specscope.read.scrape import SourceError, http_get

_SELECTOR = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*,?\s*)*$')


def selector_matchers(selector: str) -> str:
    """``job="vllm",env="prod"`` (braces optional) as matchers to add to a query; ValueError when malformed."""
    inner = selector.strip().removeprefix("{").removesuffix("}").strip().rstrip(",")
    if inner and not _SELECTOR.match(inner):
        raise ValueError(f"not a label selector: {selector!r} (expected e.g. job=\"vllm\",env=~\"prod.*\")")
    return inner


#: The label that carries a windowed counter's name (``increase()`` drops ``__name__``; ``or`` ignores it).
_SERIES = "specscope_series"


def _vllm(names: str) -> str:
    """A name pattern for vLLM's series ``names``, as ``vllm:`` and ``vllm_``: a scrape that negotiates underscore
    escaping stores vLLM's vllm:x as vllm_x (docs/export.md)."""
    return f"vllm[:_]({names})"


def _selector(pattern: str, matchers: str) -> str:
    """Series whose name matches ``pattern``, narrowed by the user's ``matchers``."""
    return f'{{__name__=~"{pattern}"' + (f",{matchers}" if matchers else "") + "}"


class PrometheusFleet:
    """Every replica a Prometheus-compatible server holds ``vllm:*`` series for; two queries serve all replicas'
    snapshots of one refresh (results younger than ``max_age`` seconds are reused). ``window_s``: the window of
    the counters' ``increase()`` (set it to change the window from the next refresh on)."""

    def __init__(self, url: str, selector: str = "", timeout: float = 2.0, max_age: float = 0.5,
                 window_s: float = 60.0) -> None:
        self.url = base_url(url)
        self.matchers = selector_matchers(selector)
        # Only the series the snapshot reads (a fleet's other histograms are most of its series).
        names = "|".join([*VLLM_SERIES, *(f"{h}_(bucket|sum)" for h in VLLM_HISTOGRAMS)])
        self.query = _selector("|".join([_vllm(names), *SPECSCOPE_SERIES]), self.matchers)
        self.window_s = window_s
        self.timeout = timeout
        self.max_age = max_age
        self._lock = threading.Lock()
        self._at = 0.0
        self._result: dict[str, tuple[Samples, Samples, float]] | SourceError = {}

    def window_query(self, window_s: float) -> str:
        """Each counter's increase over the window, named by a label (one query for all of them)."""
        w = duration(window_s)
        counters = [(_vllm(name), f"vllm:{name}") for name in VLLM_COUNTERS] + [(n, n) for n in SPECSCOPE_COUNTERS]
        return " or ".join(f'label_replace(increase({_selector(pattern, self.matchers)}[{w}]), "{_SERIES}", '
                           f'"{name}", "__name__", ".*")' for pattern, name in counters)

    def _query(self, query: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query"
        try:
            text = http_get(url, self.timeout, data=urllib.parse.urlencode({"query": query}).encode())
        except SourceError as exc:
            if "HTTP 400" in str(exc) or "HTTP 422" in str(exc):
                raise SourceError(f"the query {query[:200]} was refused (PromQL error)") from None
            if any(f"HTTP {code}" in str(exc) for code in (404, 405, 501)):
                raise SourceError(f"not a Prometheus query API ({str(exc).rsplit(': ', 1)[-1]} at {url})") from None
            raise SourceError(str(exc)) from None
        try:
            doc = json.loads(text)
            if doc.get("status") != "success":
                raise SourceError(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}"[:200])
            rows: list[dict[str, Any]] = doc["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SourceError("not a Prometheus query API (no /api/v1/query answer)") from None
        return rows

    def _fetch(self) -> dict[str, tuple[Samples, Samples, float]]:
        window_s = self.window_s
        found: tuple[dict[str, Samples], dict[str, Samples]] = ({}, {})
        for windowed, query in ((0, self.query), (1, self.window_query(window_s))):
            for row in self._query(query):
                labels = dict(row["metric"])
                name = labels.pop(_SERIES if windowed else "__name__")
                name = "vllm:" + name[5:] if name.startswith("vllm_") else name
                replica = f"{labels.pop('job', '')}/{labels.pop('instance', '')}".strip("/")
                found[windowed].setdefault(replica, {}).setdefault(name, []).append((labels, float(row["value"][1])))
        current, increases = found
        return {r: (samples, increases.get(r, {}), window_s) for r, samples in current.items()}

    def samples(self) -> dict[str, tuple[Samples, Samples, float]]:
        """Every replica's ``(current samples, increases over the window, window seconds)`` by replica name
        (``job/instance``), from one refresh per ``max_age``."""
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.max_age:
                try:
                    self._result = self._fetch()
                except SourceError as exc:
                    self._result = exc
                self._at = now
            if isinstance(self._result, SourceError):
                raise self._result
            return self._result

    def sources(self) -> list[PrometheusReplica]:
        """A source per replica found now; one standing for the first replica to appear when none match yet (it
        shows why until then), so a dashboard started early recovers."""
        try:
            names = sorted(self.samples())
        except SourceError:
            names = []
        return [PrometheusReplica(self, n) for n in names] or [PrometheusReplica(self, None)]


class PrometheusReplica:
    """One replica (``job/instance``) of a :class:`PrometheusFleet`, as a dashboard source."""

    def __init__(self, fleet: PrometheusFleet, replica: str | None) -> None:
        self.fleet = fleet
        self.replica = replica
        self.name = replica or fleet.url

    @property
    def window_s(self) -> float:
        """The window the storage computes (the fleet's: one query serves every replica)."""
        return self.fleet.window_s

    @window_s.setter
    def window_s(self, seconds: float) -> None:
        self.fleet.window_s = seconds

    def fetch(self) -> Snapshot:
        """The replica's snapshot from the fleet's latest query."""
        by_replica = self.fleet.samples()
        if self.replica is None and by_replica:
            self.replica = sorted(by_replica)[0]
        found = by_replica.get(self.replica or "")
        if not found or not found[0]:
            raise SourceError(f"no series match {self.fleet.query}"
                              + (f" for {self.replica}" if self.replica else ""))
        samples, increases, window_s = found
        try:
            if any(name.startswith("vllm:") for name in samples):
                return with_window(vllm_snapshot(samples, time.time()), increases, window_s)
            return with_window(specscope_snapshot(samples, time.time()), as_vllm(increases), window_s)
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"unreadable series ({str(exc)[:80]})") from None

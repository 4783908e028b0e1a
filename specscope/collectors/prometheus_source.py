"""A fleet read from Prometheus-compatible storage (Prometheus, VictoriaMetrics, Thanos, Mimir) instead of polling
every replica: one instant query per refresh returns every replica's ``vllm:*`` series, split by replica (``job``
and ``instance``) and mapped into a snapshot each, as ``--vllm`` maps one server's ``/metrics`` page (engines by
vLLM's ``engine`` label). Windows come from successive refreshes, as for ``--vllm``. Series stored as ``vllm_*``
(underscore escaping) read as ``vllm:*``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse

from specscope.collectors.promtext import Samples
from specscope.collectors.scrape import (
    VLLM_HISTOGRAMS,
    VLLM_SERIES,
    SourceError,
    base_url,
    http_get,
    vllm_snapshot,
)
from specscope.model import Snapshot

_SELECTOR = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*,?\s*)*$')


def selector_matchers(selector: str) -> str:
    """``job="vllm",env="prod"`` (braces optional) as matchers to add to a query; ValueError when malformed."""
    inner = selector.strip().removeprefix("{").removesuffix("}").strip().rstrip(",")
    if inner and not _SELECTOR.match(inner):
        raise ValueError(f"not a label selector: {selector!r} (expected e.g. job=\"vllm\",env=~\"prod.*\")")
    return inner


class PrometheusFleet:
    """Every replica a Prometheus-compatible server holds ``vllm:*`` series for; one query serves all replicas'
    snapshots of one refresh (results younger than ``max_age`` seconds are reused)."""

    def __init__(self, url: str, selector: str = "", timeout: float = 2.0, max_age: float = 0.5) -> None:
        self.url = base_url(url)
        matchers = selector_matchers(selector)
        # Only the series the snapshot reads (a fleet's other histograms are most of its series), and vllm_ too: a
        # scrape that negotiates underscore escaping stores vLLM's vllm:x as vllm_x (docs/export.md).
        names = "|".join([*VLLM_SERIES, *(f"{h}_(bucket|sum)" for h in VLLM_HISTOGRAMS)])
        self.query = f'{{__name__=~"vllm[:_]({names})"' + (f",{matchers}" if matchers else "") + "}"
        self.timeout = timeout
        self.max_age = max_age
        self._lock = threading.Lock()
        self._at = 0.0
        self._result: dict[str, Samples] | SourceError = {}

    def _fetch(self) -> dict[str, Samples]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": self.query})
        try:
            text = http_get(url, self.timeout)
        except SourceError as exc:
            if "HTTP 400" in str(exc) or "HTTP 422" in str(exc):
                raise SourceError(f"the query {self.query} was refused (PromQL error)") from None
            raise SourceError(str(exc).replace(url, "/api/v1/query")) from None
        try:
            doc = json.loads(text)
            if doc.get("status") != "success":
                raise SourceError(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}"[:200])
            rows = doc["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SourceError("not a Prometheus query API (no /api/v1/query answer)") from None
        out: dict[str, Samples] = {}
        for row in rows:
            labels = dict(row["metric"])
            name = labels.pop("__name__")
            name = "vllm:" + name[5:] if name.startswith("vllm_") else name
            replica = f"{labels.pop('job', '')}/{labels.pop('instance', '')}".strip("/")
            out.setdefault(replica, {}).setdefault(name, []).append((labels, float(row["value"][1])))
        return out

    def samples(self) -> dict[str, Samples]:
        """Every replica's samples by replica name (``job/instance``), from one query per ``max_age``."""
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

    def fetch(self) -> Snapshot:
        """The replica's snapshot from the fleet's latest query."""
        by_replica = self.fleet.samples()
        if self.replica is None and by_replica:
            self.replica = sorted(by_replica)[0]
        samples = by_replica.get(self.replica or "")
        if not samples:
            raise SourceError(f"no series match {self.fleet.query}"
                              + (f" for {self.replica}" if self.replica else ""))
        try:
            return vllm_snapshot(samples, time.time())
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"unreadable series ({str(exc)[:80]})") from None

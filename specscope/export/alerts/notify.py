"""Notifiers: a log line, a JSON-lines file, and Alertmanager's API v2."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from specscope.core.auth import read_url
from specscope.export.alerts.evaluate import Alert

log = logging.getLogger("specscope.alerts")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class LogNotifier:
    """One log line per transition: WARNING when firing, INFO when resolved."""

    def notify(self, alerts: Sequence[Alert]) -> None:
        for a in alerts:
            level = logging.WARNING if a.state == "firing" else logging.INFO
            log.log(level, "[%s] %s %s: %s", a.severity.upper(), a.rule, a.state, a.summary)


class JsonLinesNotifier:
    """Appends one JSON object per transition to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def notify(self, alerts: Sequence[Alert]) -> None:
        with self._lock, self.path.open("a") as f:
            for a in alerts:
                row = asdict(a)
                row["labels"] = dict(a.labels)
                f.write(json.dumps(row) + "\n")


def alertmanager_payload(alerts: Sequence[Alert]) -> list[dict[str, object]]:
    """Alertmanager API v2 ``postableAlerts``: labels, annotations, startsAt, endsAt for resolved ones."""
    out = []
    for a in alerts:
        item: dict[str, object] = {
            "labels": {"alertname": a.rule, "severity": a.severity, "source": "specscope", **dict(a.labels)},
            "annotations": {"summary": a.summary, "description": a.description, "runbook_url": a.runbook_url},
            "startsAt": _iso(a.fired_at or a.active_since),
        }
        if a.state == "resolved":
            item["endsAt"] = _iso(a.resolved_at)
        out.append(item)
    return out


class AlertmanagerNotifier:
    """POSTs to ``{url}/api/v2/alerts``: transitions, and firing alerts again at every evaluation."""

    resend_firing = True

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s = timeout_s

    def notify(self, alerts: Sequence[Alert]) -> None:
        body = json.dumps(alertmanager_payload(alerts)).encode()
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        read_url(req, timeout=self.timeout_s)

"""Alerts: rules defined once (rules.py), evaluated in-process (evaluate.py), sent by notifiers (notify.py), and
rendered as Prometheus alerting rules (prometheus_rules.py)."""

from __future__ import annotations

from pathlib import Path

from specscope.export.alerts.evaluate import AlertLoop, Evaluator, Notifier
from specscope.export.alerts.rules import Thresholds
from specscope.state.hub import Hub


def start(hub: Hub, thresholds: Thresholds | None = None, *, jsonl: str | Path | None = None,
          alertmanager: str | None = None, log: bool = True, interval_s: float = 5.0) -> AlertLoop:
    """Evaluate every rule on ``hub`` every ``interval_s`` seconds and notify: a log line, a JSON-lines file,
    Alertmanager (API v2 at ``alertmanager``). ``.evaluator.active()`` lists pending and firing alerts."""
    from specscope.export.alerts.notify import AlertmanagerNotifier, JsonLinesNotifier, LogNotifier

    notifiers: list[Notifier] = [LogNotifier()] if log else []
    if jsonl:
        notifiers.append(JsonLinesNotifier(jsonl))
    if alertmanager:
        notifiers.append(AlertmanagerNotifier(alertmanager))
    return AlertLoop(Evaluator(hub, thresholds=thresholds, notifiers=notifiers), interval_s)

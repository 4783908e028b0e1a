"""In-process alert evaluation: pending → firing → resolved, one alert per rule, notified once per transition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from specscope.core.health import ErrorSink
from specscope.core.model import Snapshot
from specscope.export.alerts.rules import RULES, Rule, Thresholds, describe
from specscope.export.catalogue import engine_views, server_attrs
from specscope.state.hub import Hub

State = Literal["pending", "firing", "resolved"]


@dataclass(frozen=True)
class Alert:
    """One alert's state, with the words and numbers that explain it."""

    rule: str
    state: State
    severity: str
    summary: str
    description: str
    value: float | None
    labels: tuple[tuple[str, str], ...]
    runbook_url: str
    active_since: float
    fired_at: float | None = None
    resolved_at: float | None = None


class Notifier(Protocol):
    """Receives alerts that started firing or resolved."""

    def notify(self, alerts: Sequence[Alert]) -> None: ...


def notify(notifiers: Sequence[Notifier], changed: list[Alert], firing: list[Alert],
           on_error: Callable[[str, Exception], None]) -> None:
    """Tell each notifier of the alerts that ``changed`` state; those that want it (``resend_firing``:
    Alertmanager forgets alerts that are not re-sent) of every still ``firing`` one too. A notifier that fails is
    said to ``on_error`` and the others are told all the same."""
    for notifier in notifiers:
        batch = changed + firing if getattr(notifier, "resend_firing", False) else changed
        if not batch:
            continue
        try:
            notifier.notify(batch)
        except Exception as exc:
            on_error(f"notifier {type(notifier).__name__}", exc)


class Evaluator:
    """Evaluates rules on snapshots; thread-safe. Failures of rules and notifiers go to the error sink ``on_error``
    (default: the hub's health), never raised. ``hub`` is only where snapshots come from: :meth:`evaluate` without a
    snapshot reads the hub's over the thresholds' ``window_s``, the window the Prometheus rules use too."""

    def __init__(self, hub: Hub | None = None, rules: Sequence[Rule] = RULES, thresholds: Thresholds | None = None,
                 notifiers: Sequence[Notifier] = (), clock: Callable[[], float] = time.time,
                 on_error: ErrorSink | None = None) -> None:
        if on_error is None:
            if hub is None:
                raise ValueError("an Evaluator needs a hub or an error sink")
            on_error = hub.health.count_error
        self.hub = hub
        self.on_error = on_error
        self.rules = tuple(rules)
        self.thresholds = (thresholds or Thresholds()).check()
        self.notifiers = list(notifiers)
        self._clock = clock
        self._lock = threading.Lock()
        self._alerts: dict[tuple[str, str], Alert] = {}  # by (rule, engine; "" for the server's rules)
        self._last_true: dict[tuple[str, str], float] = {}

    def evaluate(self, snap: Snapshot | None = None) -> list[Alert]:
        """Advance every rule's state on ``snap`` (default: the hub's, over the thresholds' window); return the
        transitions."""
        if snap is None:
            if self.hub is None:
                raise ValueError("evaluate() without a hub needs a snapshot")
            snap = self.hub.snapshot(self.thresholds.window_s)
        now = self._clock()
        t = self.thresholds
        changed: list[Alert] = []
        server = server_attrs(snap)
        engines = [(index, {**server, "engine": index}, view) for index, view in engine_views(snap)]
        classes = [(f"class:{c.name}", {**server, "traffic_class": c.name},
                    replace(snap, classes=(c, *(o for o in snap.classes if o is not c)))) for c in snap.classes]
        with self._lock:
            for rule in self.rules:
                subjects = (classes if rule.per_class else engines if rule.per_engine and engines
                            else [("", server, snap)])
                for engine, labels, view in subjects:
                    try:
                        active = rule.firing(view, t)
                    except Exception as exc:
                        self.on_error(f"alert rule {rule.name}", exc)
                        continue
                    changed += self._advance(rule, (rule.name, engine), labels, view, active, now)
            firing = [a for a in self._alerts.values() if a.state == "firing" and a not in changed]
        notify(self.notifiers, changed, firing, self.on_error)
        return changed

    def _advance(self, rule: Rule, key: tuple[str, str], labels: dict[str, str], snap: Snapshot, active: bool,
                 now: float) -> list[Alert]:
        """One rule on one subject (an engine, or the server): its next state; the transitions (under the lock)."""
        t = self.thresholds
        current = self._alerts.get(key)
        if active:
            self._last_true[key] = now
            summary, description = describe(rule, snap, t)
            if current is None or current.state == "resolved":
                current = Alert(rule.name, "pending", rule.severity, summary, description, rule.value(snap),
                                tuple(sorted(labels.items())), rule.runbook_url, now)
            else:
                current = replace(current, summary=summary, description=description, value=rule.value(snap))
            self._alerts[key] = current
            if current.state == "pending" and now - current.active_since >= rule.for_s(t):
                current = self._alerts[key] = replace(current, state="firing", fired_at=now)
                return [current]
        elif current is not None and current.state != "resolved":
            if current.state == "pending":
                del self._alerts[key]  # never fired: nothing to tell
            elif now - self._last_true.get(key, now) >= t.keep_firing_for_s:
                current = self._alerts[key] = replace(current, state="resolved", resolved_at=now)
                return [current]
        return []

    def active(self) -> list[Alert]:
        """Pending and firing alerts, firing first."""
        with self._lock:
            alerts = [a for a in self._alerts.values() if a.state != "resolved"]
        return sorted(alerts, key=lambda a: (a.state != "firing", a.rule))


class AlertLoop:
    """Evaluates every ``interval_s`` seconds on a daemon thread; :meth:`stop` ends it."""

    def __init__(self, evaluator: Evaluator, interval_s: float = 5.0) -> None:
        self.evaluator = evaluator
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="specscope-alerts", daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.evaluator.evaluate()
            except Exception as exc:
                self.evaluator.on_error("alert loop", exc)

    def stop(self) -> None:
        """Stop evaluating."""
        self._stop.set()
        self._thread.join(5)

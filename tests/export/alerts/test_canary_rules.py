"""The canary's alert: one definition, rendered as the checked-in rule file promtool accepts and tests, and evaluated
in-process with the same condition."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from specscope.export.alerts import canary
from specscope.export.alerts.canary import ALERT, DECISION, SHARE, CanaryAlerts, Reading, fires
from specscope.export.alerts.evaluate import Alert
from tests.conftest import REPO
from tests.export.alerts.test_prometheus_rules import needs_promtool, series

RULES = REPO / "deploy" / "prometheus" / "specscope-canary-rules.yml"


def test_checked_in_rule_file_equals_what_specscope_rules_canary_renders() -> None:
    assert RULES.read_text() == canary.render(), "run: specscope rules --canary > deploy/prometheus/..."
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "rules", "--canary"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == canary.render()
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "rules", "--canary", "--vllm"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("specscope: error: --canary renders the canary's rule alone")
    prometheus = yaml.safe_load((RULES.parent / "prometheus.yml").read_text())
    assert RULES.name in prometheus["rule_files"]


def test_every_canary_rule_has_a_runbook_section() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text().lower()
    assert f"## {ALERT.lower()}" in runbook
    assert "## a draft change on one replica first: the canary" in runbook


@needs_promtool
def test_promtool_check_rules() -> None:
    r = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def gauges(canary_id: str, cls: str | None, decision: int, share: float | None = None) -> list[dict[str, str]]:
    """One row of one canary's gauges (a `specscope compare` process: its ``instance``)."""
    lab = {"instance": f"{canary_id}:9465", "job": "specscope-canary", "incumbent": f"http://{canary_id}-a",
           "candidate": f"http://{canary_id}-b", **({"traffic_class": cls} if cls else {})}
    out = [series(DECISION, lab, f"{decision}x40")]
    if share is not None:
        out.append(series(SHARE, lab, f"{share}x40"))
    return out


@needs_promtool
def test_promtool_test_rules_fire_and_stay_quiet(tmp_path: Path) -> None:
    rule = canary.rule_groups()["groups"][0]["rules"][0]
    inputs = [
        *gauges("worse", None, -1),  # all traffic worse: fires
        *gauges("classy", None, 0), *gauges("classy", "code", -1, 0.3),  # a class of 30% worse: fires
        *gauges("classy", "rare", -1, 0.05),  # worse, but 5% of the requests: quiet
        *gauges("better", None, 1), *gauges("better", "chat", 1, 0.7),
        *gauges("unknown", None, 0), *gauges("unknown", "chat", 0, 0.7),
    ]

    def expected(canary_id: str, cls: str | None) -> dict[str, Any]:
        labels = {"instance": f"{canary_id}:9465", "job": "specscope-canary", "incumbent": f"http://{canary_id}-a",
                  "candidate": f"http://{canary_id}-b", **({"traffic_class": cls} if cls else {}), **rule["labels"]}
        summary = rule["annotations"]["summary"].replace(
            "{{ with $labels.traffic_class }}class {{ . }}{{ else }}all traffic{{ end }}",
            f"class {cls}" if cls else "all traffic")
        description = (rule["annotations"]["description"].replace("{{ $labels.candidate }}", labels["candidate"])
                       .replace("{{ $labels.incumbent }}", labels["incumbent"]))
        return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description,
                                                          "runbook_url": rule["annotations"]["runbook_url"]}}

    spec = {"rule_files": [str(RULES)], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": inputs,
                       "alert_rule_test": [{"eval_time": "1m", "alertname": ALERT,
                                            "exp_alerts": [expected("classy", "code"), expected("worse", None)]}]}]}
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def reading(cls: str | None, decision: str, share: float = 1.0) -> Reading:
    return Reading(cls, decision, -0.1 if decision == "worse" else 0.0, -0.15, -0.02 if decision == "worse" else 0.1,
                   share, (500, 480), 0.025)


class Collect:
    resend_firing = False

    def __init__(self) -> None:
        self.got: list[list[Alert]] = []

    def notify(self, alerts: Any) -> None:
        self.got.append(list(alerts))


class Resend(Collect):
    resend_firing = True


class Broken:
    def notify(self, alerts: Any) -> None:
        raise OSError("unreachable")


def test_in_process_the_same_condition_fires_resolves_and_notifies() -> None:
    assert fires(reading(None, "worse")) and fires(reading("code", "worse", 0.3))
    assert not fires(reading("rare", "worse", 0.05)) and not fires(reading(None, "not yet known"))
    assert not fires(reading(None, "better"))
    t = [100.0]
    log, am = Collect(), Resend()
    alerts = CanaryAlerts([log, am, Broken()], labels={"incumbent": "a", "candidate": "b"}, clock=lambda: t[0])
    assert alerts.evaluate([reading(None, "not yet known"), reading("code", "not yet known", 0.3)]) == []
    changed = alerts.evaluate([reading(None, "worse"), reading("code", "worse", 0.3), reading("rare", "worse", 0.05)])
    assert [(a.state, dict(a.labels).get("traffic_class")) for a in changed] == [("firing", None), ("firing", "code")]
    first = changed[0]
    assert first.rule == ALERT and first.fired_at == 100.0 and first.value == -0.1
    assert "[-0.150, -0.020] at α=2.50%, over 500 incumbent and 480 candidate requests" in first.description
    assert "(class code, 30% of the requests)" in changed[1].summary
    t[0] = 110.0
    assert alerts.evaluate([reading(None, "worse"), reading("code", "worse", 0.3)]) == []  # still firing: no news
    assert len(log.got) == 1 and len(am.got) == 2 and len(am.got[1]) == 2  # Alertmanager hears it again
    t[0] = 120.0
    resolved = alerts.evaluate([reading(None, "not yet known")])  # a fresh comparison: the class row is gone
    assert {(a.state, a.resolved_at) for a in resolved} == {("resolved", 120.0)}
    assert len(resolved) == 2 and alerts.active() == []

"""In-process evaluation: pending → firing → resolved, deduplicated; notifiers, a real Alertmanager included."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from specscope.core.model import EngineInfo, TokenizerStatus
from specscope.export.alerts.evaluate import Alert, AlertLoop, Evaluator
from specscope.export.alerts.notify import AlertmanagerNotifier, JsonLinesNotifier, LogNotifier
from specscope.export.alerts.rules import BY_RULE, RuleConfigError, Thresholds, load_thresholds
from specscope.state.hub import Hub, StepStats
from tests.conftest import free_port
from tests.state.test_hub import Clock


def drafting(hub: Hub, accepted_per_draft: int, drafts: int = 60, k: int = 4) -> None:
    per_pos = [drafts if accepted_per_draft > i else 0 for i in range(k)]
    hub.record_step(StepStats(num_spec_tokens=k, drafts=drafts, draft_tokens=drafts * k,
                              accepted=drafts * accepted_per_draft, accepted_per_pos=per_pos,
                              draft_tokens_per_pos=[drafts] * k, running=1, waiting=0, kv_usage=0.1))


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[Alert]] = []

    def notify(self, alerts: Any) -> None:
        self.batches.append(list(alerts))


def setup(window_s: float = 10, **thresholds: Any) -> tuple[Clock, Hub, Evaluator, Recorder]:
    clock = Clock()
    hub = Hub(window_s=window_s, clock=clock)
    hub.set_engine(EngineInfo(model="m", draft_model="d", method="draft_model", num_speculative_tokens=4))
    rec = Recorder()
    t = Thresholds(window_s=window_s, **thresholds)
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeWeakDraft"]], thresholds=t, notifiers=[rec], clock=clock)
    return clock, hub, ev, rec


def test_weak_draft_goes_pending_firing_resolved_and_notifies_once_each() -> None:
    clock, hub, ev, rec = setup(weak_draft_for_s=5, keep_firing_for_s=15)
    drafting(hub, accepted_per_draft=1)  # 240 draft tokens, 60 accepted: weak, not collapsed
    assert ev.evaluate() == [] and ev.active()[0].state == "pending"
    clock.t += 3
    drafting(hub, 1)
    assert ev.evaluate() == []
    clock.t += 3
    drafting(hub, 1)
    (fired,) = ev.evaluate()
    assert fired.state == "firing" and fired.rule == "SpecscopeWeakDraft"
    assert "0.0%" in fired.description and "alpha" in fired.description and "lower K" in fired.description
    assert dict(fired.labels)["model"] == "m"
    for _ in range(3):  # still weak: no repeated notification
        clock.t += 1
        drafting(hub, 1)
        assert ev.evaluate() == []
    clock.t += 11  # the weak window slides out; the draft is good now
    drafting(hub, 4)
    assert ev.evaluate() == []  # keep_firing_for holds it a little longer
    clock.t += 5
    drafting(hub, 4)
    (resolved,) = ev.evaluate()
    assert resolved.state == "resolved" and ev.active() == []
    assert [[a.state for a in b] for b in rec.batches] == [["firing"], ["resolved"]]


def test_idle_or_short_lived_weakness_raises_nothing() -> None:
    clock, hub, ev, rec = setup(weak_draft_for_s=5)
    hub.record_step(StepStats(num_spec_tokens=4, drafts=2, draft_tokens=8, accepted=0, accepted_per_pos=[0] * 4))
    assert ev.evaluate() == [] and ev.active() == []  # 8 draft tokens: below the minimum, nothing pending
    drafting(hub, 1)
    ev.evaluate()
    assert ev.active()[0].state == "pending"
    clock.t += 11
    drafting(hub, 4)
    ev.evaluate()
    assert ev.active() == [] and rec.batches == []  # pending never fired: nobody told


def test_rules_on_snapshot_fields() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_tokenizer(TokenizerStatus("mismatch", ("ids differ",)))
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeTokenizerMismatch"]], clock=clock)
    (a,) = ev.evaluate()
    assert a.state == "firing" and a.severity == "critical"  # for: 0 fires at once


def test_log_and_jsonl_notifiers(tmp_path: Path, caplog: Any) -> None:
    _clock, hub, ev, _ = setup(weak_draft_for_s=0)
    path = tmp_path / "alerts.jsonl"
    ev.notifiers = [LogNotifier(), JsonLinesNotifier(path)]
    drafting(hub, 1)
    with caplog.at_level(logging.INFO, logger="specscope.export.alerts"):
        ev.evaluate()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["rule"] == "SpecscopeWeakDraft" and rows[0]["state"] == "firing"
    assert rows[0]["labels"]["model"] == "m"
    assert "[WARNING] SpecscopeWeakDraft firing" in caplog.text


def test_a_failing_notifier_is_counted_not_raised() -> None:
    _clock, hub, ev, _ = setup(weak_draft_for_s=0)
    ev.notifiers = [AlertmanagerNotifier("http://127.0.0.1:9", timeout_s=0.5)]
    drafting(hub, 1)
    assert len(ev.evaluate()) == 1
    assert dict(hub.snapshot().health.errors)["notifier AlertmanagerNotifier"] == 1


def test_alert_loop_evaluates_in_the_background() -> None:
    hub = Hub(window_s=10)
    hub.set_tokenizer(TokenizerStatus("mismatch"))
    rec = Recorder()
    loop = AlertLoop(Evaluator(hub, rules=[BY_RULE["SpecscopeTokenizerMismatch"]], notifiers=[rec]), 0.05)
    try:
        deadline = time.monotonic() + 5
        while not rec.batches and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()
    assert rec.batches[0][0].rule == "SpecscopeTokenizerMismatch"


def test_threshold_files_and_bad_configuration(tmp_path: Path) -> None:
    good = tmp_path / "t.yaml"
    good.write_text("weak_draft_acceptance: 0.4\nfragmentation: 0.6\n")
    t = load_thresholds(good)
    assert (t.weak_draft_acceptance, t.fragmentation) == (0.4, 0.6)
    cases = {
        "bad.json": ('{"weak_draft_acceptance": 3}', "fraction between 0 and 1"),
        "typo.json": ('{"weak_draft_acceptence": 0.3}', "unknown threshold 'weak_draft_acceptence'"),
        "neg.json": ('{"fragmentation_for_s": -1}', "non-negative"),
        "broken.json": ("{oops", "not valid JSON"),
        "list.yaml": ("- 1\n- 2\n", "mapping"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(RuleConfigError) as info:
            load_thresholds(tmp_path / name)
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(RuleConfigError, match="cannot read"):
        load_thresholds(tmp_path / "missing.json")


@pytest.mark.server
@pytest.mark.skipif(shutil.which("prometheus-alertmanager") is None, reason="Debian's prometheus-alertmanager absent")
def test_webhook_reaches_a_real_alertmanager(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "am.yml").write_text("route: {receiver: 'null'}\nreceivers: [{name: 'null'}]\n")
    proc = subprocess.Popen(
        ["timeout", "120", "prometheus-alertmanager", f"--config.file={tmp_path / 'am.yml'}",
         f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address="],  # no gossip: a single instance, ready at once
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "alertmanager did not start"
            time.sleep(0.3)
        clock, hub, ev, _ = setup(weak_draft_for_s=0, keep_firing_for_s=0)
        ev.notifiers = [AlertmanagerNotifier(url)]
        drafting(hub, 1)
        ev.evaluate()
        alerts = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
        (a,) = alerts
        assert a["labels"]["alertname"] == "SpecscopeWeakDraft" and a["labels"]["model"] == "m"
        assert a["labels"]["severity"] == "warning" and a["status"]["state"] == "active"
        assert a["annotations"]["runbook_url"].endswith("#specscopeweakdraft")
        assert hub.snapshot().health.error_count == 0
        clock.t += 30  # the draft recovers; the alert is resolved in Alertmanager
        drafting(hub, 4)
        (resolved,) = ev.evaluate()
        assert resolved.state == "resolved"
        assert httpx.get(f"{url}/api/v2/alerts", params={"active": "true"}, timeout=5).json() == []
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize(("accepted_per_draft", "fires"), [
    (0, {"SpecscopeAcceptanceCollapse"}),  # nothing accepted while drafting: collapse, not also weak
    (1, {"SpecscopeWeakDraft"}),  # 25%: weak
    (3, set()),  # 75%: healthy
])
def test_collapse_and_weak_draft_each_fire_on_their_own_fault(accepted_per_draft: int, fires: set[str]) -> None:
    clock = Clock()
    hub = Hub(window_s=10, clock=clock)
    hub.set_engine(EngineInfo(model="m", draft_model="d", method="draft_model", num_speculative_tokens=4))
    rules = [BY_RULE["SpecscopeAcceptanceCollapse"], BY_RULE["SpecscopeWeakDraft"]]
    ev = Evaluator(hub, rules=rules, thresholds=Thresholds(window_s=10, weak_draft_for_s=0, collapse_for_s=0),
                   clock=clock)
    drafting(hub, accepted_per_draft)
    fired = ev.evaluate()
    assert {a.rule for a in fired} == fires
    for alert in fired:  # the evidence is in the words
        assert "tokens/step" in alert.description or "%" in alert.description


def test_the_in_process_rules_read_the_thresholds_window_as_the_promql_rules_do() -> None:
    """One thresholds file, one window: a weak draft 40 s ago is in a 60 s window and out of a 10 s one, whatever
    the hub's own window is."""
    clock = Clock()
    hub = Hub(window_s=60, clock=clock)
    hub.set_engine(EngineInfo(model="m", draft_model="d", method="draft_model", num_speculative_tokens=4))
    drafting(hub, accepted_per_draft=1)  # weak: 60 of 240
    clock.t += 40
    drafting(hub, accepted_per_draft=2, drafts=10)  # fine since: 20 of 40 (60 s: 80 of 280, weak)
    rule = [BY_RULE["SpecscopeWeakDraft"]]
    short = Evaluator(hub, rules=rule, thresholds=Thresholds(window_s=10, weak_draft_min_draft_tokens=10),
                      clock=clock)
    long = Evaluator(hub, rules=rule, thresholds=Thresholds(window_s=60, weak_draft_min_draft_tokens=10),
                     clock=clock)
    short.evaluate()
    long.evaluate()
    assert short.active() == []
    assert [a.rule for a in long.active()] == ["SpecscopeWeakDraft"]
    assert hub.snapshot().window_seconds == 60  # the hub's own window is left as it is


def test_a_failing_rule_is_counted_where_the_dashboard_shows_it() -> None:
    """``specscope top`` evaluates on fetched snapshots: a rule that raises is counted on the target and shown in
    its header, not lost in a throwaway hub."""
    from dataclasses import replace

    from specscope.read.fleet import Target
    from specscope.read.scrape import HubSource
    from specscope.read.tui import view

    _, hub, _, _ = setup()
    drafting(hub, 1)
    target = Target(HubSource(hub, "t"))

    def boom(snap: Any, t: Any) -> bool:
        raise ZeroDivisionError("rule bug")

    target._evaluator.rules = (replace(BY_RULE["SpecscopeWeakDraft"], firing=boom),)
    target.poll()
    target.evaluate()
    assert target.rule_errors == {"alert rule SpecscopeWeakDraft": 1}
    header = view.header([target], target, 60, "").plain
    assert "specscope errors 1" in header and "rule bug" in header


def test_an_evaluator_without_a_hub_needs_somewhere_to_count_errors() -> None:
    with pytest.raises(ValueError, match="error sink"):
        Evaluator()

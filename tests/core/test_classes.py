"""Traffic classes: names, counting by class (windowed, lifetime, folded), merging, the snapshot's JSON."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from specscope.core import classes, codec
from specscope.core.model import EngineInfo, RequestRecord
from specscope.state.hub import Hub, StepStats
from specscope.state.merge import merge
from specscope.state.request_log import MAX_FOLDED


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def record(hub: Hub, rid: str, cls: str | None, hist: tuple[int, ...], prompt_tokens: int = 10, **kw: Any) -> None:
    """A finished request whose steps accepted ``j`` tokens ``hist[j]`` times, K = len(hist) - 1."""
    k = len(hist) - 1
    hub.requests.record(rid, traffic_class=cls, prompt_tokens=prompt_tokens, spec_steps=sum(hist),
                       draft_tokens=k * sum(hist), accepted_tokens=sum(j * n for j, n in enumerate(hist)),
                       acceptance_histogram=hist, **kw)


def test_class_names_are_labels_of_safe_characters() -> None:
    assert classes.clean(" code/python ") == "code/python" and classes.clean("tenant:acme-1") == "tenant:acme-1"
    for bad in ("", "two words", "x" * 49, "-leading", "ünïcode", None, 7, "a\nb"):
        assert classes.clean(bad) is None, bad
    assert classes.from_baggage("userId=alice, traffic_class=code%2Fsql;ttl=3") == "code/sql"
    assert classes.from_baggage("traffic_class=") is None and classes.from_baggage("other=1") is None
    assert [classes.prompt_bucket(n) for n in (None, 0, 255, 256, 2047, 2048, 8191, 8192)] == [
        None, "prompt:<256", "prompt:<256", "prompt:256-2k", "prompt:256-2k", "prompt:2k-8k", "prompt:2k-8k",
        "prompt:>=8k"]
    assert RequestRecord("r", 1, 0.0, prompt_tokens=3000).class_name == "prompt:2k-8k"
    assert RequestRecord("r", 1, 0.0, prompt_tokens=3000, traffic_class="chat").class_name == "chat"


def test_the_operator_s_header_wins_over_baggage_and_no_header_claims_a_reserved_name() -> None:
    both = {"baggage": "traffic_class=a", "x-tenant": "b"}
    assert classes.from_headers(both, "X-Tenant") == "b"  # the gateway's header, whatever the client's baggage says
    assert classes.from_headers({**both, "x-tenant": "not a label"}, "X-Tenant") is None  # baggage does not stand in
    assert classes.from_headers({"baggage": "traffic_class=a"}, "X-Tenant") == "a"  # a request without the header
    assert classes.from_headers(both, None) == "a" and classes.from_headers({"x-tenant": "b"}, None) is None
    for reserved in ("other", "OTHER", "prompt:<256", "prompt:x", "model:llama", "Model:x"):
        assert classes.from_baggage(f"traffic_class={quote(reserved)}") is None, reserved
        assert classes.from_headers({"baggage": "traffic_class=a", "x-tenant": reserved}, "X-Tenant") is None
    assert [classes.claimed(n) for n in ("others", "model-x", "tenant:prompt:1")] == [
        "others", "model-x", "tenant:prompt:1"]


def test_class_rows_go_to_the_busiest_names_ranked_over_ten_windows() -> None:
    clock = Clock()
    hub = Hub(window_s=10, clock=clock, max_classes=3)  # traffic ranked over 100 s
    for i in range(3):
        record(hub, f"acme{i}", "acme", (1, 1))
    for i in range(20):  # a burst of invented names takes the free rows; the rest fold into other
        record(hub, f"junk{i}", f"n{i}", (1, 1))
    clock.t += 5
    for i in range(4):  # beta takes a row once it has over 3 times the traffic of the least busy name with one
        record(hub, f"beta{i}", "beta", (1, 1))
    snap = hub.snapshot()  # n0's row went, its counts with it; beta's counts start with its row
    assert {c.name: c.lifetime.requests for c in snap.classes} == {"acme": 3, "n1": 1, "beta": 1, "other": 21}
    # A name coming back after its row was given up starts afresh, its old window included.
    clock.t += 150
    record(hub, "n0-again", "n0", (1, 1))  # one request is never enough to take a row
    record(hub, "n0-twice", "n0", (1, 1))  # two are, over n1's single one 155 s ago
    by = {c.name: c for c in hub.snapshot(window_s=300).classes}
    assert "n1" not in by and by["n0"].lifetime.requests == by["n0"].window.requests == 1
    # The span follows the hub's window: 30 s are 3 spans of a 1 s window, and the rows' traffic has faded.
    hub.set_window(1)
    clock.t += 30
    record(hub, "zeta0", "zeta", (1, 1))
    record(hub, "zeta1", "zeta", (1, 1))
    assert {c.name for c in hub.snapshot().classes} == {"zeta", "beta", "n0", "other"}


def test_a_late_part_of_a_request_whose_class_row_was_given_up_takes_nothing_from_another() -> None:
    clock = Clock()
    hub = Hub(window_s=1, clock=clock, max_classes=1)
    record(hub, "r", "a", (1, 1))
    clock.t += 100
    record(hub, "b0", "b", (1, 0))  # counted as other
    record(hub, "s", "b", (0, 1))  # a's row (and r's counts) go to b
    hub.requests.record("r", traffic_class="a")  # r's late part: a has no row now, so r is counted as other
    by = {c.name: c.lifetime for c in hub.snapshot().classes}
    assert {name: (c.requests, c.accepted) for name, c in by.items()} == {"b": (1, 1), "other": (2, 1)}


def test_counts_by_class_window_and_lifetime_sum_to_the_requests() -> None:
    clock = Clock()
    hub = Hub(window_s=10, clock=clock)
    record(hub, "old", "code", (4, 0, 0, 0, 0))
    clock.t += 30  # out of the window
    record(hub, "a", "code", (1, 0, 0, 1, 0))  # one step kept nothing, one kept 3
    record(hub, "b", "chat", (0, 0, 0, 0, 2))
    record(hub, "c", None, (0, 1, 0, 0, 0), prompt_tokens=300)
    snap = hub.snapshot()
    by = {c.name: c for c in snap.classes}
    assert set(by) == {"code", "chat", "prompt:256-2k"} and snap.classes[0].name == "code"  # most requests first
    code = by["code"]
    assert (code.lifetime.requests, code.lifetime.draft_tokens, code.lifetime.accepted) == (2, 24, 3)
    assert (code.window.requests, code.window.spec_steps, code.window.draft_tokens, code.window.accepted) == (
        1, 2, 8, 3)
    assert code.window.accepted_by_position == (1, 1, 1, 0) and code.window.per_position == (0.5, 0.5, 0.5, 0.0)
    assert code.window.acceptance_rate == pytest.approx(3 / 8) and code.window.mean_acceptance_length == 2.5
    assert code.window.alpha == pytest.approx(3 / (3 + 2))  # 3 accepted; both steps ended at a rejection
    assert by["chat"].window.acceptance_rate == 1.0 and by["chat"].kind == "class"
    assert by["prompt:256-2k"].kind == "prompt length"
    # The classes add up to what the requests drafted and accepted (the attribution of every final record).
    assert sum(c.lifetime.draft_tokens for c in snap.classes) == snap.attributed.draft_tokens  # type: ignore[union-attr]
    assert sum(c.lifetime.accepted for c in snap.classes) == snap.attributed.accepted  # type: ignore[union-attr]


def test_classes_past_the_limit_are_folded_into_other_and_counted() -> None:
    hub = Hub(max_classes=2)
    for i, name in enumerate(["a", "b", "c", "d", "a", "c"]):
        record(hub, f"r{i}", name, (1, 1))
    record(hub, "long", None, (0, 1), prompt_tokens=9000)  # prompt-length buckets are always kept
    snap = hub.snapshot()
    assert {c.name: c.lifetime.requests for c in snap.classes} == {"a": 2, "b": 1, "other": 3, "prompt:>=8k": 1}
    assert snap.folded_classes == 2  # c and d
    # A prompt-length bucket takes one of the names when it comes first: then only one class of its own is kept.
    hub = Hub(max_classes=2)
    record(hub, "short", None, (1, 1))
    for i, name in enumerate(["a", "b", "c", "b"]):
        record(hub, f"r{i}", name, (1, 1))
    record(hub, "long", None, (0, 1), prompt_tokens=9000)
    snap = hub.snapshot()
    assert {c.name: c.lifetime.requests for c in snap.classes} == {
        "prompt:<256": 1, "a": 1, "other": 3, "prompt:>=8k": 1}
    assert snap.folded_classes == 2  # b and c
    assert sum(c.lifetime.requests for c in snap.classes) == snap.attributed.requests == 6  # type: ignore[union-attr]
    # A client sending a new name with every request grows neither the classes nor what remembers the folded names.
    hub = Hub(max_classes=1, max_requests=10)
    for i in range(MAX_FOLDED + 50):
        hub.requests.record(f"r{i}", traffic_class=f"n{i}")
    snap = hub.snapshot()
    assert [c.name for c in snap.classes] == ["other", "n0"] and snap.folded_classes == MAX_FOLDED
    assert snap.classes[0].lifetime.requests == MAX_FOLDED + 49


def test_a_late_part_moves_a_request_to_the_class_it_brings_and_counts_it_once() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.requests.expect_parts(2)
    hub.requests.record("r", prompt_tokens=10, spec_steps=2, draft_tokens=8, accepted_tokens=4,
                       acceptance_histogram=(1, 0, 0, 0, 1))
    clock.t += hub.requests.PENDING_TIMEOUT_S + 1
    hub.requests.record("other", prompt_tokens=5)  # releases "r" as it is: counted in its prompt-length bucket
    hub.requests.record("r", traffic_class="code")  # its late part says which class it was
    by = {c.name: c.lifetime for c in hub.snapshot().classes}
    assert by["code"].requests == 1 and by["code"].accepted == 4 and by["code"].accepted_by_position == (1, 1, 1, 1)
    assert "prompt:<256" not in by or by["prompt:<256"].accepted == 0


def test_classes_merge_by_name_and_survive_the_json_codec() -> None:
    one, two = Hub(), Hub()
    record(one, "a", "code", (1, 1))
    record(two, "b", "code", (0, 0, 1))
    record(two, "c", "chat", (0, 1))
    merged = merge([one.snapshot(), two.snapshot()])
    by = {c.name: c for c in merged.classes}
    assert by["code"].lifetime.requests == 2 and by["code"].lifetime.accepted_by_position == (2, 1)
    assert by["code"].window.draft_tokens == 2 + 2 * 1
    back = codec.from_dict(json.loads(json.dumps(codec.to_dict(merged))))
    assert back.classes == merged.classes and back.folded_classes == merged.folded_classes
    assert codec.to_dict(merged)["classes"][0]["window"]["acceptance_rate"] is not None


def test_merged_classes_are_capped_as_one_process_caps_them() -> None:
    """Each process keeps its own max_classes rows; the merge caps the sum again: the prompt-length buckets stay and
    count toward the limit, the names with the most requests keep their rows, the rest go to other (and are
    counted as folded). Nothing is lost: the rows add up to every request."""
    one, two = Hub(max_classes=3), Hub(max_classes=3)
    for i, name in enumerate(["a", "a", "a", "b"]):
        record(one, f"one{i}", name, (1, 1))
    record(one, "short", None, (1, 1))
    for i, name in enumerate(["c", "c", "d", "x", "y"]):  # x, y: past this process's limit, folded into other
        record(two, f"two{i}", name, (1, 1))
    assert len(one.snapshot().classes) == 3 and len(two.snapshot().classes) == 4
    merged = merge([one.snapshot(), two.snapshot()], max_classes=3)
    assert {c.name: c.lifetime.requests for c in merged.classes} == {"a": 3, "c": 2, "prompt:<256": 1, "other": 4}
    assert {c.name: c.window.requests for c in merged.classes}["other"] == 4
    assert merged.folded_classes == 2 + 2  # x and y in their process; b and d in the merge
    assert sum(c.lifetime.requests for c in merged.classes) == 10


def test_the_class_rule_fires_for_the_weak_class_only_and_says_what_the_aggregate_hides() -> None:
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import Thresholds

    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    for i in range(10):
        record(hub, f"chat{i}", "chat", (2, 0, 0, 0, 8))  # 32 of 40 accepted
    for i in range(4):
        record(hub, f"code{i}", "code", (12, 2, 0, 0, 0))  # 2 of 56 accepted
    record(hub, "rare", "rare", (3, 0, 0, 0, 0))  # accepts nothing, but 12 drafts are too few to judge
    # The engine's own counters: the same steps, 328 of 636 accepted, well above the weak-draft line.
    hub.record_step(StepStats(num_spec_tokens=4, drafts=159, draft_tokens=636, accepted=328,
                              accepted_per_pos=(88, 80, 80, 80), running=1, waiting=0))
    snap = hub.snapshot()
    assert snap.window.spec is not None and snap.window.spec.acceptance_rate == pytest.approx(328 / 636)
    assert sum(c.window.draft_tokens for c in snap.classes) == snap.window.spec.draft_tokens
    assert sum(c.window.accepted for c in snap.classes) == snap.window.spec.accepted
    alerts = Evaluator(hub, thresholds=Thresholds(weak_draft_for_s=0, weak_draft_min_draft_tokens=50)).evaluate()
    firing = [a for a in alerts if a.state == "firing"]
    assert [(a.rule, dict(a.labels)["traffic_class"]) for a in firing] == [("SpecscopeWeakDraftForClass", "code")]
    (code,) = firing
    assert code.value == pytest.approx(2 / 56)
    assert "class code (26.7% of the window's requests) accepted 3.6% " in code.description  # 4 of 15 requests
    assert "against 77.7% for the other classes" in code.description and "a code draft" in code.description
    # No classes (or no drafts) in a snapshot: nothing to evaluate, nothing fires.
    assert Evaluator(Hub(), thresholds=Thresholds(weak_draft_for_s=0)).evaluate() == []
    # Every class weak: the aggregate hides nothing (SpecscopeWeakDraft says it), no class alert repeats it.
    weak = Hub()
    weak.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    for i in range(10):
        record(weak, f"a{i}", "chat", (12, 2, 0, 0, 0))
        record(weak, f"b{i}", "code", (14, 0, 0, 0, 0))
    weak.record_step(StepStats(num_spec_tokens=4, drafts=280, draft_tokens=1120, accepted=20,
                               accepted_per_pos=(20, 0, 0, 0), running=1, waiting=0))
    fired = {a.rule for a in Evaluator(weak, thresholds=Thresholds(weak_draft_for_s=0, weak_draft_min_draft_tokens=50))
             .evaluate() if a.state == "firing"}
    assert "SpecscopeWeakDraft" in fired and "SpecscopeWeakDraftForClass" not in fired


def test_a_weak_class_alerts_when_the_steps_are_not_weak_though_the_classes_records_sum_under_the_line() -> None:
    """The server's steps decide whether the aggregate hides a class, as they decide SpecscopeWeakDraft: the
    classes' request records differ from the steps at the window's edges, and where the steps accepted 0.302 and
    the records summed under 0.3, neither alert fired for a class accepting 0.105 (benchmarks/results/
    gate_against_long.json, ``served_before``)."""
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import Thresholds

    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    for i in range(4):
        record(hub, f"easy{i}", "easy", (5, 0, 0, 0, 3))  # 12 of 32 accepted: 0.375
        record(hub, f"hard{i}", "hard", (14, 0, 0, 0, 0))  # none of 56
    # The records sum to 48 of 352 (0.136); the steps, with requests still running, accepted 110 of 352.
    hub.record_step(StepStats(num_spec_tokens=4, drafts=88, draft_tokens=352, accepted=110,
                              accepted_per_pos=(40, 30, 20, 20), running=4, waiting=0))
    alerts = Evaluator(hub, thresholds=Thresholds(weak_draft_for_s=0, weak_draft_min_draft_tokens=50)).evaluate()
    firing = [(a.rule, dict(a.labels).get("traffic_class")) for a in alerts if a.state == "firing"
              and a.rule.startswith("SpecscopeWeakDraft")]
    assert firing == [("SpecscopeWeakDraftForClass", "hard")]


def test_a_class_s_expected_speedup_uses_its_own_tokens_per_step() -> None:
    from specscope.core.model import CostRatio
    from specscope.verdict import class_speedup, estimate

    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(0.1, "given"))
    hub.record_step(StepStats(num_spec_tokens=4, drafts=10, draft_tokens=40, accepted=20,
                              accepted_per_pos=(8, 6, 4, 2), running=1, waiting=0))
    record(hub, "good", "chat", (0, 0, 0, 0, 5))  # 5 tokens a step
    record(hub, "bad", "code", (5, 0, 0, 0, 0))  # 1 token a step
    snap = hub.snapshot()
    est = estimate(snap)
    assert est is not None
    by = {c.name: class_speedup(snap, c) for c in snap.classes}
    assert by["chat"] == pytest.approx(5 / 1.4) and by["code"] == pytest.approx(1 / 1.4)  # no prefill timed
    assert by["code"] < est.expected_speedup < by["chat"]  # type: ignore[operator]
    assert class_speedup(Hub().snapshot(), snap.classes[0]) is None  # no estimate: absent, not 0


def test_class_windows_are_summed_by_second_and_old_seconds_dropped() -> None:
    clock = Clock()
    hub = Hub(window_s=10, history_s=20, max_requests=5, clock=clock)
    for i in range(200):  # more records than are kept, over more seconds than the history
        clock.t += 1
        record(hub, f"r{i}", "code", (1, 1))
    code = hub.snapshot().classes[0]
    assert code.lifetime.requests == 200 and code.window.requests == 11  # now - 10 s to now, not the 5 kept
    assert len(hub.requests._log._class_seconds) <= 21 + 64  # bounded by the history, not by the run
    hub.reset_window()  # the class window restarts with the engine's; the lifetime stays
    code = hub.snapshot().classes[0]
    assert code.window.requests == 0 and code.window.acceptance_rate is None and code.lifetime.requests == 200

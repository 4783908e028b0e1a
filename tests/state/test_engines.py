"""Data-parallel engines kept apart in the hub, and one server's API-server processes merged back together."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from specscope.core.model import EngineInfo
from specscope.export.alerts.evaluate import Evaluator
from specscope.export.alerts.rules import BY_RULE, Thresholds
from specscope.export.catalogue import BY_NAME
from specscope.state.hub import Hub, StepStats
from specscope.state.merge import merge


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def step(running: int, kv: float, accepted: int, dt: float = 0.02, **kw: Any) -> StepStats:
    per_pos = [running if j < accepted else 0 for j in range(4)]
    return StepStats(running=running, waiting=0, kv_usage=kv, generation_tokens=running * (accepted + 1),
                     batch=running, decode_s=dt, num_spec_tokens=4, drafts=running, draft_tokens=4 * running,
                     accepted=accepted * running, accepted_per_pos=per_pos, draft_tokens_per_pos=[running] * 4,
                     rejections=running if accepted < 4 else 0, **kw)


def dp_hub(clock: Clock) -> Hub:
    """Two engines, interleaved as vLLM's stat logger hears them: engine 0 good and busy, engine 1 weak and light."""
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(model="m", method="draft_model", num_speculative_tokens=4, block_size=16,
                              num_blocks=101))
    for _ in range(50):
        clock.t += 0.01
        hub.record_step(step(4, 0.5, 3, dt=0.03), engine_index=0)
        clock.t += 0.01
        hub.record_step(step(1, 0.1, 0, dt=0.015, prompt_tokens=0), engine_index=1)
    return hub


def test_engines_are_kept_apart_and_summed_right() -> None:
    clock = Clock()
    snap = dp_hub(clock).snapshot()
    zero, one = snap.engines
    assert (zero.index, one.index) == (0, 1)
    assert zero.lifetime.spec.accepted == 50 * 12 and one.lifetime.spec.accepted == 0  # type: ignore[union-attr]
    assert zero.lifetime.spec.acceptance_rate == 0.75 and one.lifetime.spec.acceptance_rate == 0.0  # type: ignore[union-attr]
    # Fleet: counters add up; gauges are the engines' sums, not the last one to report; KV usage block-weighted.
    assert snap.lifetime.spec.draft_tokens == 50 * (16 + 4)  # type: ignore[union-attr]
    assert snap.running == 5 and snap.kv.block_usage == pytest.approx(0.3)
    assert snap.kv.capacity_tokens == 2 * 100 * 16
    # Step timing per engine: each engine's own step time at its own batch size, never the gap between two engines.
    assert zero.lifetime.step_times.get(4).mean_s == pytest.approx(0.03)  # type: ignore[union-attr]
    assert one.lifetime.step_times.get(1).mean_s == pytest.approx(0.015)  # type: ignore[union-attr]
    assert (zero.decode_batch, one.decode_batch) == (4, 1)
    alone = snap.for_engine(1)
    assert alone.lifetime == one.lifetime and alone.running == 1 and alone.kv.block_usage == 0.1


def test_one_idle_engine_does_not_zero_the_others_kv_estimate() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(block_size=16, num_blocks=11))
    hub.record_step(StepStats(running=2, waiting=0, kv_usage=0.5, prompt_tokens=40, generation_tokens=2),
                    engine_index=0)
    hub.record_step(StepStats(running=0, waiting=0, kv_usage=0.0), engine_index=1)  # engine 1 idles
    zero, one = hub.snapshot().engines
    assert zero.kv.tokens_held == 42 and one.kv.tokens_held == 0


def test_exports_carry_vllms_engine_label_and_the_server_apart() -> None:
    snap = dp_hub(Clock()).snapshot()
    rate = dict((attrs["engine"], v) for attrs, v in BY_NAME["specscope.spec_decode.acceptance_rate"].read(snap))
    assert rate == {"0": 0.75, "1": 0.0}
    attrs, _ = next(iter(BY_NAME["specscope.spec_decode.draft_tokens"].read(snap)))
    assert attrs["server"] == "vllm" and attrs["engine"] in ("0", "1")
    assert all("engine" not in a for a, _ in BY_NAME["specscope.gpu.draft_weight_share"].read(snap))


def test_rules_on_an_engine_fire_for_that_engine_only() -> None:
    hub = dp_hub(Clock())
    rules = [BY_RULE["SpecscopeWeakDraft"], BY_RULE["SpecscopeAcceptanceCollapse"]]
    ev = Evaluator(hub, rules=rules, thresholds=Thresholds(weak_draft_for_s=0, collapse_for_s=0,
                                                           weak_draft_min_draft_tokens=10))
    (alert,) = ev.evaluate()
    assert alert.state == "firing" and dict(alert.labels)["engine"] == "1"  # engine 0 is healthy
    assert alert.rule == "SpecscopeAcceptanceCollapse"  # engine 1 accepts nothing: a collapse, not also weak


def test_merge_adds_counts_and_takes_each_engines_freshest_gauges() -> None:
    clock = Clock()
    a, b = Hub(clock=clock), Hub(clock=clock)
    for hub in (a, b):
        hub.set_engine(EngineInfo(model="m", method="draft_model", num_speculative_tokens=4, block_size=16,
                                  num_blocks=101))
    a.record_step(step(3, 0.4, 2), engine_index=0)  # this process heard from engine 0 first ...
    a.requests.record("r-a", e2e_s=1.0, draft_tokens=8, accepted_tokens=4, spec_steps=2)
    clock.t += 5
    b.record_step(step(1, 0.2, 4), engine_index=0)  # ... the other one later
    b.requests.record("r-b", e2e_s=2.0, draft_tokens=4, accepted_tokens=4, spec_steps=1)
    merged = merge([a.local_snapshot(), b.local_snapshot()])
    assert merged.lifetime.spec.accepted == 3 * 2 + 1 * 4  # type: ignore[union-attr]
    (engine,) = merged.engines
    assert engine.running == 1 and engine.kv.block_usage == 0.2  # the freshest report
    assert engine.lifetime.spec.draft_tokens == 16  # type: ignore[union-attr]
    assert [r.request_id for r in merged.requests] == ["r-a", "r-b"]
    assert merged.attributed is not None and merged.attributed.draft_tokens == 12
    assert merged.request_duration is not None and merged.request_duration.count == 2


def test_forwards_read_by_one_process_join_the_steps_another_got() -> None:
    """vLLM hands a step's stats to one API-server process, and one process reads the engine's forward times: the
    merged snapshot has both at each batch size, from whichever process; a batch size nobody stepped at is none."""
    clock = Clock()
    reader, stepper = Hub(clock=clock), Hub(clock=clock)
    for hub in (reader, stepper):
        hub.set_engine(EngineInfo(model="m", method="draft_model", num_speculative_tokens=4, block_size=16,
                                  num_blocks=101))
    for _ in range(3):
        clock.t += 0.02
        stepper.record_step(step(4, 0.4, 2), engine_index=1)
    reader.record_step(step(2, 0.2, 1), engine_index=0)
    reader.record_forwards(1, [(4, 20, 3, 0.03), (6, 30, 1, 0.02)], 5)  # batch 6: steps nobody got (yet)
    reader.record_forwards(0, [(2, 10, 1, 0.005)], 5)
    alone = reader.local_snapshot()
    assert [e.lifetime.step_times.times for e in alone.engines if e.index == 1] == [()]  # its own view: no steps
    merged = merge([reader.local_snapshot(forwards_alone=True), stepper.local_snapshot(forwards_alone=True)])
    rows = {e.index: [(t.batch_size, t.steps, t.forwards) for t in e.lifetime.step_times.times]
            for e in merged.engines}
    assert rows == {0: [(2, 1, 1)], 1: [(4, 3, 3)]}
    assert [(t.batch_size, t.steps, t.forwards) for t in merged.lifetime.step_times.times] == [(2, 1, 1), (4, 3, 3)]
    (row,) = [t for t in merged.engines[1].lifetime.step_times.times]
    assert row.forward_s == pytest.approx(0.01) and row.forward_tokens == 20


def test_a_gone_process_keeps_its_lifetime_counts_but_its_window_ages_out() -> None:
    """A process that is gone (the share judges it: its pid gone, or silent past STALE_S of the reader's monotonic
    clock; tests/engine/test_share.py) comes in aged: its steps and requests stay in the lifetime counts, none of them
    in
    the window (overall, per engine, per class), and its gauges lose to any live one's. The merge itself never
    judges by the snapshots' wall-clock times."""
    from specscope.state.merge import aged

    clock = Clock()
    live, dead = Hub(clock=clock), Hub(clock=clock)
    dead.record_step(step(3, 0.9, 2), engine_index=0)
    dead.requests.record("r-dead", draft_tokens=8, accepted_tokens=4, spec_steps=2, traffic_class="code")
    gone = dead.local_snapshot()
    clock.t += 1
    live.record_step(step(1, 0.2, 4), engine_index=0)
    fresh = merge([live.local_snapshot(), gone])
    assert fresh.window.spec.accepted == 3 * 2 + 4  # type: ignore[union-attr]  # a live peer: all of it
    clock.t += 30  # its snapshot 31 s old by the wall clock: the merge does not judge it by that
    assert merge([live.local_snapshot(), gone]).window.steps == 2
    live.record_step(step(1, 0.2, 4), engine_index=0)
    merged = merge([live.local_snapshot(), aged(gone)])
    assert merged.time == live.local_snapshot().time  # the merging process's moment, not a peer's
    assert merged.lifetime.spec.accepted == 3 * 2 + 4 * 2  # type: ignore[union-attr]
    assert merged.window.spec.accepted == 4 * 2 and merged.window.steps == 2  # type: ignore[union-attr]
    (engine,) = merged.engines
    assert engine.window.steps == 2 and engine.running == 1
    (code,) = merged.classes
    assert code.lifetime.requests == 1 and code.window.requests == 0


def test_a_histogram_with_other_buckets_is_left_out_and_counted_in_health() -> None:
    """Two processes of different specscope versions: their histograms cannot be added; the merge keeps the first
    and counts each one left out, by name, in health, rather than dropping it unseen."""
    from dataclasses import replace

    from specscope.core.model import Histogram
    from specscope.state.merge import DROPPED_HISTOGRAM

    a, b = Hub(), Hub()
    for hub, rid in ((a, "r-a"), (b, "r-b")):
        hub.requests.record(rid, e2e_s=1.0, ttft_s=0.1)
    theirs = b.local_snapshot()
    other = replace(theirs, request_duration=Histogram((1.0, 10.0), (0, 1, 0), 1.0))
    assert merge([a.local_snapshot(), theirs]).health.errors == ()
    merged = merge([a.local_snapshot(), other])
    assert merged.request_duration == a.local_snapshot().request_duration  # the first, not a wrong sum
    assert merged.time_to_first_token is not None and merged.time_to_first_token.count == 2  # the rest add up
    assert dict(merged.health.errors) == {DROPPED_HISTOGRAM: 1}
    assert merged.health.last_error is not None and "request_duration" in merged.health.last_error


def test_api_server_processes_share_one_view_and_one_exporter(tmp_path: Path) -> None:
    from specscope.engine.share import ProcessShare

    a, b = Hub(), Hub()
    a.record_step(step(2, 0.3, 1), engine_index=0)
    b.record_step(step(2, 0.3, 3), engine_index=0)
    share_a, share_b = ProcessShare(a, 0, tmp_path, 0.05), ProcessShare(b, 1, tmp_path, 0.05)
    a.attach_share(share_a)
    b.attach_share(share_b)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (share_a.others() and share_b.others()):
            time.sleep(0.05)
        for hub in (a, b):  # whichever process a load balancer reaches: the whole server
            snap = hub.snapshot()
            assert snap.processes == 2 and snap.lifetime.spec.accepted == 2 + 6  # type: ignore[union-attr]
        assert a.local_snapshot().lifetime.spec.accepted == 2  # type: ignore[union-attr]
        assert share_a.lead("prometheus") and not share_b.lead("prometheus")  # one process serves the port
        assert share_b.lead("otlp") and not share_a.lead("otlp")
    finally:
        share_a.close()
        share_b.close()
    assert ProcessShare(Hub(), 2, tmp_path, 60).lead("prometheus")  # released with its holder


@pytest.mark.parametrize(("accepted", "diverges"), [((3, 3, 3), False), ((3, 3, 1), True), ((1, 1, 1), False)],
                         ids=["healthy", "one-low", "all-weak-alike"])
def test_an_engine_diverging_from_its_peers_fires_once_naming_it(accepted: tuple[int, ...], diverges: bool) -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(model="m", method="draft_model", num_speculative_tokens=4))
    for _ in range(60):
        for engine, a in enumerate(accepted):
            clock.t += 0.01
            hub.record_step(step(2, 0.3, a), engine_index=engine)
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeEngineDiverging"]],
                   thresholds=Thresholds(divergence_for_s=0, weak_draft_min_draft_tokens=100))
    fired = ev.evaluate()
    assert len(fired) == int(diverges)
    if diverges:  # engine 2 accepts 25%, the three engines 58% on average
        assert "Engine 2 accepts 25.0%" in fired[0].description and "58.3% on average" in fired[0].description
        assert fired[0].value == pytest.approx((0.75 * 2 + 0.25) / 3 - 0.25)

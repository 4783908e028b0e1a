"""Speedup diagnostics: step timing, the estimate against its closed forms, baselines, the K table."""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specscope.core import acceptance as acc
from specscope.core import codec
from specscope.core.model import CostRatio, EngineInfo, EngineSetup, RequestRecord, StepProfile, StepTime
from specscope.export.alerts.evaluate import Evaluator
from specscope.export.alerts.rules import BY_RULE, Thresholds
from specscope.state.hub import Hub, StepStats
from specscope.verdict import (
    ASSUMED_VERIFY_COST,
    SpeedupEstimate,
    by_batch_line,
    by_batch_size,
    estimate,
    explain,
    k_schedule,
    k_table,
    load_profile,
    measured_cost,
    recommended_config,
    save_profile,
    schedule_config,
    schedule_text,
    traffic_speedup,
    verify_cost,
)
from specscope.verdict.traffic import TrafficSpeedup
from specscope.verdict.uncertainty import DRAFT_FIXED

SETUP = EngineSetup(model="/m/target", architecture="LlamaForCausalLM layers=12", dtype="float32", device="cpu",
                    engine_version="0.32.0", max_num_seqs=16)


def draft_step(accepted: list[int], k: int = 4, **kw: Any) -> StepStats:
    """One step in which each request drafted K tokens and accepted ``accepted[i]`` of them."""
    per_pos = [sum(1 for a in accepted if a > i) for i in range(k)]
    return StepStats(num_spec_tokens=k, drafts=len(accepted), draft_tokens=k * len(accepted), accepted=sum(accepted),
                     accepted_per_pos=per_pos, draft_tokens_per_pos=[len(accepted)] * k,
                     rejections=acc.rejections(len(accepted), per_pos, [len(accepted)] * k), **kw)


def hub_with(accepted: list[int], c: float, k: int = 4, method: str = "draft_model") -> Hub:
    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=k, method=method))
    hub.set_cost_ratio(CostRatio(c, "given"))
    hub.record_step(draft_step(accepted, k))
    return hub


def test_estimate_without_step_times_models_tokens_from_the_observed_positions() -> None:
    hub = hub_with([4] * 80 + [1] * 20 + [0] * 20, c=0.05)  # a good, cheap draft
    snap = hub.snapshot()
    est = estimate(snap)
    assert est is not None and not est.tokens_observed
    spec = snap.window.spec
    assert est.tokens_per_step == pytest.approx(spec.mean_acceptance_length)  # every request drafted every step
    assert est.expected_speedup == pytest.approx(spec.mean_acceptance_length / 1.2)
    # K = 6 pays 6 draft tokens, less twice the share of one that the running K = 4's step paid whatever its K
    six = acc.tokens_per_step(6, spec.per_position, spec.alpha) / (1 + 6 * 0.05 + DRAFT_FIXED * 0.05 * (4 - 6))
    assert est.by_k[6] == pytest.approx(six) and est.by_k[0] == 1.0
    assert est.pays and est.best_k == max(range(17), key=lambda j: est.by_k[j])
    assert "pays" in explain(est) and "modelled" in explain(est)
    assert estimate(Hub().snapshot()) is None  # no speculation, no estimate


def test_a_draft_that_cannot_pay_is_told_to_turn_speculation_off() -> None:
    weak = estimate(hub_with([0] * 90 + [1] * 30, c=0.5).snapshot())
    assert weak is not None and not weak.pays
    assert weak.best_k == 0 and weak.best_speedup == 1.0
    # Off means speculative_config removed: a K=0 range in vLLM's schedule still runs a draft pass a step.
    assert weak.k0_speedup == pytest.approx(1 / 1.5) and weak.scheduled_k == 1 and weak.scheduled_speedup < 1
    assert "turn speculation off (remove speculative_config, a restart)" in explain(weak)
    assert "K=0 in vLLM's schedule would run at 0.67x" in explain(weak)


def test_k0_costs_nothing_modelled_for_model_free_methods() -> None:
    est = estimate(hub_with([0] * 90 + [1] * 30, c=0.5, method="ngram").snapshot(), cost=CostRatio(0.5, "given"))
    assert est is not None and est.k0_speedup == 1.0 and "n-gram" in est.k0_basis


def test_not_paying_rule() -> None:
    rule = BY_RULE["SpecscopeSpeculationNotPaying"]
    t = Thresholds(weak_draft_for_s=0)
    bad = hub_with([0] * 90 + [1] * 30, c=0.5)
    (alert,) = Evaluator(bad, rules=[rule], thresholds=t).evaluate()
    assert alert.state == "firing" and "does NOT pay" in alert.description
    assert Evaluator(hub_with([4] * 120, c=0.05), rules=[rule], thresholds=t).evaluate() == []


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def steps(hub: Hub, clock: Clock, batch: int, dt: float, n: int, accepted: int | None = None,
          k: int = 4, prefill_s: float | None = None) -> None:
    """A prefill step of ``batch`` new requests (``prefill_s`` long, known from their time to first token), then
    ``n`` pure decode steps ``dt`` long (speculative, each request accepting ``accepted``), finishing the batch;
    then the engine idles for a minute."""
    if prefill_s is not None:
        clock.t += prefill_s
        hub.record_step(StepStats(running=batch, waiting=0, prompt_tokens=20 * batch, generation_tokens=batch,
                                  batch=batch, prefill=True, first_tokens=batch, first_token_s=prefill_s))
    for i in range(n):
        clock.t += dt
        last = i == n - 1
        spec = {} if accepted is None else {"num_spec_tokens": k, "drafts": batch, "draft_tokens": k * batch,
                                            "accepted": accepted * batch,
                                            "accepted_per_pos": [batch if j < accepted else 0 for j in range(k)],
                                            "draft_tokens_per_pos": [batch] * k,
                                            "rejections": batch if accepted < k else 0}
        hub.record_step(StepStats(running=0 if last else batch, waiting=0,
                                  generation_tokens=batch * (1 + (accepted or 0)), finished=batch if last else 0,
                                  batch=batch, decode_s=dt, **spec))
    clock.t += 60


def test_hub_times_decode_steps_and_prefill_by_batch_size() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    steps(hub, clock, 2, 0.010, 5, prefill_s=0.03)
    steps(hub, clock, 1, 0.005, 4)
    snap = hub.snapshot()
    by = {t.batch_size: t for t in snap.lifetime.step_times.times}
    assert by[2].steps == 5 and by[2].mean_s == pytest.approx(0.010) and by[2].tokens == 10
    assert by[2].prefill_steps == 1 and by[2].prefill_s == pytest.approx(0.03)
    assert by[1].steps == 4 and by[1].mean_s == pytest.approx(0.005) and by[1].tokens_per_request_step == 1.0
    assert snap.decode_batch == 1
    assert snap.lifetime.prefills == 2
    d = codec.to_dict(snap)["lifetime"]["step_times"]["times"][0]
    assert d["batch_size"] == 1 and d["steps"] == 4 and d["mean_s"] == pytest.approx(0.005)


def test_the_verdict_is_given_at_the_batch_the_engine_spends_its_decode_time_at() -> None:
    """A batch of 8 that drains to 1 (its last request decoding alone, as speculation's requests finish apart) is
    judged at 8, the window's busiest batch, not at the tail's 1; an idle window falls back to the last batch."""
    clock = Clock()
    hub = Hub(clock=clock, window_s=30.0)
    for batch, n in ((8, 20), (2, 3), (1, 2)):
        for _ in range(n):
            clock.t += 0.1
            hub.record_step(StepStats(running=batch, waiting=0, generation_tokens=batch, batch=batch, decode_s=0.1))
    snap = hub.snapshot()
    assert snap.decode_batch == 8 and snap.engines[0].decode_batch == 8
    assert snap.window.step_times.busiest() == 8
    clock.t += 60
    assert hub.snapshot().decode_batch == 1  # nothing in the window: the last decode step's batch


def test_a_prefill_step_inside_a_busy_stretch_is_timed_by_the_gap_since_the_last_report() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.record_step(StepStats(running=2, waiting=0, generation_tokens=2, batch=2, decode_s=0.01))
    clock.t += 0.25
    # A long prompt's chunk: the step ran 3 requests, one of which produced nothing (no first token yet).
    hub.record_step(StepStats(running=3, waiting=0, generation_tokens=2, batch=3, prefill=True))
    clock.t += 60  # idle, then a chunk whose duration nothing bounds: not timed
    hub.record_step(StepStats(running=0, waiting=0, batch=0))
    clock.t += 1
    hub.record_step(StepStats(running=1, waiting=0, batch=1, prefill=True))
    by = {t.batch_size: t for t in hub.snapshot().lifetime.step_times.times}
    assert by[3].prefill_steps == 1 and by[3].prefill_s == pytest.approx(0.25)
    assert 1 not in by


def test_step_times_are_windowed_like_alpha() -> None:
    clock = Clock()
    hub = Hub(window_s=30, clock=clock)
    steps(hub, clock, 4, 0.020, 10, accepted=4)  # then an idle minute: out of the window
    snap = hub.snapshot()
    assert snap.window.step_times.times == () and snap.lifetime.step_times.get(4) is not None
    steps(hub, clock, 4, 0.030, 10, accepted=4)
    clock.t -= 59  # back inside the window of the second stretch
    snap = hub.snapshot()
    assert snap.window.step_times.get(4).mean_s == pytest.approx(0.030)  # type: ignore[union-attr]
    assert snap.lifetime.step_times.get(4).mean_s == pytest.approx(0.025)  # type: ignore[union-attr]


def with_baseline(hub: Hub, tmp_path: Path, setup: EngineSetup = SETUP) -> StepProfile:
    base = StepProfile((StepTime(1, 50, 0.0036), StepTime(4, 50, 0.0040), StepTime(16, 50, 0.0060)),
                       "measured on /m/target", setup)
    save_profile(base, tmp_path / "b.json")
    loaded = load_profile(tmp_path / "b.json")
    hub.set_baseline(loaded)
    return loaded


def speculative_hub(clock: Clock, accepted: int = 3, sixteen_s: float = 0.030) -> Hub:
    """Speculative steps of 8 ms at batch 1 and ``sixteen_s`` at batch 16 (against :func:`with_baseline`'s 3.6 and
    6 ms); every request accepts ``accepted`` of its 4 draft tokens."""
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    hub.set_cost_ratio(CostRatio(0.25, "estimated from parameters per token", 100, 25))
    steps(hub, clock, 1, 0.008, 30, accepted=accepted, prefill_s=0.004)
    steps(hub, clock, 16, sixteen_s, 30, accepted=accepted, prefill_s=0.064)
    return hub


#: Speculative steps at batch 16 this long (c ≈ 3): no K > 0 comes near the K = 0 range's one draft pass a step, and
#: vLLM's schedule drops to K = 0 there while batch 1 runs K = 3.
STEEP = 0.080


def test_the_traffic_answer_weighs_each_batch_size_by_the_time_spent_there(tmp_path: Path) -> None:
    """Issue 26.7: "does it pay for my traffic?" Batch 1 pays, batch 16 loses; the answer is each batch size's
    speedup weighted by the window's step time there (decode and prefill), shown first in the summary."""
    from specscope.export.summary import summary

    clock = Clock()
    hub = Hub(clock=clock, window_s=3600)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    hub.set_cost_ratio(CostRatio(0.25, "estimated from parameters per token", 100, 25))
    assert traffic_speedup(hub.snapshot()) is None  # nothing ran: absent, not 1.0
    steps(hub, clock, 1, 0.008, 90, accepted=3, prefill_s=0.004)
    steps(hub, clock, 16, 0.030, 30, accepted=3, prefill_s=0.064)
    assert traffic_speedup(hub.snapshot()) is None  # no baseline: no measured speedup to weigh
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    one, sixteen = estimate(snap, batch_size=1), estimate(snap, batch_size=16)
    assert one is not None and sixteen is not None and one.pays and not sixteen.pays
    t = traffic_speedup(snap)
    assert t is not None and t.coverage == pytest.approx(1.0)
    w1, w16 = 90 * 0.008 + 0.004, 30 * 0.030 + 0.064
    assert t.speedup == pytest.approx((w1 * one.expected_speedup + w16 * sixteen.expected_speedup) / (w1 + w16))
    assert [(b, round(share, 3)) for b, share, _ in t.shares] == [(16, round(w16 / (w1 + w16), 3)),
                                                                  (1, round(w1 / (w1 + w16), 3))]
    text = summary(snap)
    assert text.index("traffic  for this traffic") < text.index("speedup  ")  # the answer comes first
    from specscope.export.catalogue import BY_NAME

    assert [v for _, v in BY_NAME["specscope.spec_decode.traffic_speedup"].read(snap)] == [t.speedup]
    # The call says when the interval cannot tell: a lean within the noise is not "pays".
    assert TrafficSpeedup(1.04, (0.97, 1.11), ((1, 1.0, 1.04),), 1.0).call == \
        "pays within the noise (interval spans 1.0x)"
    assert TrafficSpeedup(0.9, (0.85, 0.95), ((8, 0.6, 0.8), (1, 0.4, 1.05)), 0.8).explain() == \
        "for this traffic 0.90x [0.85-0.95]: does NOT pay (time at batch 8 60% 0.80x, 1 40% 1.05x; covers 80% of " \
        "the window's step time)"


def test_a_baseline_slower_than_the_speculative_steps_is_not_taken_as_free_speculation() -> None:
    """A speculative step verifies K+1 tokens a request, so it cannot be faster than a plain one: a baseline
    taken while the machine ran slower never gives c = 0 (where every K would pay). A draft model's c is priced at
    its weight share, as where it measures just above the baseline (the batch size stays in the K table, said to be
    suspect); a method with no such floor (EAGLE) falls back to the configs' estimate. A comparable baseline at the
    other batch size is still used there."""
    clock = Clock()
    hub = speculative_hub(clock)  # speculative steps: 8 ms at batch 1, 30 ms at batch 16
    hub.set_baseline(StepProfile((StepTime(1, 50, 0.0036), StepTime(16, 50, 0.040)), "slow day", SETUP))
    snap = hub.snapshot()
    sixteen, one = estimate(snap, batch_size=16), estimate(snap, batch_size=1)
    assert sixteen is not None and sixteen.measured and sixteen.c == 0.25
    assert "0.00 measured, under the draft's parameter share: priced at the share, 0.25" in explain(sixteen)
    assert "likely timed while the machine ran slower" in explain(sixteen)
    assert one is not None and one.measured and one.c == pytest.approx((0.008 / 0.0036 - 1) / 4)
    assert [c.batch_size for c in k_table(snap)] == [1, 16]
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="eagle", setup=SETUP))
    sixteen = estimate(hub.snapshot(), batch_size=16)
    assert sixteen is not None and not sixteen.measured and sixteen.c == 0.25
    assert sixteen.c_basis == "parameter counts"


def test_measured_estimate_uses_observed_tokens_and_step_times_by_batch_size(tmp_path: Path) -> None:
    clock = Clock()
    hub = speculative_hub(clock)
    assert estimate(hub.snapshot()).c_basis == "parameter counts"  # type: ignore[union-attr]  # no baseline
    loaded = with_baseline(hub, tmp_path)
    assert loaded.setup == SETUP and loaded.source == "baseline b.json of /m/target"
    snap = hub.snapshot()
    one, sixteen = by_batch_size(snap)
    tokens = 4.0  # each request gained 3 accepted + 1 bonus token per step
    assert one.tokens_observed and one.tokens_per_step == pytest.approx(tokens)
    decode_1 = tokens * 0.0036 / 0.008
    assert one.decode_speedup == pytest.approx(decode_1)
    assert one.c == pytest.approx((0.008 / 0.0036 - 1) / 4) and one.measured
    # At batch 1 a request's prefill took 4 ms and its decode 30 steps of 8 ms: rho = prefill / decode time. The
    # draft (a quarter of the target's parameters per token) did a fifth of that prefill, which a plain engine would
    # not.
    rho = 0.004 / (30 * 0.008)
    assert one.expected_speedup == pytest.approx((rho / 1.25 + decode_1) / (rho + 1))
    assert one.prefill_share == pytest.approx(rho / (1 + rho))
    assert sixteen.decode_speedup == pytest.approx(tokens * 0.0060 / 0.030) and not sixteen.pays
    assert "measured at batch 16: 30.0 ms per speculative step, 6.0 ms without speculation" in explain(sixteen)
    assert estimate(snap) == sixteen  # the operating batch (here the last decode batch: the window is idle)
    assert by_batch_line([one, sixteen]) == (f"by batch size 1: {one.expected_speedup:.2f}x  16: "
                                             f"{sixteen.expected_speedup:.2f}x; pays at batch 1, not at 16")


def test_each_ks_point_is_the_tokens_a_step_gains_over_the_steps_cost(tmp_path: Path) -> None:
    """The curve over K from its parts (what benchmarks/k_curve.py sets beside each K's own steps): the tokens a
    request gains per step at K = j over the step's cost in plain steps, with the running K's prefill."""
    clock = Clock()
    hub = speculative_hub(clock)
    with_baseline(hub, tmp_path)
    one = estimate(hub.snapshot(), batch_size=1)
    assert one is not None and one.decode_at is not None
    c = (0.008 / 0.0036 - 1) / 4
    assert one.decode_at(4) == pytest.approx((4.0, 1 + 4 * c))  # the running K, as observed
    now, rho = 4 * 0.0036 / 0.008, 0.004 / (30 * 0.008)
    for j in (1, 2, 3, 6, 8):
        tokens, step = one.decode_at(j)
        # Every request accepted its first 3 draft tokens and never the 4th: no K gains more than 3 drafted tokens.
        assert tokens == pytest.approx(1 + min(j, 3))
        # c a draft token, and a share of the running K's draft part whatever the K (the baseline's forwards were not
        # timed: all of c is the draft's).
        assert step == pytest.approx(1 + j * c + DRAFT_FIXED * c * (4 - j))
        assert one.by_k[j] == pytest.approx((rho / 1.25 + now) / (rho + now * step / tokens))


def test_short_requests_lose_a_larger_ks_drafts_past_their_end(tmp_path: Path) -> None:
    """A request's last step keeps only the tokens it still needs: priced from the window's finished requests, relative
    to the running K, whose observed tokens already hold it."""
    clock = Clock()
    hub = speculative_hub(clock)  # every request accepts its first 3 draft tokens: 4 tokens a step at K = 4
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()

    def with_outputs(tokens: int) -> Any:
        return replace(snap, requests=tuple(RequestRecord(f"r{i}", i, snap.time, generation_tokens=tokens)
                                            for i in range(8)))

    plain, short, long = (estimate(s, batch_size=1) for s in (snap, with_outputs(8), with_outputs(4001)))
    assert plain is not None and short is not None and long is not None
    assert plain.decode_at is not None and short.decode_at is not None and long.decode_at is not None
    # 7 tokens after the first: at K = 4, steps of 4 and 3 (7 kept of 8); at K = 2, steps of 3, 3 and 1 (7 of 9).
    assert plain.decode_at(2)[0] == pytest.approx(3.0)
    assert short.decode_at(2)[0] == pytest.approx(3.0 * (7 / 9) / (7 / 8))
    assert short.decode_at(4) == plain.decode_at(4)  # the running K as observed
    assert long.decode_at(2)[0] == pytest.approx(3.0, rel=1e-3)


def test_prefill_at_other_batch_sizes_counts_per_request() -> None:
    """Sixteen long prompts prefilled in a step of their own, at batch 11 (as vLLM runs them: 2 s on this CPU for
    16 prompts of ~490 tokens), then 30 decode steps of 90 ms at batch 16, each request gaining 4 tokens a step:
    a request's prefill (125 ms) weighs 0.74 of its decode there (120 tokens at 16 requests and 4 tokens a step),
    though no step at batch 16 carried prefill."""
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(0.2, "given"))
    clock.t += 2.0
    hub.record_step(StepStats(running=16, waiting=0, prompt_tokens=16 * 490, generation_tokens=16, batch=11,
                              prefill=True, first_tokens=16, first_token_s=2.0))
    steps(hub, clock, 16, 0.090, 30, accepted=3)
    est = estimate(hub.snapshot(), batch_size=16)
    rho = (2.0 / 16) / (120 / (16 * 4) * 0.090)
    assert est is not None and est.prefill_share == pytest.approx(rho / (1 + rho))
    decode = est.decode_speedup
    # Prefill is not sped up (a c given without model sizes prices no draft prefill beside it).
    assert est.expected_speedup == pytest.approx((rho + decode) / (rho + 1))


def test_k_table_and_a_ready_to_paste_schedule(tmp_path: Path) -> None:
    clock = Clock()
    hub = speculative_hub(clock)
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    table = {c.batch_size: c for c in k_table(snap)}
    # Every draft accepted exactly three tokens: a fourth is never accepted, so K=3 beats the running K=4.
    assert table[1].k == 3 and table[1].speedup > table[1].running_speedup > 1
    # At 16 a speculative step costs 5x a plain one (c = 1): no K pays. A K=0 range would still run a draft pass,
    # priced at batch 1's c (where verification costs least) less verifying one token there: the baseline's plain
    # steps (3.6, 4.0 and 6.0 ms at 1, 4 and 16) grow by 20.4/126 ms a request (least squares), 4.5% of batch 1's.
    # So the schedule keeps K=3 (four tokens a step) there, where removing speculation would be best.
    c1 = measured_cost(snap, 1)
    assert c1 is not None and c1.value == pytest.approx((8 / 3.6 - 1) / 4)
    c0 = c1.value - 20.4 / 126 / 3.6
    basis = estimate(snap, batch_size=16).k0_basis  # type: ignore[union-attr]
    # (The prefill beside the decode steps moves the end-to-end speed by a few thousandths.)
    assert table[16].k0_speedup == pytest.approx(1 / (1 + c0), abs=0.002)
    assert f"{c0:.2f}, c {c1.value:.2f} measured at batch 1 less 0.04 for verifying the token" in basis, basis
    assert table[16].k == 3 and table[16].k0_speedup < table[16].speedup < 1
    assert estimate(snap, batch_size=16).best_k == 0  # type: ignore[union-attr]
    assert k_schedule(snap) == [(1, 16, 3)] and recommended_config(snap) == {"num_speculative_tokens": 3}
    # Steeper at 16 (c ≈ 3): the K=0 range's draft pass beats every K > 0 there, and the schedule drops to it.
    hub = speculative_hub(Clock(), sixteen_s=STEEP)
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    table = {c.batch_size: c for c in k_table(snap)}
    assert table[1].k == 3 and table[16].k == 0 and table[16].speedup == pytest.approx(table[16].k0_speedup)
    schedule = k_schedule(snap)
    assert schedule[0][0] == 1 and schedule[0][2] == 3 and schedule[-1][1:] == (16, 0)  # max_num_seqs = 16
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(schedule))  # contiguous ranges
    for start, end, k in schedule:  # between measured sizes, the estimate on interpolated step times
        for b in range(start, end + 1):
            assert estimate(snap, batch_size=b).scheduled_k == k, b  # type: ignore[union-attr]
    config = schedule_config(schedule)
    assert config is not None and config["num_speculative_tokens"] == max(k for *_, k in schedule)
    assert config["num_speculative_tokens_per_batch_size"][-1][2] == 0
    assert recommended_config(snap) == config  # batch 1 pays
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    assert validate_and_normalize_dynamic_sd_schedule(config["num_speculative_tokens_per_batch_size"]) == schedule
    text = "\n".join(schedule_text(snap))
    assert (f"costs at batch 16 ({table[16].speedup:.2f}x): if the engine runs there most, remove "
            "speculative_config") in text
    assert '"num_speculative_tokens_per_batch_size": [[1, ' in text
    assert schedule_config([(1, 16, 0)]) is None
    # One K throughout is num_speculative_tokens alone: vLLM runs it the same, without a schedule's buffers.
    assert schedule_config([(1, 8, 3), (9, 16, 3)]) == {"num_speculative_tokens": 3}
    # Under data parallel vLLM drops the schedule and drafts num_speculative_tokens at every batch size: following
    # the schedule would run K=3 at batch 16. One K instead, the best at the operating batch, and why: at batch 16
    # none pays (remove speculation), at batch 1 K=3.
    hub.set_engine(replace(hub.snapshot().engine, data_parallel_size=2))
    assert recommended_config(hub.snapshot()) is None
    dp = replace(hub.snapshot(), decode_batch=1)
    assert recommended_config(dp) == {"num_speculative_tokens": 3}
    assert "vLLM drops a per-batch-size schedule under data parallel (size 2): one K" in "\n".join(schedule_text(dp))


def test_a_baseline_of_another_setup_is_refused_with_one_warning(tmp_path: Path, caplog: Any) -> None:
    clock = Clock()
    hub = speculative_hub(clock)
    other = replace(SETUP, dtype="bfloat16", max_num_seqs=256)
    with caplog.at_level(logging.WARNING, logger="specscope"):
        with_baseline(hub, tmp_path, other)
        hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    snap = hub.snapshot()
    assert snap.baseline_problem is not None
    assert "dtype bfloat16 vs float32" in snap.baseline_problem and "max num seqs 256 vs 16" in snap.baseline_problem
    assert len([r for r in caplog.records if "baseline not used" in r.getMessage()]) == 1
    est = estimate(snap)
    assert est is not None and not est.measured and by_batch_size(snap) == []
    # The same model named another way (hub id against directory) is the same setup.
    assert replace(SETUP, model="org/target").differences(SETUP) == []


def test_model_free_methods_get_a_verify_cost_never_zero() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="ngram"))
    steps(hub, clock, 1, 0.010, 30, accepted=0)
    one = estimate(hub.snapshot())
    assert one is not None and one.c == ASSUMED_VERIFY_COST and one.c_basis == "assumed"
    assert one.best_k == 0 and not one.pays  # nothing accepted: verification is pure cost
    steps(hub, clock, 8, 0.030, 30, accepted=0)  # two batch sizes: the step times can be fitted
    eight = estimate(hub.snapshot())
    assert eight is not None and eight.c_basis == "verify model" and 0 < eight.c < 1
    assert "fitted over 2 batch sizes" in eight.c_source


def test_the_verify_cost_takes_draft_tokens_and_request_steps_from_one_interval() -> None:
    """An hour of lifetime drafting 4 tokens a request-step, then a window drafting 1: c comes from the window's
    numbers alone (mixing the window's drafts with the lifetime's request-steps gave 0.66 where 0.50 is right)."""
    clock = Clock()
    hub = Hub(window_s=60, clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="ngram"))

    def decode(batch: int, dt: float, n: int, drafting: int) -> None:
        """``n`` decode steps of ``batch`` requests, ``drafting`` of which draft 4 tokens (none accepted)."""
        for _ in range(n):
            clock.t += dt
            hub.record_step(StepStats(running=batch, waiting=0, generation_tokens=batch, batch=batch, decode_s=dt,
                                      num_spec_tokens=4, drafts=drafting, draft_tokens=4 * drafting,
                                      accepted_per_pos=[0] * 4, draft_tokens_per_pos=[drafting] * 4,
                                      rejections=drafting))

    decode(4, 0.020, 1000, 4)
    decode(8, 0.030, 1000, 8)
    clock.t += 3600
    decode(4, 0.020, 50, 1)
    decode(8, 0.030, 50, 2)
    # T(b) = 10 ms + β·b·p with p = 1 + drafts per request-step, so c(8) = 2 / (p + 2).
    window = verify_cost(hub.snapshot(), 8)
    assert "fitted over 2 batch sizes" in window.source
    assert window.value == pytest.approx(2 / (2 + 2))  # p = 1 + 600 / 600
    clock.t += 120  # the window holds no steps: the lifetime's numbers, all of them
    lifetime = verify_cost(hub.snapshot(), 8)
    assert lifetime.value == pytest.approx(2 / (1 + 48_600 / 12_600 + 2))


def test_observed_tokens_per_step_beat_the_alpha_model_at_the_running_k() -> None:
    # Conditional acceptance 0.9, 0.5, 0.5, 0.5 over 80 drafts: per position 72, 36, 18, 9 accepted.
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(0.1, "given"))
    per_pos = [72, 36, 18, 9]
    counts = [8, 36, 18, 9, 9]  # drafts accepting exactly 0..4 tokens
    accepted = [j for j, n in enumerate(counts) for _ in range(n)]
    for i in range(0, 80, 4):
        clock.t += 0.01
        part = accepted[i:i + 4]
        s = draft_step(part, running=4, waiting=0, batch=4, decode_s=0.01, generation_tokens=sum(part) + 4)
        hub.record_step(s)
    snap = hub.snapshot()
    assert list(snap.lifetime.spec.accepted_per_pos) == per_pos
    est = estimate(snap, batch_size=4)
    assert est is not None and est.tokens_observed
    assert est.tokens_per_step == pytest.approx(1 + sum(per_pos) / 80)  # 2.69, observed
    alpha_model = acc.expected_tokens_per_step(snap.lifetime.spec.alpha, 4)
    assert abs(alpha_model - est.tokens_per_step) > 0.1  # what the alpha model alone would have said


def test_a_draft_whose_acceptance_falls_off_is_not_extended_geometrically_past_its_k() -> None:
    """Positions past the running K are extended with α times how the run's own last position bore the geometric
    extension out (as n-gram lookup's matches run out): the estimate shows the α observed, and prices K = 8 near
    what drafts of 8 gain, where α alone would over-value it."""
    from tests.core.test_acceptance import drafts_with

    falling, n = [0.9, 0.8, 0.65, 0.5, 0.4, 0.3, 0.25, 0.2], 4000
    per_pos = drafts_with(falling, 4, n)
    reached = [n, *per_pos]
    accepted = [j for j in range(5) for _ in range(reached[j] - (reached[j + 1] if j < 4 else 0))]
    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="ngram"))
    hub.set_cost_ratio(CostRatio(0.02, "given"))
    hub.record_step(draft_step(accepted))
    spec = hub.snapshot().window.spec
    est = estimate(hub.snapshot())
    assert est is not None and spec.alpha is not None and est.alpha == spec.alpha
    truth = acc.tokens_per_step(8, acc.per_position_rates(drafts_with(falling, 8, n, seed=1), n), 1.0)
    assert est.decode_at is not None and abs(est.decode_at(8)[0] / truth - 1.0) < 0.05
    assert acc.tokens_per_step(8, spec.per_position, spec.alpha) / truth - 1.0 > 0.08


def test_bad_baseline_files_say_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    for text, words in (("{", "not a specscope baseline"), ('{"step_times": []}', "not a usable baseline"),
                        ('{"step_times": [{"batch_size": 0, "steps": 1, "mean_s": 1}]}', "not a usable baseline")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=words):
            load_profile(bad)
    with pytest.raises(ValueError, match="cannot read baseline"):
        load_profile(tmp_path / "missing.json")
    bad.write_text('{"model": "tiny", "step_times": [{"batch_size": 1, "steps": 5, "mean_s": 0.01}]}')
    old = load_profile(bad)  # a baseline written before setups were recorded is used as it is
    assert old.setup is None and old.source == "baseline b.json of tiny"


def test_a_prefill_share_never_timed_is_unknown_not_zero(tmp_path: Path) -> None:
    """Without a step carrying prefill timed at the batch, the share of prefill is None (shown n/a, said in the
    explanation): 0 would claim decode is all there is and over-state the speedup."""
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    hub.set_cost_ratio(CostRatio(1.0, "estimated from parameters per token", 100, 100))
    steps(hub, clock, 1, 0.008, 30, accepted=3)  # no prefill step timed
    with_baseline(hub, tmp_path)
    est = estimate(hub.snapshot(), batch_size=1)
    assert est is not None and est.prefill_share is None
    assert est.expected_speedup == pytest.approx(est.decode_speedup)
    assert "prefill not timed at this batch size: decode only" in explain(est)
    steps(hub, clock, 1, 0.008, 30, accepted=3, prefill_s=0.004)
    timed = estimate(hub.snapshot(), batch_size=1)
    assert timed is not None and timed.prefill_share is not None and timed.prefill_share > 0


def test_the_k_schedule_moves_one_way_between_measured_batch_sizes() -> None:
    """The schedule a newcomer saw, [[1, 2, 4], [3, 3, 3], [4, 4, 4], [5, 7, 3], [8, 13, 2], [14, 15, 1], [16, 16, 2]]
    (measured at 1, 4 and 16): between 1 and 4 K stays 4; between 4 and 16 it only falls, never below 2."""
    from specscope.verdict import monotone_between

    zigzag = [4, 4, 3, 4, 3, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 2]
    assert monotone_between(zigzag, [(1, 4), (4, 4), (16, 2)]) == [4, 4, 4, 4, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    rising = [1, 3, 2, 2, 4]
    assert monotone_between(rising, [(1, 1), (5, 4)]) == [1, 3, 3, 3, 4]
    assert monotone_between([4, 4], [(1, 4)]) == [4, 4]  # one measured size: nothing between


def test_lossy_verification_is_said_and_a_dropped_schedule_is_not_offered(tmp_path: Path) -> None:
    clock = Clock()
    hub = speculative_hub(clock, sixteen_s=STEEP)
    with_baseline(hub, tmp_path)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP,
                              rejection_sample_method="fly"))
    snap = hub.snapshot()
    est = estimate(snap)
    assert est is not None and "loose accepts (rejection_sample_method fly)" in explain(est)
    from specscope.export.summary import summary

    assert "verification fly (lossy" in summary(snap)
    from specscope.read.tui.view import spec_panel

    assert "verification fly (lossy): acceptance counts loose accepts" in spec_panel(snap, 0.3).plain
    from specscope.read.report import EngineReport, Report, render

    page, _ = render(Report("r", "test", [EngineReport("engine", snap)]))
    assert "verification fly (lossy: acceptance counts loose accepts; not comparable with exact" in page
    # vLLM 0.33 drops num_speculative_tokens_per_batch_size for suffix decoding: one K is offered instead, the best
    # at the operating batch (here batch 16, where none pays: remove speculation).
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="suffix", setup=SETUP))
    assert recommended_config(hub.snapshot()) is None
    one = replace(hub.snapshot(), decode_batch=1)
    assert recommended_config(one) == {"num_speculative_tokens": estimate(one).best_k}  # type: ignore[union-attr]
    assert "per_batch_size" not in "\n".join(schedule_text(one))
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    assert "num_speculative_tokens_per_batch_size" in (recommended_config(hub.snapshot()) or {})


def test_the_verdict_is_computed_once_per_snapshot_and_afresh_for_a_changed_one(tmp_path: Path) -> None:
    clock = Clock()
    hub = speculative_hub(clock)
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    first = estimate(snap, batch_size=1)
    assert first is not None and first.measured
    assert estimate(snap, batch_size=1) is first  # every reader of this snapshot shares one computation
    assert [e.batch_size for e in by_batch_size(snap)] == [1, 16] and by_batch_size(snap)[0] is first
    changed = replace(snap, baseline=None)
    again = estimate(changed, batch_size=1)  # a changed snapshot starts afresh ...
    assert again is not None and not again.measured  # ... and its verdict follows the change
    assert codec.from_dict(codec.to_dict(snap)) == snap and "derived" not in codec.to_dict(snap)


#: The schedule of issue 26 item 3: K=1 up to batch 14, a K=0 range above.
K0_SCHEDULE = ((1, 14, 1), (15, 32, 0))


def k0_hub(clock: Clock, window_s: float = 60.0, method: str = "draft_model", spread: float = 0.0,
           pass_cost: float = 0.10) -> Hub:
    """An engine that followed ``K0_SCHEDULE``: K=1 at batch 1 (a quarter of its drafts accepted, c 0.15), the
    draft's pass alone at batch 16 and 24 (``pass_cost``: 10% over a plain step); a baseline linear in the batch size
    (verifying one more token a request costs 0.17 ms a request: 0.44 of a plain step at 16). At 16 and 24 K=1 would
    cost more than the K=0 range saves: 1.25 tokens for 1 + 0.10 + 0.44 steps, against 1 token for 1.10."""
    setup = replace(SETUP, max_num_seqs=32)
    hub = Hub(clock=clock, window_s=window_s)
    hub.set_engine(EngineInfo(num_speculative_tokens=1, method=method, setup=setup, k_schedule=K0_SCHEDULE))
    hub.set_cost_ratio(CostRatio(0.1, "estimated from parameters per token", 100, 10))
    plain = {b: 0.0034 + 0.00017 * b for b in (1, 4, 16, 24, 32)}
    hub.set_baseline(StepProfile(tuple(StepTime(b, 50, t, spread=spread) for b, t in plain.items() if b != 24),
                                 "measured on /m/target", setup))
    for accepted in (1, 0, 0, 0):
        steps(hub, clock, 1, plain[1] * 1.15, 10, accepted=accepted, k=1)
    steps(hub, clock, 24, plain[24] * (1 + pass_cost), 30)
    steps(hub, clock, 16, plain[16] * (1 + pass_cost), 40)  # the operating batch
    return hub


def test_a_followed_k0_range_stays_measured_and_the_advice_is_a_fixed_point() -> None:
    """Issue 26 item 3: once a schedule with a K = 0 range runs, its batch sizes were dropped from the K table
    (no estimate where K = 0) and the next advice carried batch 1's K over them, ``[[1, 32, 1]]``: the K it had
    just priced as a loss there. The K = 0 steps are measured steps of the draft's pass: they stay in the table at
    their measured speed, K > 0 is priced there from batch 1's acceptance and the pass plus verification, and the
    advice comes back as it was applied."""
    clock = Clock()
    snap = k0_hub(clock).snapshot()
    assert snap.decode_batch == 16
    table = {c.batch_size: c for c in k_table(snap)}
    assert set(table) == {1, 16, 24}
    assert table[1].k == 1 and table[1].speedup > 1
    # Priced from batch 1's K=1 steps, a K=0 range costs the pass it measures at 16 and 24: c 0.15 there, less
    # verifying one more token (0.17 ms of a 3.57 ms plain step), is 0.10; c alone priced it 50% dearer.
    assert table[1].k0_speedup == pytest.approx(1 / 1.1, abs=0.003)
    for b in (16, 24):
        c = table[b]
        assert (c.k, c.running_k) == (0, 0)
        assert c.speedup == c.running_speedup == c.k0_speedup == pytest.approx(1 / 1.1)  # measured: T_plain/T_step
    sixteen = estimate(snap, batch_size=16)
    assert sixteen is not None and sixteen.measured and sixteen.k == 0
    assert sixteen.expected_speedup == pytest.approx(1 / 1.1) and not sixteen.pays
    verify = 0.00017 * 16 / (0.0034 + 0.00017 * 16)
    assert sixteen.c == pytest.approx(0.1 + verify)
    # K=1 there: batch 1's 1.25 tokens a step, for the pass and one more token verified a request.
    assert sixteen.by_k[1] == pytest.approx(1.25 / (1 + 0.1 + verify)) and sixteen.by_k[1] < sixteen.k0_speedup
    assert sixteen.by_k[0] == 1.0 and sixteen.best_k == 0 and sixteen.scheduled_k == 0
    text = explain(sixteen)
    assert "the schedule's K=0 range at batch 16 runs 0.91x" in text
    assert "measured at batch 16, where the schedule runs K=0: the draft's pass 0.10" in text
    assert f"plus {verify:.2f} for verifying one more token a request" in text
    assert "remove speculative_config" in text
    assert [(e.batch_size, round(e.expected_speedup, 3)) for e in by_batch_size(snap)][1:] == [
        (16, round(1 / 1.1, 3)), (24, round(1 / 1.1, 3))]
    assert by_batch_line(by_batch_size(snap)).startswith("by batch size 1: ")  # type: ignore[union-attr]
    assert "16: 0.91x  24: 0.91x; pays at batch 1, not at 16, 24" in by_batch_line(by_batch_size(snap))  # type: ignore[operator]
    assert k_schedule(snap) == list(K0_SCHEDULE)
    assert recommended_config(snap) == {"num_speculative_tokens": 1,
                                        "num_speculative_tokens_per_batch_size": [list(r) for r in K0_SCHEDULE]}
    assert "   16       0    0.91x   (K=0: 0.91x)" in "\n".join(schedule_text(snap))


def test_a_k0_range_measured_faster_than_the_baseline_is_priced_at_the_drafts_weight_share() -> None:
    """A K = 0 step still runs the draft's pass: measured 5% faster than the baseline's plain step, it says the
    baseline ran slower, not that the pass is free. A draft model's pass is priced at its weight share (0.10 here),
    as where it measures just above the baseline, and its batch sizes stay in the K table (before, they dropped out
    and the schedule carried batch 1's K over them); EAGLE's pass, with no such floor, is not priced from them."""
    snap = k0_hub(Clock(), pass_cost=-0.05).snapshot()
    sixteen = estimate(snap, batch_size=16)
    assert sixteen is not None and sixteen.measured and sixteen.k == 0
    assert sixteen.expected_speedup == pytest.approx(1 / 1.1)
    assert "0.00 measured, under the draft's parameter share: priced at the share" in explain(sixteen)
    assert {c.batch_size for c in k_table(snap)} == {1, 16, 24} and k_schedule(snap) == list(K0_SCHEDULE)
    eagle = k0_hub(Clock(), method="eagle", pass_cost=-0.05).snapshot()
    assert {c.batch_size for c in k_table(eagle)} == {1}


def test_a_k0_range_has_an_interval_and_prices_k_above_0_from_the_requests() -> None:
    """With requests to resample and a baseline's spread: the K = 0 range's interval comes from the spread (its
    speed involves no acceptance), the bands at K > 0 from the requests' acceptance as at any batch size. n-gram
    lookup's K = 0 steps run no model: what they cost is the speculative path's, and said so."""
    def at(spread: float, pass_cost: float = 0.10) -> SpeedupEstimate:
        hub = k0_hub(Clock(), spread=spread, pass_cost=pass_cost)
        for i in range(20):
            n = 10 + i
            hist = (n // 2, n - n // 2) if i % 2 else (n, 0)
            hub.requests.record(f"r{i}", prompt_tokens=20, generation_tokens=n + hist[1], num_spec_tokens=1,
                                spec_steps=n, draft_tokens=n, accepted_tokens=hist[1], acceptance_histogram=hist)
        hub.wait_idle()
        est = estimate(hub.snapshot(), batch_size=16)
        assert est is not None and est.k == 0 and est.interval is not None
        return est

    est = at(0.05)
    low, high = est.interval  # type: ignore[misc]
    assert low < est.expected_speedup < high and not est.pays
    # 9% under plain: a loss, not a sure one, however steady the baseline's rounds (5% or 2% apart), the machine
    # drifting between the baseline's moment and a restart's by the fitted 11.1%. 20% under plain, a sure one.
    assert high >= 1.0 and not est.surely_loses and "may not pay (its interval reaches 1.0x)" in explain(est)
    assert not at(0.02).surely_loses
    sure = at(0.02, pass_cost=0.25)
    assert sure.surely_loses and "does NOT pay" in explain(sure)
    assert (est.low[0], est.high[0]) == (1.0, 1.0)  # speculation removed: plain speed
    assert all(lo < p < hi for lo, p, hi in zip(est.low[1:], est.by_k[1:], est.high[1:], strict=True))
    ngram = estimate(k0_hub(Clock(), method="ngram").snapshot(), batch_size=16)
    assert ngram is not None and ngram.k == 0 and ngram.measured
    assert "no model runs, the speculative path alone costs c 0.10" in explain(ngram)


def test_the_not_paying_alert_can_fire_at_a_k0_range() -> None:
    """At an operating batch in a K = 0 range that surely loses to plain decoding (the draft's pass alone, 0.80x)
    the not-paying alert fires on the window's steps there (it drafts nothing there), and says what to do; with no
    steps there in the window it does not. A range at 0.91x is within what step times drift between the baseline's
    moment and this one (the interval reaches 1.0x): it may not pay, and no alert says it does not."""
    hub = k0_hub(Clock(), window_s=600.0, pass_cost=0.25)
    rule = BY_RULE["SpecscopeSpeculationNotPaying"]
    (alert,) = Evaluator(hub, rules=[rule], thresholds=Thresholds(weak_draft_for_s=0, window_s=600)).evaluate()
    assert alert.state == "firing" and "Expected speedup is 0.80x" in alert.description
    assert "the schedule's K=0 range at batch 16 runs 0.80x" in alert.description
    assert "remove it if the engine runs at this batch size most" in alert.description
    # A 60 s window has gone idle since (the verdict falls back on the lifetime's steps): nothing measured now.
    assert Evaluator(hub, rules=[rule], thresholds=Thresholds(weak_draft_for_s=0)).evaluate() == []
    near = k0_hub(Clock(), window_s=600.0)
    est = estimate(near.snapshot())
    assert est is not None and est.expected_speedup == pytest.approx(0.91, abs=0.005) and est.interval is not None
    assert est.interval[0] < 0.85 and est.interval[1] >= 1.0 and "may not pay" in explain(est)
    assert Evaluator(near, rules=[rule], thresholds=Thresholds(weak_draft_for_s=0, window_s=600)).evaluate() == []


def test_the_interval_takes_each_step_time_at_its_standard_error_and_the_drift_between_moments_as_fitted() -> None:
    """Issue 47: the machine is drawn once. The live steps' mean is as sure as its seconds make it (±10% from one
    second to the next over 20 seconds: ±2.3%), the baseline's median as its rounds make it (12% apart over nine
    rounds: ±5%; a baseline file that does not say how many, as unsure as one round); what neither shows, the
    machine moving between moments minutes apart, is the drift fitted on saved runs (uncertainty.DRIFT), on a steady
    machine too. Context-driven step times are not taken for jitter (before, each spread stood for the drift
    between moments as well, and a jittery machine's intervals came out two to three times too wide)."""
    from specscope.core.counts import moment_spread

    assert moment_spread([(50, 50 * 0.01, 50 * 100.0, 0.0)] * 10) == 0.0  # steady
    assert moment_spread([(50, 50 * 0.01, 0.0, 0.0)] * 4) == 0.0  # too few seconds to tell: unknown
    moving = [(50, 50 * (0.011 if i % 2 else 0.009), 50 * 100.0, 0.0) for i in range(10)]
    assert moment_spread(moving) == pytest.approx(0.1 * (10 / 9) ** 0.5)
    # Longer contexts, slower steps, on a line: the context explains it all.
    assert moment_spread([(50, 50 * (0.01 + 1e-6 * c), 50.0 * c, 0.0) for c in range(100, 1100, 100)]) == \
        pytest.approx(0.0, abs=1e-9)

    def run(swing: float, rounds_spread: float = 0.0, rounds: int = 0) -> Any:
        clock = Clock()
        hub = Hub(clock=clock, window_s=600)
        hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
        row = StepTime(1, 50, 0.0036, spread=rounds_spread, readings=rounds)
        hub.set_baseline(StepProfile((row,), "measured on /m/target", SETUP))
        for second in range(20):
            dt = 0.008 * (1 + (swing if second % 2 else -swing))
            for i in range(50):
                clock.t = 1000 + second + i * 0.015
                hub.record_step(StepStats(running=1, waiting=0, generation_tokens=1 + 2 + i % 2, batch=1,
                                          decode_s=dt, num_spec_tokens=4, drafts=1, draft_tokens=4,
                                          accepted=2 + i % 2, accepted_per_pos=[1, 1, i % 2, 0],
                                          draft_tokens_per_pos=[1, 1, 1, 1], rejections=1))
        for i in range(20):
            n = 10 + i
            hub.requests.record(f"r{i}", prompt_tokens=20, generation_tokens=n * 3, num_spec_tokens=4,
                                spec_steps=n, draft_tokens=4 * n, accepted_tokens=2 * n + i % 3,
                                acceptance_histogram=(0, 0, n - i % 3, i % 3, 0))
        hub.wait_idle()
        snap = hub.snapshot()
        return snap.window.step_times.get(1, 1), estimate(snap, batch_size=1)

    def width(est: Any) -> float:
        assert est.interval is not None
        return float(est.interval[1] - est.interval[0])

    steady_steps, steady = run(0.0)
    moving_steps, moved = run(0.1)
    assert steady_steps.spread == 0.0 and moving_steps.spread == pytest.approx(0.1, rel=0.06)  # ± the fit's dof
    assert moving_steps.readings == 20 and steady_steps.readings == 0
    assert steady.expected_speedup == pytest.approx(moved.expected_speedup)  # the same mean step time
    drift = "the drift between moments ±11.1%, as CPU runs moved"
    assert f"ratio ({drift})" in explain(steady)
    assert f"the live steps' mean ±{moving_steps.spread / 20 ** 0.5:.1%} over 20 seconds; {drift}" in explain(moved)
    assert 1.0 < width(moved) / width(steady) < 1.1
    _, nine = run(0.0, rounds_spread=0.12, rounds=9)
    _, unknown = run(0.0, rounds_spread=0.12)
    assert f"the baseline's median ±5.0% over 9 rounds; {drift}" in explain(nine)
    assert f"the baseline's median ±12.0%; {drift}" in explain(unknown)
    assert width(steady) < width(nine) < width(unknown)


def test_decode_steps_slowed_by_the_prompts_prefilled_beside_them_are_the_workloads_not_the_machines() -> None:
    """Issue 47: where long prompts' prefill steps mix with decode steps, the decode steps of a second that prefilled
    more prompt tokens run slower (the prefill shares the machine); that spread is the workload's, modelled by the
    second's prompt tokens beside its context, not counted as the machine's jitter. A slope the seconds do not bear
    out (more prompts, faster steps) is not fitted: the jitter stays the machine's."""
    from specscope.core.counts import moment_spread

    # Decode steps 20% slower in the seconds that prefilled 400 prompt tokens: all of it the prompts'.
    prefilling = [(50, 50 * 0.01 * (1.2 if i % 2 else 1.0), 50 * 100.0, 400.0 if i % 2 else 0.0) for i in range(10)]
    assert moment_spread(prefilling) == pytest.approx(0.0, abs=1e-9)
    assert moment_spread([(n, t, c, 0.0) for n, t, c, _ in prefilling]) > 0.09  # unexplained: taken for jitter
    # With context moving too, both are fitted at once; jitter on top of them is left as it was.
    both = [(50, 50 * (0.01 + 2e-5 * (i % 3) * 100 + 1e-6 * p), 50 * (100.0 + 100 * (i % 3)), p)
            for i, p in enumerate([0.0, 300.0, 800.0, 0.0, 500.0, 100.0, 700.0, 0.0, 200.0, 600.0])]
    assert moment_spread(both) == pytest.approx(0.0, abs=1e-9)
    jitter = [(n, t * (1.05 if i % 2 else 0.95), c, p) for i, (n, t, c, p) in enumerate(both)]
    assert 0.03 < moment_spread(jitter) < 0.07
    # Seconds that prefilled more ran faster: no such slope is fitted, so the prompts explain nothing away.
    faster = [(n, t, c, 0.0 if i % 2 else 400.0) for i, (n, t, c, _) in enumerate(prefilling)]
    assert moment_spread(faster) == pytest.approx(moment_spread([(n, t, c, 0.0) for n, t, c, _ in prefilling]))

    def steps(slower: float) -> StepTime:
        """Twenty seconds at batch 4, every other one prefilling a 400-token prompt in a step of its own, the
        decode steps of those seconds ``slower``."""
        clock = Clock()
        hub = Hub(clock=clock, window_s=600)
        hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
        for second in range(20):
            clock.t = 1000 + second
            if second % 2:
                hub.record_step(StepStats(running=4, waiting=0, prompt_tokens=400, generation_tokens=4, batch=4,
                                          prefill=True, first_tokens=1, first_token_s=0.05))
            for i in range(20):
                clock.t = 1000 + second + 0.1 + i * 0.04
                hub.record_step(StepStats(running=4, waiting=0, generation_tokens=12, batch=4,
                                          decode_s=0.03 * (1 + slower * (second % 2)), num_spec_tokens=4, drafts=4,
                                          draft_tokens=16, accepted=8, accepted_per_pos=[4, 2, 1, 1],
                                          draft_tokens_per_pos=[4, 4, 4, 4], rejections=4))
        hub.wait_idle()
        return hub.snapshot().window.step_times.get(4, 1)

    assert steps(0.0).spread == pytest.approx(0.0, abs=1e-9)
    slowed = steps(0.2)
    assert slowed.prefill_steps == 10 and slowed.spread == pytest.approx(0.0, abs=1e-9)


def test_an_engine_that_manages_k_itself_gets_no_schedule_and_its_drafted_k_is_reported(tmp_path: Path) -> None:
    """Issue 26.8: with vLLM's enable_adaptive_verification the engine sizes each request's verification; a
    per-batch-size schedule would fight it. The advice is one K (its ceiling), the reason said, and the K the
    engine drafted per verify step stands beside the one the verdict would pick."""
    from types import SimpleNamespace

    from specscope.engine.vllm_config import engine_info
    from specscope.export.summary import summary

    spec = SimpleNamespace(method="draft_model", num_speculative_tokens=4, model="/m/draft",
                           enable_adaptive_verification=True)
    assert engine_info(SimpleNamespace(speculative_config=spec)).adaptive_verification
    spec.enable_adaptive_verification = False
    assert not engine_info(SimpleNamespace(speculative_config=spec)).adaptive_verification
    clock = Clock()
    hub = speculative_hub(clock, sixteen_s=STEEP)
    with_baseline(hub, tmp_path)
    assert "num_speculative_tokens_per_batch_size" in (recommended_config(hub.snapshot()) or {})  # a schedule
    hub.set_engine(replace(hub.snapshot().engine, adaptive_verification=True))
    for _ in range(30):  # the engine drafted 2 or 3 of its 4 a step
        clock.t += 0.01
        hub.record_step(StepStats(running=1, waiting=0, generation_tokens=3, batch=1, decode_s=0.01,
                                  num_spec_tokens=4, drafts=2, draft_tokens=5, accepted=4, accepted_per_pos=[2, 2],
                                  draft_tokens_per_pos=[2, 2, 1], rejections=1))
    snap = replace(hub.snapshot(), decode_batch=1)
    config = recommended_config(snap)
    assert config is not None and set(config) == {"num_speculative_tokens"}
    text = "\n".join(schedule_text(snap))
    assert "vLLM sizes each request's verification itself (enable_adaptive_verification)" in text
    est = estimate(snap)
    assert est is not None
    assert f"the engine drafted 2.50 tokens per verify step over the window where the verdict would pick " \
           f"K={est.advised_k}" in text
    assert "drafted 2.50/step of K=4" in summary(snap)
    from specscope.read.tui.view import spec_panel

    panel = spec_panel(snap, 0.3).plain
    assert "engine-managed K: drafted 2.50/step of K=4" in panel and "K schedule: none (vLLM sizes" in panel


def test_a_threshold_where_the_engine_spends_its_time_is_said_to_flap(tmp_path: Path) -> None:
    """Issue 26.6: vLLM picks K from the batch of each step, so a schedule threshold inside the batch sizes the
    engine runs at most flips K every few steps as requests come and go (vllm#49548). The verdict says which, and
    the one K best for the traffic; a threshold outside the middle half of the step time is left alone."""
    from specscope.verdict.traffic import flapping

    clock = Clock()
    hub = Hub(clock=clock, window_s=3600)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    for batch, dt in ((1, 0.008), (4, 0.012), (8, 0.018), (16, 0.030)):  # step time: 12%, 18%, 26%, 44%
        steps(hub, clock, batch, dt, 30, accepted=3)
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    flap = flapping(snap, [(1, 3, 4), (4, 10, 2), (11, 256, 1)])
    assert flap is not None and (flap.boundary, flap.ks, flap.band) == (10, (2, 1), (4, 16))
    assert flap.best_k is not None and flap.best_speedup is not None and flap.best_k >= 1
    assert "changes K at batch 10 (K=2 to K=1)" in flap.explain() and f"K={flap.best_k} (" in flap.explain()
    assert flapping(snap, [(1, 3, 4), (4, 256, 2)]) is None  # K changes below where the engine runs
    assert flapping(snap, [(1, 256, 3)]) is None  # one K: nothing to flap

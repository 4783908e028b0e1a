"""The verdict at the live context, and how sure it is: context recorded per decode step, a baseline priced at the
engine's context, intervals drawn from the requests, and decisions that wait for confidence."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from specscope.core import acceptance as acc
from specscope.core.counts import forward_moments
from specscope.core.model import CostRatio, EngineInfo, StepProfile, StepTime
from specscope.export.alerts.rules import BY_RULE, Thresholds
from specscope.state.hub import Hub
from specscope.verdict import estimate, explain, load_profile, measured_cost, save_profile, uncertainty
from specscope.verdict.speedup import SpeedupEstimate
from specscope.verdict.uncertainty import DRAFT_FIXED, DRAFT_FIXED_RANGE, MIN_REQUESTS
from tests.state.test_hub import Clock
from tests.verdict.test_forward import forward
from tests.verdict.test_verdict import SETUP, draft_step, speculative_hub, with_baseline


def test_decode_steps_record_the_context_their_requests_attend_over() -> None:
    """Each request prefilled 20 prompt tokens and its first token, then gains 4 tokens a step: over 30 decode
    steps it attends over 21, 25, ... 137 tokens, 79 on average, whatever the batch."""
    clock = Clock()
    hub = speculative_hub(clock)
    for batch in (1, 16):
        row = hub.snapshot().lifetime.step_times.get(batch)
        assert row is not None and row.context == pytest.approx(21 + 4 * 29 / 2)


def test_a_baseline_is_priced_at_the_context_the_engine_runs_at(tmp_path: Path) -> None:
    """Calibrated at 50 tokens of context with 0.1 ms more per step per token, a plain step at batch 16 costs
    20 + 2.9 ms at the engine's 79 tokens: c is measured against that, and the source says where it was priced."""
    base = StepProfile((StepTime(16, 50, 0.020, context=50.0, context_slope=1e-4, spread=0.05, readings=4),), "b",
                       SETUP)
    save_profile(base, tmp_path / "b.json")
    loaded = load_profile(tmp_path / "b.json")
    assert loaded.times == base.times  # context, slope, spread and its rounds survive the file
    assert loaded.at(16) == pytest.approx(0.020) and loaded.at(16, context=79.0) == pytest.approx(0.0229)
    assert loaded.at(16, context=1.0) == pytest.approx(0.020 - 49e-4)
    clock = Clock()
    hub = speculative_hub(clock)  # speculative steps of 30 ms at batch 16
    hub.set_baseline(loaded)
    cost = measured_cost(hub.snapshot(), 16)
    assert cost is not None and cost.value == pytest.approx((0.030 / 0.0229 - 1) / 4)
    assert "at 79 tokens of context (calibrated at 50 tokens)" in cost.source


def test_a_negative_context_or_slope_is_not_a_baseline(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    save_profile(StepProfile((StepTime(1, 5, 0.01, context=-3.0),), "b", SETUP), path)
    with pytest.raises(ValueError, match="cannot be negative"):
        load_profile(path)


def _mixed_hub(c: float, n: int = 20) -> Hub:
    """Half the requests accept every draft token, half none: the engine's counts and its records agree."""
    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(c, "given"))
    hub.record_step(draft_step([4] * (n // 2) + [0] * (n // 2)))
    for i in range(n):
        steps_ = 10 + i
        hist = (0, 0, 0, 0, steps_) if i % 2 == 0 else (steps_, 0, 0, 0, 0)
        accepted = sum(j * h for j, h in enumerate(hist))
        hub.requests.record(f"r{i}", prompt_tokens=20, generation_tokens=steps_ + accepted, num_spec_tokens=4,
                            spec_steps=steps_, draft_tokens=4 * steps_, accepted_tokens=accepted,
                            acceptance_histogram=hist)
    hub.wait_idle()
    return hub


def test_the_interval_comes_from_the_spread_of_the_requests_and_holds_the_point() -> None:
    est = estimate(_mixed_hub(0.3).snapshot())
    assert est is not None and est.interval is not None
    low, high = est.interval
    assert low < est.expected_speedup < high
    # Half the requests accept all of 4 tokens, half none: tokens per step 3 +- what 20 requests leave unsure.
    assert high - low > 0.2 * est.expected_speedup
    assert "90% interval over 20 requests" in explain(est)
    assert all(lo <= p <= hi for lo, p, hi in zip(est.low, est.by_k, est.high, strict=True))
    assert (est.low[est.k], est.high[est.k]) == est.interval  # the bands agree with the running K's interval


def test_no_interval_from_too_few_requests_and_the_point_decides() -> None:
    est = estimate(_mixed_hub(1.0, n=MIN_REQUESTS - 2).snapshot())
    assert est is not None and est.interval is None and "no interval" in explain(est)
    assert est.surely_loses == (est.expected_speedup < 1.0)


@pytest.mark.parametrize(("sixteen_s", "loses"), [(0.0252, False), (0.030, True)])
def test_a_measured_c_draws_the_step_times_without_requests_to_resample(tmp_path: Path, sixteen_s: float,
                                                                        loses: bool) -> None:
    """Issue 25.4: a window that finished too few requests to resample (wide01 at batch 16 on a slow day: two) and a
    measured c. The step times' spread still gives an interval, acceptance held as the steps observed it: 0.94x at
    batch 16 reaches above 1.0x (it may not pay, and is not called a loss), 0.80x does not; both are exported. The
    step times' draws tell the Ks apart draw by draw: K = 3 (or speculation removed) beats the running K = 4 in
    every draw, and is advised."""
    from specscope.export.catalogue import BY_NAME

    hub = speculative_hub(Clock(), sixteen_s=sixteen_s)  # no request records: nothing to resample
    with_baseline(hub, tmp_path)
    snap = hub.snapshot()
    est = estimate(snap, batch_size=16)
    assert est is not None and est.measured and est.interval is not None and est.interval_requests == 0
    low, high = est.interval
    assert low < est.expected_speedup < high and est.surely_loses == loses and (high < 1.0) == loses
    assert est.expected_speedup == pytest.approx(0.94 if not loses else 0.80, abs=0.01)
    assert "acceptance as observed (too few requests to resample, 8 needed)" in explain(est)
    assert est.near_best is None and est.advised_k == est.best_k != est.k
    assert snap.decode_batch == 16
    ((_, exported),) = BY_NAME["specscope.spec_decode.expected_speedup_high"].read(snap)
    assert exported == pytest.approx(high)
    # Without a measured c (the configs' parameter share) and without requests, there is still none.
    hub.set_baseline(None)
    assert estimate(hub.snapshot(), batch_size=16).interval is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("c", "fires"), [(0.55, False), (1.0, True)])
def test_not_paying_fires_only_when_speculation_loses_with_confidence(c: float, fires: bool) -> None:
    """At c 0.55 the point is 0.94x but the interval reaches above 1.0 (20 requests of two kinds): no alert, the
    text says it may not pay. At c 1.0 the whole interval is under 1.0: the alert fires."""
    snap = _mixed_hub(c).snapshot()
    est = estimate(snap)
    assert est is not None and est.interval is not None and est.expected_speedup < 1.0
    assert est.surely_loses == fires and (est.interval[1] < 1.0) == fires
    rule = BY_RULE["SpecscopeSpeculationNotPaying"]
    assert rule.firing(snap, Thresholds(weak_draft_min_draft_tokens=10)) == fires
    assert ("does NOT pay" if fires else "may not pay") in explain(est)


def _estimate(k: int, by_k: tuple[float, ...], noise: float = 0.0) -> SpeedupEstimate:
    """An estimate whose draws put each K uniformly within ``noise`` of its point, independently of the others (none:
    no interval)."""
    def draws(j: int) -> tuple[float, ...]:
        rng = random.Random(j)
        return tuple(by_k[j] + noise * rng.uniform(-1.0, 1.0) for _ in range(200))

    return SpeedupEstimate(alpha=0.7, k=k, c=0.1, c_basis="measured", c_source="", tokens_per_step=3.0,
                           tokens_observed=True, decode_speedup=by_k[k], prefill_share=None, by_k=by_k,
                           k0_speedup=0.9, interval=uncertainty.quantiles(draws(k)) if noise else None,
                           interval_requests=20 if noise else 0, draws=draws if noise else None)


def test_the_advice_keeps_the_running_k_where_the_best_is_within_its_noise() -> None:
    by_k = (1.0, 1.20, 1.30, 1.32, 1.31) + (1.2,) * (acc.K_MAX - 4)
    sure = _estimate(2, by_k, noise=0.01)
    noisy = _estimate(2, by_k, noise=0.05)
    assert _estimate(2, by_k).advised_k == 3 and sure.advised_k == 3 and sure.scheduled_k == 3
    assert noisy.best_k == 3 and noisy.advised_k == 2 and noisy.scheduled_k == 2
    assert noisy.near_best == (2, 4) and "keep K=2" in explain(noisy) and "K=2-4 are within the noise" in \
        explain(noisy)
    # Speculation off only where the running K surely loses.
    losing = (1.0, 0.8, 0.7) + (0.6,) * (acc.K_MAX - 2)
    assert _estimate(1, losing, noise=0.25).advised_k == 1
    assert _estimate(1, losing, noise=0.1).advised_k == 0


@pytest.mark.parametrize(("plain_s", "suspect"), [(0.0036, True), (0.0019, False)])
def test_a_measured_c_under_the_drafts_parameter_share_is_called_suspect(plain_s: float, suspect: bool) -> None:
    """A draft as large as its target (parameter share 1.0) costs at least its share of a step, overhead and
    verifying K+1 tokens only add: c measured at 0.31 says the baseline was timed on a slower machine; 0.80 passes.
    Either is priced at the share, so a same-size draft is never called paying on a slow baseline (1.0x at most
    here: four tokens a step for five passes' cost)."""
    clock = Clock()
    hub = speculative_hub(clock)  # speculative steps of 8 ms at batch 1
    # a draft as large as the target
    hub.set_cost_ratio(CostRatio(1.0, "estimated from parameters per token", 100, 100))
    hub.set_baseline(StepProfile((StepTime(1, 50, plain_s),), "b", SETUP))
    est = estimate(hub.snapshot(), batch_size=1)
    measured = (0.008 / plain_s - 1) / 4
    assert est is not None and est.measured and measured < 1.0 and est.c == 1.0
    assert f"{measured:.2f} measured, under the draft's parameter share: priced at the share, 1.00" in explain(est)
    assert ("likely timed while the machine ran slower" in explain(est)) == suspect
    assert est.decode_speedup == pytest.approx(4 / 5) and not est.pays


def test_a_k_other_than_the_running_one_carries_the_unknown_fixed_cost_of_a_step() -> None:
    """Every request accepts 2 of its 4 draft tokens each step: the acceptance leaves no doubt, and at the running
    K the interval is the point. Elsewhere a step may pay part of the draft's cost (4·c, c given: no verification
    to tell apart) whatever its K (one K's step time cannot tell), a share drawn over DRAFT_FIXED_RANGE
    (0..0.2): at K = 1 the band spans steps of 1 + c + 0.2·3c down to 1 + c nearly, at K = 8 steps of
    1 + 8c − 0.2·4c up to 1 + 8c nearly; the point takes the middle (``DRAFT_FIXED``)."""
    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(0.2, "given"))
    hub.record_step(draft_step([2] * 20))
    for i in range(20):
        hub.requests.record(f"r{i}", prompt_tokens=20 + i, generation_tokens=30, num_spec_tokens=4, spec_steps=10,
                            draft_tokens=40, accepted_tokens=20, acceptance_histogram=(0, 0, 10, 0, 0))
    hub.wait_idle()
    est = estimate(hub.snapshot())
    assert est is not None and est.interval is not None
    assert est.interval == pytest.approx((est.expected_speedup, est.expected_speedup))
    assert DRAFT_FIXED_RANGE == (0.0, 0.2) and abs(DRAFT_FIXED - 0.1) < 1e-12

    def step(k: int, f: float) -> float:
        return 1 + k * 0.2 + f * 0.2 * (4 - k)

    tokens_1 = est.by_k[1] * step(1, DRAFT_FIXED)  # the point's decode tokens per step at K = 1
    assert tokens_1 / step(1, 0.2) <= est.low[1] < tokens_1 / step(1, 0.17)
    assert tokens_1 / step(1, 0.03) < est.high[1] <= tokens_1 / step(1, 0.0)
    tokens_8 = est.by_k[8] * step(8, DRAFT_FIXED)
    assert tokens_8 / step(8, 0.2) >= est.high[8] > tokens_8 / step(8, 0.17)
    assert tokens_8 / step(8, 0.03) > est.low[8] >= tokens_8 / step(8, 0.0)


def forward_baseline(scale: float = 1.0, prompts: bool = True, one: float = 1.0,
                     sizes: tuple[int, ...] = (1, 4, 16)) -> StepProfile:
    """Plain steps of 3.6, 4.0 and 6.0 ms at batch 1, 4 and 16 (of them, ``sizes``; times ``scale``: a machine that
    ran slower), each with its target forwards timed: the decode steps', a token a request (batch 1's ``one`` times
    the machine's line), and (with ``prompts``) the 20-token prompts' before them."""
    def decode(b: int) -> float:
        return scale * forward(b, b) * (one if b == 1 else 1.0)

    rows = [(b, b, 50, 50 * decode(b)) for b in sizes]
    rows += [(b, 20 * b, 1, scale * forward(b, 20 * b)) for b in sizes if prompts]
    return StepProfile(tuple(StepTime(b, 50, scale * t, forwards=50, forward_s=decode(b), forward_tokens=float(b))
                             for b, t in ((1, 0.0036), (4, 0.0040), (16, 0.0060)) if b in sizes),
                       "b", SETUP, tuple(forward_moments(rows)))


def test_a_plain_step_is_priced_from_the_targets_forward_now(tmp_path: Path) -> None:
    """The engine's target forward at batch 1 and K = 4 (one request of 5 tokens) runs 20% over what the
    baseline's forwards (its prompts' and its decode steps') price that forward at: the machine is slower now, and
    the plain step is priced 20% over the calibrated 3.6 ms, whatever the context; at batch 16 (80 tokens), 10%
    over its 6 ms. A baseline that timed decode steps alone cannot tell a request's cost from a token's: it is
    priced as before, as is a forward too small a share of its step. The forward's numbers survive the baseline's
    file."""
    save_profile(forward_baseline(), tmp_path / "b.json")
    base = load_profile(tmp_path / "b.json")
    assert base.times == forward_baseline().times
    assert base.forward_moments == pytest.approx(forward_baseline().forward_moments)
    clock = Clock()
    hub = speculative_hub(clock)  # speculative steps of 8 ms at batch 1, 30 ms at batch 16
    hub.record_forwards(0, [(1, 5, 30, 30 * 1.2 * forward(1, 5)), (16, 80, 30, 30 * 1.1 * forward(16, 80)),
                            (1, 40, 2, 0.02)], 5)  # and two prompts of 40 tokens
    hub.set_baseline(base)
    snap = hub.snapshot()
    assert next(t.forwards for t in snap.lifetime.step_times.times if t.batch_size == 1) == 30  # not the prompts
    one, sixteen = measured_cost(snap, 1), measured_cost(snap, 16)
    assert one is not None and one.anchored and one.value == pytest.approx((0.008 / (1.2 * 0.0036) - 1) / 4)
    assert (f"{1e3 * 1.2 * forward(1, 5):.1f} ms now for 1 request of 5.0 tokens, {1e3 * forward(1, 5):.1f} ms at "
            "the calibration's speed") in one.source
    assert sixteen is not None and sixteen.anchored
    assert sixteen.value == pytest.approx((0.030 / (1.1 * 0.0060) - 1) / 4)
    hub.set_baseline(forward_baseline(prompts=False))
    decode_only = measured_cost(hub.snapshot(), 1)
    assert decode_only is not None and not decode_only.anchored
    assert decode_only.value == pytest.approx((0.008 / 0.0036 - 1) / 4)
    # A forward a quarter of its speculative step (the draft's passes take the rest) does not stand for the
    # machine: priced as before.
    small = speculative_hub(Clock())
    small.record_forwards(0, [(1, 5, 30, 30 * 0.002)], 5)
    small.set_baseline(base)
    share = measured_cost(small.snapshot(), 1)
    assert share is not None and not share.anchored and share.value == pytest.approx((0.008 / 0.0036 - 1) / 4)


@pytest.mark.parametrize(("one", "anchored"), [(1.05, True), (1.6, False)])
def test_a_fit_that_misses_the_calibrations_own_forward_does_not_anchor(one: float, anchored: bool) -> None:
    """A target whose one-token forward runs off the line its other forwards make: at 1.6 times the line, slower
    than its four-request forward (as a 13-layer, width-768 target ran on a 2-core CPU), the fit misses the
    calibration's own batch-1 forward by more than the drift between moments the anchor corrects, and would take
    its own error for the machine's speed: the plain step is priced as calibrated. A forward 5% off the line still
    anchors."""
    hub = speculative_hub(Clock())
    hub.record_forwards(0, [(1, 5, 30, 30 * 1.2 * forward(1, 5))], 5)
    hub.set_baseline(forward_baseline(one=one))
    got = measured_cost(hub.snapshot(), 1)
    assert got is not None and got.anchored == anchored
    if not anchored:
        assert got.value == pytest.approx((0.008 / 0.0036 - 1) / 4)


@pytest.mark.parametrize(("one", "anchored"), [(1.05, True), (1.6, False)])
def test_a_fit_through_two_batch_sizes_that_prices_a_request_under_nothing_does_not_anchor(
        one: float, anchored: bool) -> None:
    """Calibrated at batch 1 and 4 alone, the same one-token forward at 1.6 times the line is held by the fit within
    1%: it prices a request at -0.38 ms, and would take the verify forward's five tokens at batch 1 (on the line) for
    a machine 24% faster. A fit whose request costs less than nothing has taken in a forward off its line: the plain
    step is priced as calibrated. At 1.05 times the line a request costs 0.01 ms and the fit anchors."""
    from specscope.verdict.forward import fit_forward

    base = forward_baseline(one=one, sizes=(1, 4))
    fit = fit_forward(base.forward_moments)
    assert fit is not None and (fit[1] >= 0) == anchored
    assert fit[0] + fit[1] + fit[2] == pytest.approx(base.times[0].forward_s, rel=0.01)  # it holds batch 1's forward
    hub = speculative_hub(Clock())
    hub.record_forwards(0, [(1, 5, 30, 30 * forward(1, 5))], 5)
    hub.set_baseline(base)
    got = measured_cost(hub.snapshot(), 1)
    assert got is not None and got.anchored == anchored
    if not anchored:
        assert got.value == pytest.approx((0.008 / 0.0036 - 1) / 4)


def test_another_k_pays_verification_by_the_token_and_a_share_of_the_drafts_part_once() -> None:
    """A measured c holds verifying the draft token, which every K pays by the token, and the draft's part, of which
    a step pays a share whatever its K. At batch 16 the baseline's forwards price a token at 0.15 ms, 0.4 of its
    6 ms plain step (2.4 ms for 16 requests); c measured 0.89 at K = 4. K = 1 then costs 1 + c + DRAFT_FIXED·(c −
    0.4)·3 plain steps: without its forwards (no verification told apart) the baseline prices it 1 + c +
    DRAFT_FIXED·c·3, 6% more."""
    from specscope.verdict.cost import verify_forward_share

    base = forward_baseline()
    assert verify_forward_share(base, 16) == pytest.approx(0.00015 * 16 / 0.0060)
    assert verify_forward_share(forward_baseline(prompts=False), 16) is None
    hub = speculative_hub(Clock())
    hub.record_forwards(0, [(16, 80, 30, 30 * 1.1 * forward(16, 80))], 5)
    hub.set_baseline(base)
    est = estimate(hub.snapshot(), batch_size=16)
    assert est is not None and est.k == 4 and est.c == pytest.approx((0.030 / (1.1 * 0.0060) - 1) / 4)
    rho = est.prefill_share / (1 - est.prefill_share) if est.prefill_share else 0.0

    def at_one(verify: float) -> float:
        step = 1 + est.c + DRAFT_FIXED * (est.c - verify) * 3
        return acc.end_to_end(2.0 / step, est.decode_speedup, rho, 0.25)  # 1 + 1 accepted a step at K = 1

    assert est.by_k[1] == pytest.approx(at_one(0.4))
    assert at_one(0.4) / at_one(0.0) > 1.03


def test_a_context_far_from_the_calibrations_is_priced_at_the_context_not_from_the_forward() -> None:
    """The forward then is priced at the calibration's context and the forward now runs at the live one: where the
    live context moves the baseline's plain step by more than MAX_ANCHOR_CONTEXT_MOVE (a verify forward and a plain
    step grow with it by different shares), the plain step is priced at the context, as without a forward; near the
    calibration's context, the forward anchors it (20% slower now, as in the test above)."""
    from dataclasses import replace

    from specscope.verdict.cost import MAX_ANCHOR_CONTEXT_MOVE, live_context

    hub = speculative_hub(Clock())
    hub.record_forwards(0, [(1, 5, 30, 30 * 1.2 * forward(1, 5))], 5)
    context = live_context(hub.snapshot(), 1)
    assert context is not None and context > 40

    def priced(move: float) -> tuple[bool, float]:
        """Whether the plain step at batch 1 was anchored, and what it was priced at, with a baseline calibrated at
        40 tokens of context whose step the live context moves by ``move``."""
        base = forward_baseline()
        slope = move * 0.0036 / (context - 40)
        hub.set_baseline(replace(base, times=tuple(replace(t, context=40.0, context_slope=slope) for t in base.times)))
        cost = measured_cost(hub.snapshot(), 1)
        assert cost is not None
        return cost.anchored, 0.008 / (1 + 4 * cost.value)

    near, far = priced(0.5 * MAX_ANCHOR_CONTEXT_MOVE), priced(0.3)
    assert near == (True, pytest.approx(1.2 * 0.0036))
    assert far == (False, pytest.approx(1.3 * 0.0036))


def test_an_anchored_baseline_timed_on_a_slower_day_is_not_floored() -> None:
    """A baseline timed while the machine ran 2.5 times slower: unanchored, its plain step (9 ms) is over the
    speculative one (8 ms) and the draft model's c is raised to its parameter share (0.25) and called suspect; with
    the forward now at the speed of :func:`forward_baseline`'s own, the plain step is priced at 3.6 ms and c is
    measured as it is, with no floor and no caveat."""
    clock = Clock()
    hub = speculative_hub(clock)
    hub.set_baseline(forward_baseline(2.5))
    unanchored = estimate(hub.snapshot(), batch_size=1)
    assert unanchored is not None and unanchored.c == 0.25 and "ran slower" in explain(unanchored)
    hub.record_forwards(0, [(1, 5, 30, 30 * forward(1, 5))], 5)
    anchored = estimate(hub.snapshot(), batch_size=1)
    assert anchored is not None and anchored.c == pytest.approx((0.008 / 0.0036 - 1) / 4)
    assert "ran slower" not in explain(anchored) and "parameter share" not in explain(anchored)

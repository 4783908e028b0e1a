"""The interval machinery against a simulated engine whose true speedup is known (issue 47.4).

Each of :data:`DRAWS` draws is a population of traffic and a machine, all known:

- each request's per-token acceptance α from a Beta distribution (its mean and concentration drawn per population),
  each of its steps accepting the leading successes of K = 4 Bernoulli(α) trials, over a number of steps drawn
  apart from α, so that the population's tokens per step at K = j is E[1 + α + ... + α^j] (Beta moments);
- a plain step of :data:`PLAIN_S` and a speculative step at K = j of PLAIN_S·(1 + j·c + f·c·(4 − j)), c drawn per
  draw, f the share of the draft's cost a step pays whatever its K, drawn from ``DRAFT_FIXED_RANGE`` (the range the
  interval assumes: one K's step time cannot tell it, and the running K's truth does not depend on it);
- a machine on two time scales: its speed at each moment minutes apart a factor normal about 1, drifting exactly
  as the interval takes it (each of the four moments, the calibration's, the predicting window's and the restart's
  two, apart by half of ``uncertainty.DRIFT``, so that the step times' ratio moves by it between the moments
  predicted from and the restart's), and within a moment a jitter from reading to reading (a round, a second) with a
  relative spread drawn per draw from 1-20% (a quiet GPU's to a loaded CPU's).
  The calibration's three rounds (their median), the predicting window's seconds (their mean) and the restart's
  plain and speculative steps each run at a moment of their own; the restart's are long-run means (the truth).

The snapshot is built directly, holding what the hub's would (decode only, no prefill), from a sample of 40-60
requests, and ``estimate`` judges it. The truth is the population's tokens per step × the plain step / the
speculative step, at the restart's moments. The stated 90% interval must hold it in 80-97% of the draws, at the
running K and at K = 2 (a shorter K priced from the running one's positions, its step from c and the assumed fixed
share). Found 2026-12-06 (the machine drawn once: each step time at its standard error, the drift as fitted):
89% at K = 4, 95% at K = 2; 94.5%, 93%, 91%, 87.5% at K = 1, 3, 5, 6 (not asserted). The simulated requests end
on a step's boundary, where the verdict prices a last step that drops the drafts past a request's end
(``acceptance.kept_share``): with it (2026-12-07) 96% and 94% at K = 1 and 3, the rest as before.
"""

from __future__ import annotations

import functools
import random
import statistics

from specscope.core.model import (
    EngineInfo,
    GpuMemory,
    KVCache,
    RequestRecord,
    Snapshot,
    SpecCounts,
    StepProfile,
    StepTime,
    Totals,
)
from specscope.verdict import estimate
from specscope.verdict.uncertainty import DRAFT_FIXED_RANGE, DRIFT

K, BATCH, PLAIN_S, DRAWS, ROUNDS, SECONDS = 4, 8, 0.010, 200, 3, 30
#: The Ks whose coverage is computed (the running K's is asserted).
KS = (1, 2, 3, 4, 5, 6)


def tokens_per_step(j: int, a: float, b: float) -> float:
    """E[1 + α + ... + α^j] for α ~ Beta(a, b): E[α^i] = Π (a + m) / (a + b + m) over m < i."""
    total, power = 1.0, 1.0
    for i in range(j):
        power *= (a + i) / (a + b + i)
        total += power
    return total


def histograms(rng: random.Random, n: int, a: float, b: float) -> list[tuple[int, ...]]:
    """``n`` requests' acceptance histograms (steps that accepted 0 .. K tokens)."""
    out = []
    for _ in range(n):
        alpha, hist = rng.betavariate(a, b), [0] * (K + 1)
        for _ in range(rng.randint(15, 45)):
            accepted = 0
            while accepted < K and rng.random() < alpha:
                accepted += 1
            hist[accepted] += 1
        out.append(tuple(hist))
    return out


def snapshot(hists: list[tuple[int, ...]], spec_s: float, spread: float, baseline: StepProfile) -> Snapshot:
    """What the hub would hold after the window's decode steps at :data:`BATCH`: the requests' records, the
    speculative counts they add up to, and the steps' mean time (``spec_s``) and second-to-second ``spread``."""
    request_steps = sum(sum(h) for h in hists)
    accepted = sum(j * c for h in hists for j, c in enumerate(h))
    per_pos = tuple(sum(sum(h[i + 1:]) for h in hists) for i in range(K))
    spec = SpecCounts(K, drafts=request_steps, draft_tokens=K * request_steps, accepted=accepted,
                      accepted_per_pos=per_pos, draft_tokens_per_pos=(request_steps,) * K,
                      rejections=request_steps - sum(h[K] for h in hists))
    steps = request_steps // BATCH
    tokens = round((request_steps + accepted) * steps * BATCH / request_steps)
    totals = Totals(seconds=float(SECONDS), spec=spec,
                    step_times=StepProfile((StepTime(BATCH, steps, spec_s, tokens=tokens, spread=spread,
                                                              readings=SECONDS),)))
    records = tuple(RequestRecord(f"r{i}", i, 1000.0, prompt_tokens=20, generation_tokens=sum(h) + gained,
                                  num_spec_tokens=K, spec_steps=sum(h), draft_tokens=K * sum(h),
                                  accepted_tokens=gained, acceptance_histogram=h)
                    for i, h in enumerate(hists) for gained in (sum(j * c for j, c in enumerate(h)),))
    return Snapshot(time=1000.0, started_at=1000.0 - SECONDS, engine=EngineInfo(num_speculative_tokens=K,
                                                                                method="draft_model"),
                    lifetime=totals, window=totals, window_seconds=float(SECONDS), running=BATCH, waiting=0,
                    kv=KVCache(), gpu=GpuMemory("not collected"), requests=records, request_acceptance_rate=None,
                    request_acceptance_length=None, baseline=baseline, decode_batch=BATCH)


def speed(rng: random.Random, sigma: float) -> float:
    """The machine's speed factor at a moment of its own, or at a reading within one."""
    return 1.0 + sigma * rng.gauss(0.0, 1.0)


@functools.cache
def coverage() -> dict[int, float]:
    """The share of draws whose stated interval at each K in :data:`KS` holds the true speedup there."""
    rng = random.Random(47)
    held = dict.fromkeys(KS, 0)
    moment = DRIFT / 2  # each of four moments: the ratio's two ends apart by the drift
    for _ in range(DRAWS):
        mean, concentration = rng.uniform(0.4, 0.85), rng.uniform(3.0, 20.0)
        a, b = mean * concentration, (1.0 - mean) * concentration
        c, fixed, jitter = rng.uniform(0.03, 0.3), rng.uniform(*DRAFT_FIXED_RANGE), rng.uniform(0.01, 0.2)
        step = {j: PLAIN_S * (1.0 + j * c + fixed * c * (K - j)) for j in KS}
        calibration = speed(rng, moment)
        rounds = [PLAIN_S * calibration * speed(rng, jitter) for _ in range(ROUNDS)]
        baseline = StepProfile((StepTime(BATCH, 50 * ROUNDS, statistics.median(rounds), readings=ROUNDS,
                                         spread=statistics.stdev(rounds) / statistics.fmean(rounds)),), "simulated")
        window = speed(rng, moment)
        seconds = [window * speed(rng, jitter) for _ in range(SECONDS)]
        snap = snapshot(histograms(rng, rng.randint(40, 60), a, b), step[K] * statistics.fmean(seconds),
                        statistics.stdev(seconds) / statistics.fmean(seconds), baseline)
        est = estimate(snap, batch_size=BATCH)
        assert est is not None and est.measured and est.interval == (est.low[K], est.high[K])
        for j in KS:
            truth = tokens_per_step(j, a, b) * PLAIN_S * speed(rng, moment) / (step[j] * speed(rng, moment))
            held[j] += est.low[j] <= truth <= est.high[j]
    return {j: n / DRAWS for j, n in held.items()}


def test_the_stated_interval_holds_the_true_speedup_at_the_running_k_nine_times_in_ten() -> None:
    assert 0.80 <= coverage()[K] <= 0.97, coverage()


def test_the_interval_at_another_k_holds_its_true_speedup_nine_times_in_ten() -> None:
    assert 0.80 <= coverage()[2] <= 0.97, coverage()

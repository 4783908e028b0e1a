"""The interval machinery against a simulated engine whose true speedup is known (issue 47.4).

Each of :data:`DRAWS` draws is a population of traffic and a machine, all known:

- each request's per-token acceptance α from a Beta distribution (its mean and concentration drawn per population)
  and its output length, uniform in [lo, 2·lo] (lo drawn per population from 8-64, log-uniform), the first token
  from its prefill; each of its decode steps accepts the leading successes of K = 4 Bernoulli(α) trials and keeps at
  most the tokens the request still needs, its histogram counting the accepted drafts in full (vLLM counts them
  before the stop cuts the step's tokens: ``Scheduler.update_from_output``), until the request has its length. The
  population's tokens per step at K = j are E[m] / E[N(m)] over its requests (m decode tokens, N the steps they
  take at K = j: a batch kept full by replacing finished requests gains that), α averaged over 16 points;
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
requests, and ``estimate`` judges it (a draw whose speculative step read faster than its baseline's plain step gets
no measured c, and is not judged: one of the 200). The truth is the population's tokens per step × the plain step /
the speculative step, at the restart's moments. The stated 90% interval must hold it in 80-97% of the draws, at the
running K and at K = 2 (a shorter K priced from the running one's positions, its step from c and the assumed fixed
share). Found 2026-12-06, with every request's steps drawn apart from α and ending on a step's boundary: 89% at
K = 4, 95% at K = 2. With the requests' lengths (2026-12-07, the design written down before it was run): 91% at K = 4,
90.5% at K = 2; 90.5%, 90.5%, 85.4%, 84.9% at K = 1, 3, 5, 6 (not asserted); the points' median error against the
truth -0.4%, +0.9%, +1.4%, +1.7%, +0.5% at K = 1, 2, 3, 5, 6. Without the last step's kept share
(``acceptance.kept_share``) they would be -3.3%, -1.0%, +0.5%, +2.5%, +1.2%, holding 88.9% and 88.4% at K = 1
and 2.
"""

from __future__ import annotations

import functools
import math
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
#: The values of α each population's truth is averaged over.
ALPHA_POINTS = 16


def steps_needed(j: int, alpha: float, longest: int) -> list[float]:
    """E[N(m)], m = 0 .. ``longest``: the decode steps a request accepting each draft with ``alpha`` takes at K = ``j``
    for m more tokens (a step gains 1 + the accepted drafts, at most what it still needs)."""
    gain = [alpha ** i * (1.0 - alpha) for i in range(j)] + [alpha ** j]  # P(i drafts accepted)
    steps = [0.0] * (longest + 1)
    for m in range(1, longest + 1):
        total = 1.0
        for i, p in enumerate(gain[:m - 1]):  # N(m') = 0 for m' <= 0
            total += p * steps[m - 1 - i]
        steps[m] = total
    return steps


def true_tokens_per_step(rng: random.Random, a: float, b: float, lo: int) -> dict[int, float]:
    """At each K in :data:`KS`, the population's decode tokens per request step: E[m] / E[N(m)] over its requests
    (α ~ Beta(a, b), at the midpoints of :data:`ALPHA_POINTS` equal-probability bins of sorted draws; m = L − 1 for
    every output length L in [lo, 2·lo]), as a batch kept full by replacing finished requests gains them."""
    draws = sorted(rng.betavariate(a, b) for _ in range(100 * ALPHA_POINTS))
    alphas = [draws[100 * i + 50] for i in range(ALPHA_POINTS)]
    needs = range(lo - 1, 2 * lo)
    out = {}
    for j in KS:
        steps = [steps_needed(j, alpha, 2 * lo - 1) for alpha in alphas]
        out[j] = statistics.fmean(needs) / statistics.fmean(s[m] for s in steps for m in needs)
    return out


def requests(rng: random.Random, n: int, a: float, b: float, lo: int) -> list[tuple[tuple[int, ...], int, int]]:
    """``n`` requests: (acceptance histogram, output tokens, decode tokens kept). Each runs decode steps until it
    has its output length (uniform in [lo, 2·lo], the first token from its prefill); a step accepts the leading
    successes of K trials and keeps at most the tokens still needed, and its histogram counts the accepted drafts in
    full, as vLLM counts them before the stop cuts the step's tokens."""
    out = []
    for _ in range(n):
        alpha, hist, length = rng.betavariate(a, b), [0] * (K + 1), rng.randint(lo, 2 * lo)
        kept = 0
        while kept < length - 1:
            accepted = 0
            while accepted < K and rng.random() < alpha:
                accepted += 1
            hist[accepted] += 1
            kept += min(1 + accepted, length - 1 - kept)
        out.append((tuple(hist), length, kept))
    return out


def snapshot(reqs: list[tuple[tuple[int, ...], int, int]], spec_s: float, spread: float,
             baseline: StepProfile) -> Snapshot:
    """What the hub would hold after the window's decode steps at :data:`BATCH`: the requests' records, the
    speculative counts they add up to, the tokens their steps kept, and the steps' mean time (``spec_s``) and
    second-to-second ``spread``."""
    hists = [h for h, _, _ in reqs]
    request_steps = sum(sum(h) for h in hists)
    accepted = sum(j * c for h in hists for j, c in enumerate(h))
    per_pos = tuple(sum(sum(h[i + 1:]) for h in hists) for i in range(K))
    spec = SpecCounts(K, drafts=request_steps, draft_tokens=K * request_steps, accepted=accepted,
                      accepted_per_pos=per_pos, draft_tokens_per_pos=(request_steps,) * K,
                      rejections=request_steps - sum(h[K] for h in hists))
    steps = request_steps // BATCH
    tokens = round(sum(kept for _, _, kept in reqs) * steps * BATCH / request_steps)
    totals = Totals(seconds=float(SECONDS), spec=spec,
                    step_times=StepProfile((StepTime(BATCH, steps, spec_s, tokens=tokens, spread=spread,
                                                              readings=SECONDS),)))
    records = tuple(RequestRecord(f"r{i}", i, 1000.0, prompt_tokens=20, generation_tokens=length,
                                  num_spec_tokens=K, spec_steps=sum(h), draft_tokens=K * sum(h),
                                  accepted_tokens=sum(j * c for j, c in enumerate(h)), acceptance_histogram=h)
                    for i, (h, length, _) in enumerate(reqs))
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
    held, judged = dict.fromkeys(KS, 0), 0
    moment = DRIFT / 2  # each of four moments: the ratio's two ends apart by the drift
    for _ in range(DRAWS):
        mean, concentration = rng.uniform(0.4, 0.85), rng.uniform(3.0, 20.0)
        a, b = mean * concentration, (1.0 - mean) * concentration
        lo = round(math.exp(rng.uniform(math.log(8), math.log(64))))
        c, fixed, jitter = rng.uniform(0.03, 0.3), rng.uniform(*DRAFT_FIXED_RANGE), rng.uniform(0.01, 0.2)
        step = {j: PLAIN_S * (1.0 + j * c + fixed * c * (K - j)) for j in KS}
        calibration = speed(rng, moment)
        rounds = [PLAIN_S * calibration * speed(rng, jitter) for _ in range(ROUNDS)]
        baseline = StepProfile((StepTime(BATCH, 50 * ROUNDS, statistics.median(rounds), readings=ROUNDS,
                                         spread=statistics.stdev(rounds) / statistics.fmean(rounds)),), "simulated")
        window = speed(rng, moment)
        seconds = [window * speed(rng, jitter) for _ in range(SECONDS)]
        snap = snapshot(requests(rng, rng.randint(40, 60), a, b, lo), step[K] * statistics.fmean(seconds),
                        statistics.stdev(seconds) / statistics.fmean(seconds), baseline)
        est = estimate(snap, batch_size=BATCH)
        gained = true_tokens_per_step(random.Random(rng.random()), a, b, lo)
        ends = [speed(rng, moment) for _ in range(2 * len(KS))]
        if est is None:  # the speculative step read faster than the baseline's plain one: no c to measure
            continue
        assert est.measured and est.interval == (est.low[K], est.high[K])
        judged += 1
        for i, j in enumerate(KS):
            truth = gained[j] * PLAIN_S * ends[2 * i] / (step[j] * ends[2 * i + 1])
            held[j] += est.low[j] <= truth <= est.high[j]
    assert judged >= 0.95 * DRAWS, judged
    return {j: n / judged for j, n in held.items()}


def test_the_stated_interval_holds_the_true_speedup_at_the_running_k_nine_times_in_ten() -> None:
    assert 0.80 <= coverage()[K] <= 0.97, coverage()


def test_the_interval_at_another_k_holds_its_true_speedup_nine_times_in_ten() -> None:
    assert 0.80 <= coverage()[2] <= 0.97, coverage()

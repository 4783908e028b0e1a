"""The canary's statistics: the confidence sequence is the published one, identical replicas watched at every
refresh for a long run are (almost) never told apart, and a 10-point acceptance difference is decided, the right
way, within 10 minutes of this machine's traffic."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from specscope.core.model import RequestRecord
from specscope.read.canary import ALPHA, BETTER, NOT_JUDGED, UNKNOWN, WORSE, Canary, MeanSequence, decide

#: The simulated traffic mix: class -> (share of requests, per-request acceptance mean, its standard deviation).
#: All traffic has a per-request standard deviation of about 0.2 (the classes differ by 0.3).
MIX = {"chat": (0.7, 0.6, 0.15), "code": (0.3, 0.3, 0.15)}
#: Requests per second one replica of the tiny models serves on this 2-core machine (1 to 3; the slowest).
REQUESTS_PER_S = 1.0
#: The issue's goal: a 10-point difference decided within 10 minutes of traffic.
DECIDE_WITHIN = int(600 * REQUESTS_PER_S)


def beta(rng: random.Random, mean: float, sd: float) -> float:
    """One request's acceptance: Beta with this mean and standard deviation."""
    k = mean * (1 - mean) / sd**2 - 1
    return rng.betavariate(mean * k, (1 - mean) * k)


def request(rng: random.Random, shift: float = 0.0) -> tuple[str, float]:
    """One request of :data:`MIX`: its class and acceptance, every class's mean moved by ``shift``."""
    u, total = rng.random(), 0.0
    for name, (share, mean, sd) in MIX.items():
        total += share
        if u < total:
            return name, beta(rng, mean + shift, sd)
    raise AssertionError


def reference(xs: list[float], alpha: float, planned_n: int, c: float = 0.75) -> list[tuple[float, float]]:
    """Waudby-Smith & Ramdas' predictable plug-in empirical-Bernstein CS (Theorem 2, eq. 13-15), computed afresh at
    every t from the formula (no running sums), with the bets :class:`MeanSequence` documents; running intersection."""
    out, low, high = [], 0.0, 1.0
    log = math.log(2 / alpha)
    for t in range(1, len(xs) + 1):
        num_l = den = pen = 0.0
        for i in range(1, t + 1):
            prev = xs[: i - 1]
            mu_prev = (0.5 + sum(prev)) / i
            mus = [(0.5 + sum(xs[:j])) / (j + 1) for j in range(1, i)]
            var_prev = (0.25 + sum((x - m) ** 2 for x, m in zip(prev, mus, strict=True))) / i
            g = max(planned_n, i * math.log1p(i) / math.log1p(planned_n))
            lam = min(c, math.sqrt(2 * log / (var_prev * g)))
            num_l += lam * xs[i - 1]
            den += lam
            pen += 4 * (xs[i - 1] - mu_prev) ** 2 * (-math.log(1 - lam) - lam) / 4
        low, high = max(low, num_l / den - (log + pen) / den), min(high, num_l / den + (log + pen) / den)
        out.append((low, high))
    return out


def test_the_sequence_is_the_published_one() -> None:
    rng = random.Random(7)
    xs = [beta(rng, 0.55, 0.2) for _ in range(60)]
    for planned in (1, 30, 1000):
        seq = MeanSequence(0.01, planned_n=planned)
        for x, (lo, hi) in zip(xs, reference(xs, 0.01, planned), strict=True):
            seq.add(x)
            assert (seq.low, seq.high) == pytest.approx((lo, hi), abs=1e-12)
    assert seq.n == 60 and seq.mean == pytest.approx(statistics.fmean(xs))
    assert seq.sd == pytest.approx(statistics.stdev(xs))


def test_intervals_only_narrow_and_cover_the_mean() -> None:
    rng = random.Random(3)
    seq = MeanSequence(0.05)
    last = (0.0, 1.0)
    for _ in range(2000):
        seq.add(beta(rng, 0.4, 0.25))
        assert last[0] <= seq.low <= seq.high <= last[1]
        last = (seq.low, seq.high)
    assert seq.low < 0.4 < seq.high and seq.high - seq.low < 0.1
    seq.add(7.0)  # clamped into [0, 1]
    assert seq.n == 2001 and not seq.crossed


def test_decisions_and_the_error_budget() -> None:
    assert (decide(0.01, 0.2), decide(-0.2, -0.01), decide(-0.1, 0.1)) == (BETTER, WORSE, UNKNOWN)
    c = Canary(alpha=0.05, max_classes=2)
    assert (c.overall_alpha, c.class_alpha) == (0.025, 0.0125)
    assert Canary(max_classes=0).overall_alpha == 0.05
    for i, name in enumerate(["a", "b", "c", "a", None]):
        c.add_value(i % 2, name, 0.5)
    rows = {r.traffic_class: r for r in c.rows()}
    assert rows[None].incumbent.requests + rows[None].candidate.requests == 5  # every request counts overall
    assert rows["a"].alpha == rows["b"].alpha == 0.0125
    assert rows["c"].alpha is None and rows["c"].decision == NOT_JUDGED  # past the slots: shown, not judged
    assert [r.traffic_class for r in c.rows()] == [None, "a", "b", "c"]
    assert rows["a"].share == pytest.approx(0.4)


def test_records_count_by_their_acceptance_and_class() -> None:
    c = Canary()
    recs = [RequestRecord("a", 1, 0.0, draft_tokens=40, accepted_tokens=30, traffic_class="chat"),
            RequestRecord("b", 2, 0.0, draft_tokens=0, accepted_tokens=0, traffic_class="chat"),  # no drafts
            RequestRecord("c", 3, 0.0, prompt_tokens=10)]  # no speculative numbers
    assert c.add(1, recs) == 1
    rows = c.rows()
    assert rows[0].candidate.mean == 0.75 and rows[1].traffic_class == "chat"
    assert rows[0].difference is None and rows[0].decision == UNKNOWN


def run(seed: int, shift: float, requests: int, batch: int) -> tuple[set[str], int | None]:
    """Two replicas of :data:`MIX`, the candidate's acceptance moved by ``shift``, ``batch`` requests each between
    looks, until all traffic is decided or ``requests`` each. Returns the decisions any row showed at any look, and
    the requests per replica at the look that first decided all traffic (None: none did)."""
    rng = random.Random(seed)
    c = Canary()
    seen: set[str] = set()
    for n in range(batch, requests + 1, batch):
        for replica, moved in ((0, 0.0), (1, shift)):
            for _ in range(batch):
                c.add_value(replica, *request(rng, moved))
        rows = c.rows()
        seen |= {r.decision for r in rows if r.decision in (BETTER, WORSE)}
        if rows[0].decision != UNKNOWN:
            return seen, n
    return seen, None


def test_identical_replicas_watched_at_every_refresh_are_not_told_apart() -> None:
    """200 seeded runs of two identical replicas, 3000 requests each, looked at after every 2 requests each (1500
    looks a run): the runs where any row ever shows a decision stay within α."""
    runs, requests, batch = 200, 3000, 2
    false = sum(bool(run(seed, 0.0, requests, batch)[0]) for seed in range(runs))
    assert false <= ALPHA * runs, f"{false} of {runs} runs decided between identical replicas"
    assert false == 0  # what the seeds give: the bound is conservative (its error is at most α, here far under)


@pytest.mark.parametrize(("shift", "want"), [(-0.1, WORSE), (0.1, BETTER)])
def test_a_ten_point_difference_is_decided_within_ten_minutes_of_traffic(shift: float, want: str) -> None:
    """Every class's acceptance 10 points apart: all 50 seeded runs decide the right way on all traffic, within
    :data:`DECIDE_WITHIN` requests per replica (10 minutes at :data:`REQUESTS_PER_S`); looked at every 5."""
    results = [run(seed, shift, 4 * DECIDE_WITHIN, 5) for seed in range(1000, 1050)]
    assert all(seen == {want} for seen, _ in results)  # no row ever decides the wrong way
    counts = sorted(n if n is not None else 10**9 for _, n in results)
    assert counts[-1] <= DECIDE_WITHIN, counts
    assert statistics.median(counts) <= 0.6 * DECIDE_WITHIN, counts

"""The statistics of the promotion gate (:mod:`specscope.read.evaluate.gate`): Student's t without scipy, the
geometric mean of a few rounds' ratios with its t-interval on the log scale (:func:`log_interval`), how many rounds
would decide (:func:`rounds_to_decide`), acceptance over requests with the ratio estimator's interval
(:func:`acceptance_interval`), and the percentile bootstrap the gate does not use, kept for the simulation that
shows why (:func:`bootstrap_interval`)."""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


# -- Student's t, without scipy
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes, 3rd ed., §6.4)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


# -- intervals
@dataclass(frozen=True)
class Estimate:
    """A ratio over rounds: their geometric mean, its interval (None with one round), the rounds, and the standard
    deviation of their logarithms."""

    value: float
    low: float | None
    high: float | None
    rounds: int
    log_sd: float | None = None

    def text(self) -> str:
        """"1.12x [1.06-1.18]"."""
        return f"{self.value:.2f}x" + ("" if self.low is None or self.high is None
                                       else f" [{self.low:.2f}-{self.high:.2f}]")


def log_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate | None:
    """The geometric mean of positive ``values`` and its Student-t interval on the log scale; None without any."""
    logs = [math.log(v) for v in values if v > 0]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Estimate(math.exp(mean), None, None, len(logs))
    sd = statistics.stdev(logs)
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, len(logs) - 1) * sd / math.sqrt(len(logs))
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs), sd)


def bootstrap_interval(values: Sequence[float], confidence: float = CONFIDENCE, draws: int = 2000,
                       seed: int = 0) -> tuple[float, float] | None:
    """The percentile bootstrap's interval of the geometric mean of ``values`` (resampling rounds): not what the gate
    uses (from a handful of rounds it covers less than it claims); kept for the coverage simulation that says so."""
    logs = [math.log(v) for v in values if v > 0]
    if len(logs) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws))
    tail = (1.0 - confidence) / 2.0
    return math.exp(means[int(tail * (draws - 1))]), math.exp(means[int((1.0 - tail) * (draws - 1))])


def rounds_to_decide(est: Estimate, bound: float = 1.0, confidence: float = CONFIDENCE) -> int | None:
    """About how many rounds the interval of ``est`` needs to leave ``bound`` behind, if its mean and spread stay as
    measured; None where they cannot (no spread measured, or the mean on the bound), or past 1000."""
    sd = est.log_sd
    if sd is None or sd <= 0:
        return None
    gap = abs(math.log(est.value) - math.log(bound))
    if gap <= 0:
        return None

    def enough(n: int) -> bool:
        return t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * sd / math.sqrt(n) < gap

    lo, hi = max(est.rounds, 2), 1000
    if not enough(hi):
        return None
    while lo < hi:  # the half-width shrinks as rounds are added: the fewest that are enough
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def acceptance_interval(requests: Sequence[tuple[int, int]], confidence: float = CONFIDENCE
                        ) -> tuple[float, float] | None:
    """The interval of accepted / drafted over requests, each ``(drafted, accepted)``: the ratio estimator's
    variance, requests being the independent units, not tokens (Cochran, "Sampling Techniques", 3rd ed., 1977,
    §6.4: Σ(a − p·d)² / (n − 1) / n / d̄²), with Student's t; None with fewer than two requests that drafted."""
    rows = [(d, a) for d, a in requests if d > 0]
    n = len(rows)
    if n < 2:
        return None
    drafted, accepted = sum(d for d, _ in rows), sum(a for _, a in rows)
    p = accepted / drafted
    var = sum((a - p * d) ** 2 for d, a in rows) / (n - 1) / n / (drafted / n) ** 2
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * math.sqrt(var)
    return max(0.0, p - half), min(1.0, p + half)

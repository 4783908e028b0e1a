"""How sure the verdict is: the spread of acceptance over the window's requests, resampled (a bootstrap over
requests), and of the step times: the baseline's median and the live steps' mean at their standard errors, and the
step times' drift between moments, which neither shows (:data:`DRIFT`).

Acceptance depends on the text: two samples of the same traffic can differ by 10-15% in tokens per step, and a
verdict drawn from 45 requests is a sample. Each draw resamples the window's distinct requests (requests with the
same numbers, such as a prompt sent again under greedy decoding, count once: they say nothing new about the
traffic) and gives how much the acceptance of the draw differs from the whole sample's, position by position;
:func:`specscope.verdict.speedup.estimate` prices each draw as it prices the point, with a plain step time drawn
from the baseline's standard error, and takes the central :data:`COVERAGE` of the draws as the interval.

The interval is for the traffic's speedup, what a restart at the K it names gives over the long run (the mean over
all of the traffic's requests, at the machine's speed at another moment), not for one more window's measurement of
as many requests: that scatters further, by the second sample's own uncertainty (a 90% interval of the mean holds
such a measurement about three times in four). ``tests/verdict/test_interval_coverage.py`` checks the coverage on a
simulated engine whose truth is known.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from specscope.core import derived
from specscope.core.model import RequestRecord, Snapshot

#: The share of draws an interval covers (its ends are the 5th and 95th percentiles).
COVERAGE = 0.9
#: Draws per snapshot.
DRAWS = 200
#: Distinct requests with speculative numbers an interval needs; with fewer there is none.
MIN_REQUESTS = 8


@dataclass(frozen=True)
class Draw:
    """One resample of the requests, relative to the whole sample: each position's acceptance rate, the tokens a
    step gains beyond the bonus token, and α, each as a ratio to the whole sample's."""

    rates: tuple[float, ...]
    gained: float
    alpha: float


#: A draw that keeps the sample's acceptance as it is (no requests to resample).
AS_OBSERVED = Draw((), 1.0, 1.0)


@dataclass(frozen=True)
class Resample:
    """The draws and what they were drawn from."""

    draws: tuple[Draw, ...]
    #: Distinct requests drawn from.
    requests: int


def _counts(hist: Sequence[int]) -> tuple[int, int, list[int], int]:
    """A request's (steps, accepted, accepted per position, rejections) from its acceptance histogram (steps that
    accepted 0, 1, ... K tokens)."""
    k = len(hist) - 1
    steps = sum(hist)
    per_pos = [sum(hist[i + 1:]) for i in range(k)]
    return steps, sum(j * h for j, h in enumerate(hist)), per_pos, steps - hist[k]


def _summary(items: Sequence[tuple[int, int, list[int], int]]) -> tuple[tuple[float, ...], float, float] | None:
    steps = sum(i[0] for i in items)
    k = max((len(i[2]) for i in items), default=0)
    if not steps or not k:
        return None
    per_pos = [sum(i[2][p] for i in items if p < len(i[2])) for p in range(k)]
    successes, failures = sum(per_pos), sum(i[3] for i in items)
    a = successes / (successes + failures) if successes + failures else 0.0
    return tuple(c / steps for c in per_pos), sum(i[1] for i in items) / steps, a


def records(snap: Snapshot) -> list[RequestRecord]:
    """The requests the interval is drawn from: the window's with an acceptance histogram, else every kept one's."""
    kept = [r for r in snap.requests if r.acceptance_histogram and r.spec_steps]
    recent = [r for r in kept if r.finished_at >= snap.time - snap.window_seconds]
    return recent if len({_key(r) for r in recent}) >= MIN_REQUESTS else kept


def _key(r: RequestRecord) -> tuple[object, ...]:
    return r.prompt_tokens, r.generation_tokens, r.acceptance_histogram


def resample(snap: Snapshot) -> Resample | None:
    """The draws for ``snap`` (computed once per snapshot); None with fewer than :data:`MIN_REQUESTS` distinct
    requests."""
    return derived.once(snap, ("resample",), lambda: _resample(records(snap)))


def _resample(recs: Sequence[RequestRecord]) -> Resample | None:
    distinct = {_key(r): r.acceptance_histogram for r in recs}
    items = [_counts(h) for h in distinct.values() if h]
    whole = _summary(items)
    if len(items) < MIN_REQUESTS or whole is None or whole[1] <= 0 or whole[2] <= 0:
        return None
    rates0, gained0, alpha0 = whole
    rng = random.Random(0)
    draws = []
    for _ in range(DRAWS):
        got = _summary(rng.choices(items, k=len(items)))
        if got is None:
            continue
        rates, gained, a = got
        draws.append(Draw(tuple(r / r0 if r0 else 1.0 for r, r0 in zip(rates, rates0, strict=False)),
                          gained / gained0, a / alpha0))
    return Resample(tuple(draws), len(items))


#: The relative drift of the step times' ratio between moments minutes apart, which neither a baseline's back-to-back
#: rounds nor a window's seconds show: the speculative step from the window predicted from to a restart's, and the
#: plain step from its calibration to the moment served. Fitted by ``benchmarks/fit_constants.py --drift``
#: (``results/fit_drift.json``) on the saved user-path runs of the 2-core CPU machines (tiny models): the normal
#: spread whose central 90% held 90% of the 116 moves those runs measured, leaving each model pair out 0.102-0.121 and
#: holding 105 of the 116 left-out moves (the 6.5% and 4.6% assumed before, 8.0% together, held 96). It holds the
#: window's and the baseline's own standard errors of those runs too, so it counts them twice here (a point or less
#: in quadrature). A quiet GPU moves less.
DRIFT = 0.111


def standard_error(spread: float, readings: int, median: bool = False) -> float:
    """How sure a mean (or, ``median``, a median: 1.25 times as unsure) of ``readings`` readings whose relative
    standard deviation is ``spread`` is; ``spread`` itself where their number is unknown (as unsure as one)."""
    return (1.25 if median else 1.0) * spread / readings ** 0.5 if readings > 1 else spread


def noise(draws: int, spread: float, seed: int = 1) -> list[float]:
    """Factors, one per draw, normal with the relative ``spread`` (1.0 each where it is unknown), kept within ±3
    spreads: for the plain step time against the speculative one (the baseline's rounds), or for the speedup (the
    machine's drift between moments; another ``seed``, drawn apart)."""
    rng = random.Random(seed)
    return [1.0 + spread * max(-3.0, min(3.0, rng.gauss(0.0, 1.0))) for _ in range(draws)]


#: A draft pass at a K = 0 range (c0: the draft's one pass and the speculative path's set-up, measured alone) is paid
#: once a step at any K > 0 for this share of it, the rest at each of the K passes: the point takes the middle of the
#: draws' range (none to all of it).
FIXED_RANGE = (0.0, 1.0)
FIXED = sum(FIXED_RANGE) / 2
#: At a K > 0, the share of the draft's part of the running K's step (its cost beyond a plain step, less verifying
#: the draft tokens: :func:`specscope.verdict.cost.verify_forward_share`) that a step pays whatever its K: sampling,
#: bookkeeping, the proposer's set-up, the draft's first pass over the accepted tokens. One K's step time does not
#: tell it; the user-path runs' steps at K = 1 and 2, predicted from K = 4, gave 0.14-0.21 for the deep01 and tiny
#: pairs and -0.08 to 0.05 for the wide one (under 0 where the baseline's forward fit, linear in tokens, prices
#: verifying two tokens a request on a large model above what it costs; a share paid whatever the K is not under 0).
#: The point takes the middle of the draws' range, fitted by ``benchmarks/fit_constants.py`` on the saved user-path
#: runs (tiny models on a 2-core CPU), leaving each model pair out: the other pairs chose 0.1 for three of the four
#: (0.125 without tiny), and the pairs left out met 10% in 268 of 351 cells at K other than 4 (270 at 0.1).
DRAFT_FIXED_RANGE = (0.0, 0.2)
DRAFT_FIXED = sum(DRAFT_FIXED_RANGE) / 2


def fixed_shares(draws: int, share: tuple[float, float]) -> list[float]:
    """One per draw: a share of the draft's cost that a speculative step pays whatever its K, uniform over the range
    ``share`` (:data:`FIXED_RANGE`, :data:`DRAFT_FIXED_RANGE`; one K's step time does not tell, see
    ``interval.speedup_interval``)."""
    rng = random.Random(2)
    low, high = share
    return [low + (high - low) * rng.random() for _ in range(draws)]


def quantiles(values: Sequence[float]) -> tuple[float, float]:
    """The central :data:`COVERAGE` of ``values``: (low, high)."""
    ordered = sorted(values)
    tail = (1.0 - COVERAGE) / 2
    last = len(ordered) - 1
    return ordered[round(tail * last)], ordered[round((1.0 - tail) * last)]

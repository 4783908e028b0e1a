"""How sure the verdict is: the spread of acceptance over the window's requests, resampled (a bootstrap over
requests), and of the step times: the baseline's between its calibration rounds, and each step time's drift between
moments (:data:`SPEC_DRIFT` and :data:`PLAIN_DRIFT` at least).

Acceptance depends on the text: two samples of the same traffic can differ by 10-15% in tokens per step, and a
verdict drawn from 45 requests is a sample. Each draw resamples the window's distinct requests (requests with the
same numbers, such as a prompt sent again under greedy decoding, count once: they say nothing new about the
traffic) and gives how much the acceptance of the draw differs from the whole sample's, position by position;
:func:`specscope.verdict.speedup.estimate` prices each draw as it prices the point, with a plain step time drawn
from the baseline's spread, and takes the central :data:`COVERAGE` of the draws as the interval.

The interval says where a measurement on another window of as many requests of the same traffic will fall (what a
restart at the K it names is judged on), not only where this sample's mean lies: both samples are uncertain, so
each draw's deviation from the whole sample is taken :data:`PREDICTION` times (√2: the difference of two
independent means of equal size). A 90% interval of one sample's mean holds a second sample's only about three
times in four.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from specscope.model import RequestRecord, Snapshot

#: The share of draws an interval covers (its ends are the 5th and 95th percentiles).
COVERAGE = 0.9
#: Draws per snapshot.
DRAWS = 200
#: Distinct requests with speculative numbers an interval needs; with fewer there is none.
MIN_REQUESTS = 8
#: How far a draw's deviation from the whole sample is taken: this sample's uncertainty and the next one's.
PREDICTION = 2 ** 0.5


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
    key = ("resample",)
    if key not in snap.derived:
        snap.derived[key] = _resample(records(snap))
    return snap.derived[key]


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
        draws.append(Draw(tuple(_widen(r / r0) if r0 else 1.0 for r, r0 in zip(rates, rates0, strict=False)),
                          _widen(gained / gained0), _widen(a / alpha0)))
    return Resample(tuple(draws), len(items))


def _widen(ratio: float) -> float:
    """A draw's ratio to the whole sample, its deviation taken :data:`PREDICTION` times (never below 0)."""
    return max(0.0, 1.0 + PREDICTION * (ratio - 1.0))


#: The least relative drift a verdict assumes between moments minutes apart (where the live steps and the baseline's
#: rounds move less), each as measured on the 2-core CPU machines of ``benchmarks/bench_truth_user.py``: the
#: speculative step's until the window a restart is judged on (the same engine's step at the same batch size moved by
#: 6.5%, root mean square, between two runs minutes apart) and the plain step's since its baseline (the step served
#: differed from the one its calibration priced by 4.6%).
SPEC_DRIFT, PLAIN_DRIFT = 0.065, 0.046


def noise(draws: int, spread: float) -> list[float]:
    """Factors for the plain step time against the speculative one, one per draw: normal with the relative
    ``spread`` of their ratio (the baseline's rounds and both steps' drift; 1.0 each where it is unknown), kept
    within ±3 spreads."""
    rng = random.Random(1)
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
#: The point takes the middle of the draws' range, fitted: over eight saved user-path runs judged again, a point of
#: 0.1 met 10% in more cells (239 of 300) than 0.05, 0.075, 0.15 or 0.2 (224-238); the next run, not used to choose
#: it (``truth_user_day6``), 45 of 48.
DRAFT_FIXED_RANGE = (0.0, 0.2)
DRAFT_FIXED = sum(DRAFT_FIXED_RANGE) / 2


def fixed_shares(draws: int, share: tuple[float, float]) -> list[float]:
    """One per draw: a share of the draft's cost that a speculative step pays whatever its K, uniform over the range
    ``share`` (:data:`FIXED_RANGE`, :data:`DRAFT_FIXED_RANGE`; one K's step time does not tell, see
    ``speedup._interval``)."""
    rng = random.Random(2)
    low, high = share
    return [low + (high - low) * rng.random() for _ in range(draws)]


def quantiles(values: Sequence[float]) -> tuple[float, float]:
    """The central :data:`COVERAGE` of ``values``: (low, high)."""
    ordered = sorted(values)
    tail = (1.0 - COVERAGE) / 2
    last = len(ordered) - 1
    return ordered[round(tail * last)], ordered[round((1.0 - tail) * last)]

"""The expected speedup at a batch size and K: the verdict's model (see the package docstring).

Over 400 lines because an estimate at a running K and one at a schedule's K = 0 range are priced side by side here,
from the same inputs and helpers, and each passes its pricing to the interval. :class:`SpeedupEstimate` is the
result, numbers and the decisions they make; its words are :mod:`specscope.verdict.prose`'s, its interval's draws
:mod:`specscope.verdict.interval`'s, and what prefill leaves :mod:`specscope.verdict.prefill`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specscope.core import acceptance as acc
from specscope.core import derived
from specscope.core.model import (
    CostRatio,
    Snapshot,
    TrafficClass,
)
from specscope.core.sizing import MODEL_FREE_METHODS
from specscope.verdict import prefill, uncertainty
from specscope.verdict.baseline import usable_baseline
from specscope.verdict.cost import (
    MIN_STEPS,
    at_least_share,
    k0_cost,
    live_context,
    measured_cost,
    spec_counts,
    steps_at,
    verify_cost,
    verify_forward_share,
    verify_share,
)
from specscope.verdict.interval import speedup_interval
from specscope.verdict.vllm_policy import lossy_verification

#: Decode steps a batch size needs to get a row of its own in the by-batch verdict and the K table (batch sizes
#: an engine passes through briefly, as a batch drains, are too noisy to advise on).
MIN_TABLE_STEPS = 20


#: Said of every estimate on an engine whose verification is lossy.
LOSSY_CAVEAT = ("; acceptance counts loose accepts (rejection_sample_method fly): not comparable with exact "
                "verification, and the speedup is that of the lossy method")


#: An interval at every K: its low ends and its high ends, K = 0 .. 16.
Bands = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class SpeedupEstimate:
    """Expected speedup over no speculation at one batch size, at the running K and at every K in 0..16: the
    numbers and the decisions they make (in words: :func:`specscope.verdict.prose.explain`)."""

    alpha: float
    k: int
    #: c, the draft/target step-cost ratio this estimate used (``snapshot.cost_ratio`` is the configs' or given one).
    c: float
    #: "measured", "parameter counts", "verify model" or "assumed"
    c_basis: str
    c_source: str
    #: Tokens a request gains per decode step at the running K, and whether that was observed or modelled.
    tokens_per_step: float
    tokens_observed: bool
    decode_speedup: float
    #: Share of the engine's time in steps carrying prefill, which speculation does not speed up; None where no step
    #: carrying prefill was timed at this batch size (the speedup is then decode's alone).
    prefill_share: float | None
    #: End-to-end speedup for K = 0 (speculation removed: 1.0) .. 16.
    by_k: tuple[float, ...]
    batch_size: int | None = None
    #: End-to-end speedup of a K = 0 range in vLLM's ``num_speculative_tokens_per_batch_size``: speculation stays
    #: configured, and a draft model or head still runs a pass every step to keep its KV cache in step with the
    #: target (:func:`k0_decode`); measured where the schedule runs K = 0 at this batch size. Only removing
    #: ``speculative_config`` (a restart) gives ``by_k[0]``.
    k0_speedup: float = 1.0
    k0_basis: str = ""
    #: What the estimate cannot account for, for people ("" when nothing).
    caveat: str = ""
    #: The expected speedup's interval at the running K (:mod:`specscope.verdict.uncertainty`) and what it was drawn
    #: from; None where it could not be drawn (too few requests with speculative numbers, and c not measured).
    interval: tuple[float, float] | None = None
    interval_basis: str = ""
    #: The distinct requests whose acceptance the interval resampled; 0: drawn over the step times alone.
    interval_requests: int = 0
    #: The speedup at K = j in each of the interval's draws (the same draws at every K: two Ks are compared draw by
    #: draw), computed when first asked; read through :attr:`low`, :attr:`high` and :attr:`advised_k`.
    draws: Callable[[int], tuple[float, ...]] | None = field(default=None, compare=False, repr=False)
    #: The point's decode at K = j (:func:`decode_step`): tokens a request gains per step and the step's cost in
    #: plain steps; None at a K = 0 range.
    decode_at: Callable[[int], tuple[float, float]] | None = field(default=None, compare=False, repr=False)

    @property
    def expected_speedup(self) -> float:
        """End-to-end speedup at the running K (a K = 0 range of vLLM's schedule: :attr:`k0_speedup`)."""
        if self.k == 0:
            return self.k0_speedup
        return self.by_k[self.k] if self.k < len(self.by_k) else self.decode_speedup

    @property
    def best_k(self) -> int:
        """The K that maximises the speedup; 0 means speculation should be turned off."""
        return acc.best_k(self.by_k)[0]

    @property
    def best_speedup(self) -> float:
        """The speedup at :attr:`best_k` (1.0 when that is 0)."""
        return acc.best_k(self.by_k)[1]

    @functools.cached_property
    def _bands(self) -> Bands:
        """Each K's interval, holding its point; K = 0 is speculation removed (plain speed)."""
        if self.draws is None:
            return (), ()
        ends = [(1.0, 1.0)]
        for j in range(1, len(self.by_k)):
            lo, hi = uncertainty.quantiles(self.draws(j))
            ends.append((min(lo, self.by_k[j]), max(hi, self.by_k[j])))
        return tuple(lo for lo, _ in ends), tuple(hi for _, hi in ends)

    @property
    def low(self) -> tuple[float, ...]:
        """The interval's low end at K = 0 .. 16 (empty without an interval)."""
        return self._bands[0]

    @property
    def high(self) -> tuple[float, ...]:
        """The interval's high end at K = 0 .. 16 (empty without an interval)."""
        return self._bands[1]

    @property
    def advised_k(self) -> int:
        """The K to run: :attr:`best_k`, unless the running K is at least as fast in more than one draw in twenty
        of the interval's (:meth:`_advised`): the difference is inside the noise, a restart for nothing."""
        return self._advised(self.by_k)

    @property
    def near_best(self) -> tuple[int, int] | None:
        """The smallest and largest K whose interval reaches the best speedup (indistinguishable from the best);
        None without an interval over the requests' acceptance."""
        if not self.high or not self.interval_requests:
            return None
        top = self.best_speedup
        ks = [j for j in range(1, len(self.high)) if self.high[j] >= top]
        return (min(ks), max(ks)) if ks else None

    @property
    def scheduled_k(self) -> int:
        """The K to put in vLLM's schedule at this batch size, a K = 0 range priced at :attr:`k0_speedup` (the
        running K kept where the best is within its noise)."""
        return self._advised((self.k0_speedup, *self.by_k[1:]))

    @property
    def scheduled_speedup(self) -> float:
        """The speedup at :attr:`scheduled_k` with speculation configured."""
        k = self.scheduled_k
        return self.k0_speedup if k == 0 else self.by_k[k]

    def _advised(self, curve: tuple[float, ...]) -> int:
        """``curve``'s best K, or the running K where the best does not beat it in the draws, compared draw by draw
        (the requests' acceptance and the step times, whose draws move c and so which K is best; speculation
        removed, or a K = 0 range in a K > 0 estimate, at its point)."""
        best = acc.best_k(curve)[0]
        if best == self.k or self.draws is None:
            return best
        mine = self.draws(self.k)
        theirs = self.draws(best) if best else (curve[0],) * len(mine)
        kept = sum(m >= t for m, t in zip(mine, theirs, strict=True))
        return self.k if kept > (1.0 - uncertainty.COVERAGE) / 2 * len(mine) else best

    @property
    def pays(self) -> bool:
        """True when speculation at the running K is expected to be faster than plain decoding."""
        return self.expected_speedup >= 1.0

    @property
    def surely_loses(self) -> bool:
        """Slower than plain decoding with confidence: the interval's top under 1.0 (the point's, without one)."""
        iv = self.interval
        return (iv[1] if iv else self.expected_speedup) < 1.0

    @property
    def measured(self) -> bool:
        """True when c comes from live step times against a baseline."""
        return self.c_basis == "measured"


def _observed_tokens(snap: Snapshot, k: int) -> float | None:
    """Tokens a request gained per decode step, pooled over the batch sizes that ran ``k`` (acceptance depends on
    the draft and the text, not on the batch): the window's, else the lifetime's."""
    for interval in (snap.window, snap.lifetime):
        times = [t for t in interval.step_times.times if t.steps and snap.engine.k_at(t.batch_size) == k]
        request_steps = sum(t.steps * t.batch_size for t in times)
        if request_steps >= MIN_STEPS and all(t.tokens for t in times):
            return sum(t.tokens for t in times) / request_steps
    return None


def _basis(cost: CostRatio, measured: bool) -> str:
    if measured:
        return "measured"
    if cost.source.startswith("verify model"):
        return "verify model"
    if cost.source.startswith("assumed"):
        return "assumed"
    return "parameter counts"


def estimate(snap: Snapshot, cost: CostRatio | None = None, batch_size: int | None = None) -> SpeedupEstimate | None:
    """The estimate at ``batch_size`` (default: the snapshot's operating batch, ``decode_batch``); None without the
    inputs. Computed once per snapshot and batch size (kept beside it: :func:`specscope.core.derived.once`)
    unless ``cost`` is given.

    c is, in order: ``cost`` if given, measured against a usable baseline, the verify model for model-free
    methods, else the snapshot's estimate from parameters.
    """
    if cost is not None:
        return _estimate(snap, cost, batch_size)
    return derived.once(snap, ("estimate", batch_size), lambda: _estimate(snap, None, batch_size))


def _estimate(snap: Snapshot, cost: CostRatio | None, batch_size: int | None) -> SpeedupEstimate | None:
    spec = spec_counts(snap)
    batch = batch_size or snap.decode_batch
    k = snap.engine.k_at(batch) if batch else snap.engine.num_speculative_tokens
    if spec is None or spec.alpha is None:
        return None
    # Past the drafted positions acceptance is extended from the last one with α, as the run's own last position
    # bore the extension out (SpecCounts.alpha_past_drafted); the estimate shows the α observed.
    past = spec.alpha_past_drafted or spec.alpha
    if k == 0 and batch and snap.engine.num_speculative_tokens:
        return _k0_estimate(snap, cost, batch, spec.per_position, spec.alpha, past)
    if not k:
        return None
    measured = measured_cost(snap, batch) if cost is None and batch else None
    if cost is None and measured is None and snap.engine.method in MODEL_FREE_METHODS:
        cost = verify_cost(snap, batch or 1)
    cost = cost or _weight_floor(snap, measured) or snap.cost_ratio
    if cost is None:
        return None
    a = past
    rates = spec.per_position[:k]
    observed = _observed_tokens(snap, k)
    tokens = observed if observed is not None else acc.tokens_per_step(k, rates, a)
    rho, draft_prefill = prefill.prefill_per_decode(snap, batch, tokens), prefill.draft_prefill(snap)
    verify = _verify_part(snap, batch, measured)
    kept = kept_shares(snap, rates, a, tokens)

    def speedup_from_running_k(j: int, rates: tuple[float, ...], a: float, tokens: float, c: float,
                               fixed: float = uncertainty.DRAFT_FIXED) -> float:
        """End-to-end speedup at K = ``j`` > 0 for these inputs (:func:`decode_step`'s decode speedup, with the
        prefill the running K's steps carried)."""
        gained, step = decode_step(j, k, rates, a, tokens, c, verify, fixed, kept)
        return acc.end_to_end(gained / step, tokens / (k * c + 1.0), rho or 0.0, draft_prefill)

    by_k = (1.0, *(speedup_from_running_k(j, rates, a, tokens, cost.value) for j in range(1, acc.K_MAX + 1)))
    decode_now = tokens / (k * cost.value + 1.0)
    interval, basis, draws, requests = speedup_interval(snap, batch, k, cost.value, measured is not None,
                                                        (rates, a, tokens), speedup_from_running_k,
                                                        uncertainty.DRAFT_FIXED_RANGE)
    k0, k0_basis = k0_decode(snap, cost)
    return SpeedupEstimate(
        alpha=spec.alpha, k=k, c=cost.value, c_basis=_basis(cost, measured is not None),
        c_source=cost.source, tokens_per_step=tokens, tokens_observed=observed is not None,
        decode_speedup=decode_now, prefill_share=None if rho is None else rho / (1.0 + rho), by_k=by_k,
        batch_size=batch if measured is not None or observed is not None else None,
        k0_speedup=acc.end_to_end(k0, decode_now, rho or 0.0, draft_prefill), k0_basis=k0_basis,
        caveat=(LOSSY_CAVEAT if lossy_verification(snap.engine) else "") + _slow_baseline(snap, measured),
        interval=interval, interval_basis=basis, interval_requests=requests, draws=draws,
        decode_at=functools.partial(decode_step, k=k, rates=rates, a=a, tokens=tokens, c=cost.value, verify=verify,
                                    kept=kept),
    )


def _fraction(rates: tuple[float, ...], tokens: float) -> float:
    """The share of request-steps that drafted, so that the model reproduces the ``tokens`` observed at the running
    K (n-gram lookup finds no match for some)."""
    drafted = sum(rates)
    return min(1.0, max(0.0, (tokens - 1.0) / drafted)) if drafted > 0 else 1.0


def kept_shares(snap: Snapshot, rates: tuple[float, ...], a: float, tokens: float) -> tuple[float, ...]:
    """At K = 0 .. 16, the share of the tokens steps would gain that the window's finished requests keep, their
    last step dropping the drafts past their end (:func:`~specscope.core.acceptance.kept_share`); all 1.0 without
    finished requests. Computed once per snapshot and inputs (they do not depend on the batch size)."""
    def shares() -> tuple[float, ...]:
        remaining = [n - 1 for n in prefill.output_lengths(snap)]  # a request's first token comes from its prefill
        fraction = _fraction(rates, tokens)
        return tuple(acc.kept_share(j, rates, a, remaining, fraction) for j in range(acc.K_MAX + 1))

    return derived.once(snap, ("kept_shares", rates, a, tokens), shares)


def decode_step(j: int, k: int, rates: tuple[float, ...], a: float, tokens: float, c: float, verify: float,
                fixed: float = uncertainty.DRAFT_FIXED, kept: tuple[float, ...] = ()) -> tuple[float, float]:
    """At K = ``j`` > 0, from what the running K = ``k`` observed (``tokens`` a request gained a step, the positions'
    ``rates``, α ``a``): the tokens a request gains per decode step and the step's cost in plain steps. A draft
    token's c is verifying it (``verify``, which every K pays by the token) and the draft's part, c − verify;
    ``fixed`` is the share of the running K's draft part, k·(c − verify), that a step pays whatever its K (see
    :func:`~specscope.verdict.interval.speedup_interval`), so a step at j costs 1 + j·c + fixed·(c − verify)·(k − j).
    ``kept`` (:func:`kept_shares`): the share of its gain each K's steps keep at the requests' ends, which the
    tokens observed at k already hold.
    """
    if j == k:
        return tokens, k * c + 1.0
    gained = acc.tokens_per_step(j, rates, a, _fraction(rates, tokens))
    if kept and kept[k] > 0:
        gained *= kept[j] / kept[k]
    return gained, j * c + 1.0 + fixed * max(0.0, c - verify) * (k - j)


def _verify_part(snap: Snapshot, batch: int | None, measured: CostRatio | None) -> float:
    """The share of a measured c that verifying the draft token costs at ``batch`` (never over c):
    :func:`~specscope.verdict.cost.verify_forward_share` of the baseline it was measured against. 0 where c was
    not measured (the configs' estimate prices the draft alone) or the baseline's forward was not fitted: all of c
    is then the draft's."""
    base = usable_baseline(snap)
    if measured is None or not batch or base is None:
        return 0.0
    share = verify_forward_share(base, batch)
    return 0.0 if share is None else min(share, measured.value)


def _k0_estimate(snap: Snapshot, cost: CostRatio | None, batch: int, per_position: tuple[float, ...],
                 observed_alpha: float, a: float) -> SpeedupEstimate | None:
    """The estimate at a batch size the schedule gives K = 0, on an engine that drafts at others.

    Its steps are measured steps of the draft's pass alone (of nothing for n-gram and suffix lookup): the K = 0
    range's speed is measured there, c0 its steps' cost beyond a plain step, and each K > 0 is priced as at any
    batch size, from the acceptance measured where the engine drafted (it depends on the draft and the text, not
    the batch) and c = c0 plus verifying one more token a request (:func:`~specscope.verdict.cost.k0_cost`).
    Without a baseline, c and the K = 0 range are estimated as elsewhere (:func:`k0_decode`). ``a`` extends the
    acceptance past the drafted positions; ``observed_alpha`` is shown.
    """
    measured = k0_cost(snap, batch) if cost is None else None
    if measured is not None:
        c0, c = measured
        model_free = snap.engine.method in MODEL_FREE_METHODS
        k0_basis = (f"measured: {'no model runs, the speculative path' if model_free else 'the draft pass'} alone "
                    f"costs c {c0:.2f}")
    else:
        if cost is None and snap.engine.method in MODEL_FREE_METHODS:
            cost = verify_cost(snap, batch)
        given = cost or snap.cost_ratio
        if given is None:
            return None
        c = given
        price, k0_basis = k0_decode(snap, c)
        c0 = 1.0 / price - 1.0
    verify = c.value - c0
    k_ref, observed = _reference(snap)
    rates = per_position[:k_ref]
    tokens = observed if observed is not None else acc.tokens_per_step(k_ref, rates, a)
    rho, draft_prefill = prefill.prefill_per_decode(snap, batch, 1.0), prefill.draft_prefill(snap)
    kept = kept_shares(snap, rates, a, tokens)

    def speedup_from_draft_pass(j: int, rates: tuple[float, ...], a: float, tokens: float, c0: float,
                                fixed: float = uncertainty.FIXED) -> float:
        """End-to-end speedup at K = ``j`` for these inputs (``tokens``: observed at ``k_ref``; 0: the range as it
        runs, with speculation configured). ``fixed``: the share of c0 a step pays whatever its K (see
        :func:`~specscope.verdict.interval.speedup_interval`), paid once, not at each of the j draft passes:
        1 + j·(c0 + verify) − (j − 1)·fixed·c0."""
        now = 1.0 / (1.0 + c0)
        if j == 0:
            return acc.end_to_end(now, now, rho or 0.0, draft_prefill)
        gained = acc.tokens_per_step(j, rates, a, _fraction(rates, tokens)) * kept[j] / (kept[k_ref] or 1.0)
        decode = gained / (j * (c0 + verify) + 1.0 - (j - 1) * fixed * c0)
        return acc.end_to_end(decode, now, rho or 0.0, draft_prefill)

    point = (rates, a, tokens)
    interval, basis, draws, requests = speedup_interval(snap, batch, 0, c0, measured is not None, point,
                                                        speedup_from_draft_pass, uncertainty.FIXED_RANGE)
    live = steps_at(snap, batch) is not None
    return SpeedupEstimate(
        alpha=observed_alpha, k=0, c=c.value, c_basis=_basis(c, measured is not None), c_source=c.source,
        tokens_per_step=1.0,
        tokens_observed=live, decode_speedup=1.0 / (1.0 + c0),
        prefill_share=None if rho is None else rho / (1.0 + rho),
        by_k=(1.0, *(speedup_from_draft_pass(j, *point, c0) for j in range(1, acc.K_MAX + 1))),
        batch_size=batch if measured is not None or live else None,
        k0_speedup=speedup_from_draft_pass(0, *point, c0), k0_basis=k0_basis,
        caveat=LOSSY_CAVEAT if lossy_verification(snap.engine) else "",
        interval=interval, interval_basis=basis, interval_requests=requests, draws=draws,
    )


def _reference(snap: Snapshot) -> tuple[int, float | None]:
    """The K > 0 this engine ran the most request-steps at (the window's, else the lifetime's) and the tokens a
    request gained per step there (:func:`_observed_tokens`): what a K = 0 batch size's prices start from.
    Without timed steps at a K > 0, ``num_speculative_tokens`` and None."""
    for interval in (snap.window, snap.lifetime):
        steps: dict[int, int] = {}
        for t in interval.step_times.times:
            k = snap.engine.k_at(t.batch_size)
            if k:
                steps[k] = steps.get(k, 0) + t.steps * t.batch_size
        if steps:
            k = max(steps, key=lambda j: (steps[j], j))
            return k, _observed_tokens(snap, k)
    return snap.engine.num_speculative_tokens or 1, None


def _weight_floor(snap: Snapshot, measured: CostRatio | None) -> CostRatio | None:
    """``measured`` raised to :func:`~specscope.verdict.cost.weight_share` where a draft model's measured c is under
    it (:func:`~specscope.verdict.cost.at_least_share`). A c under it says the baseline was timed while the machine ran
    slower (:func:`_slow_baseline` says so); priced at it, a same-size draft is not called paying on a slow baseline."""
    if measured is None or measured.anchored:
        return measured
    value, floor = at_least_share(snap, measured.value)
    return replace(measured, value=value, source=f"{measured.source}; {floor}") if floor else measured


def _slow_baseline(snap: Snapshot, measured: CostRatio | None) -> str:
    """Why a measured c is suspect: under the draft's parameter share, which per-step overhead and verifying K+1
    tokens only add to, a baseline timed while the machine ran slower (under load, or another day) puts it; ""
    otherwise."""
    sizes = snap.cost_ratio
    if measured is None or measured.anchored or sizes is None or sizes.draft_params is None or \
            snap.engine.method in MODEL_FREE_METHODS:
        return ""
    if measured.value >= 0.8 * sizes.value:
        return ""
    return (f"; c measured ({measured.value:.2f}) is under the draft's parameter share ({sizes.value:.2f}): the "
            "baseline was likely timed while the machine ran slower; recalibrate (`specscope calibrate`) as it runs "
            "now")


def k0_decode(snap: Snapshot, cost: CostRatio) -> tuple[float, str]:
    """Decode speedup of a K = 0 range in vLLM's schedule, and how it was priced.

    vLLM's proposers for draft models, EAGLE and MTP run their first forward pass before they look at K, so that
    the drafter's KV cache holds every token the target accepted: at K = 0 a step still costs one draft pass. A
    measured c is that pass plus the target verifying one more token a request; the pass, c0, is c less what
    verifying a token costs (:func:`~specscope.verdict.cost.verify_share`, the inverse of
    :func:`~specscope.verdict.cost.k0_cost`, so that a K = 0 range followed prices K > 0 back at the c it was priced
    from), at least the draft's weight share. It is taken at the smallest batch size measured, where verification
    is the smallest part of c (a draft pass grows with the batch as a target step does; verification grows faster);
    without a measured c, the estimate's c (an upper bound). n-gram and suffix lookup run no model at K = 0: no cost
    is modelled (vLLM's speculative path still costs a few percent: ``benchmarks/results/k0.json``).
    """
    if snap.engine.method in MODEL_FREE_METHODS:
        return 1.0, "n-gram and suffix lookup run no model at K=0"
    base = usable_baseline(snap)
    for t in snap.lifetime.step_times.times:
        if t.steps < MIN_STEPS or base is None or (c := measured_cost(snap, t.batch_size)) is None:
            continue
        verify = verify_share(base, t.batch_size, live_context(snap, t.batch_size))
        c0, floor = at_least_share(snap, max(0.0, c.value - (verify or 0.0)))
        less = f" less {verify:.2f} for verifying the token" if verify else ""
        return 1.0 / (1.0 + c0), (f"the draft still runs a pass a step: {c0:.2f}, c {c.value:.2f} measured at batch "
                                  f"{t.batch_size}{less}" + (f" ({floor})" if floor else ""))
    return 1.0 / (1.0 + cost.value), f"the draft still runs a pass a step: at most c {cost.value:.2f}"


def class_speedup(snap: Snapshot, cls: TrafficClass, est: SpeedupEstimate | None = None) -> float | None:
    """Expected end-to-end speedup for traffic of class ``cls`` at the operating batch: the engine's estimate
    (``est``, default :func:`estimate`) with the class's own tokens per speculative step in place of the
    engine's; None without the estimate or the class's window steps."""
    est = est or estimate(snap)
    length = cls.window.mean_acceptance_length
    if est is None or length is None:
        return None
    if est.k == 0:  # a K = 0 range drafts for no class: each runs at the range's speed
        return est.expected_speedup
    share = est.prefill_share or 0.0
    rho = share / (1.0 - share) if share < 1.0 else 0.0
    decode = length / (est.k * est.c + 1.0)
    return acc.end_to_end(decode, est.decode_speedup, rho, prefill.draft_prefill(snap))


def by_batch_size(snap: Snapshot) -> list[SpeedupEstimate]:
    """The measured estimate at every batch size this engine has run for long enough (needs a usable baseline)."""
    out = []
    for t in snap.lifetime.step_times.times:
        if t.steps < MIN_TABLE_STEPS:
            continue
        est = estimate(snap, batch_size=t.batch_size)
        if est is not None and est.measured:
            out.append(est)
    return out

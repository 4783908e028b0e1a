"""The expected speedup at a batch size and K: the verdict's model (see the package docstring)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specscope.core import acceptance as acc
from specscope.core.model import (
    CostRatio,
    Snapshot,
    TrafficClass,
)
from specscope.core.sizing import MODEL_FREE_METHODS
from specscope.verdict import uncertainty
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
    """Expected speedup over no speculation at one batch size, at the running K and at every K in 0..16."""

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

    def explain(self) -> str:
        """One paragraph a person can act on."""
        if self.k == 0:
            return self._explain_k0()
        iv = self.interval
        verdict = ("pays" if self.pays else "does NOT pay" if self.surely_loses
                   else "may not pay (its interval reaches 1.0x)")
        at = f" and batch {self.batch_size}" if self.batch_size else ""
        tokens = f"{self.tokens_per_step:.2f} tokens/step {'observed' if self.tokens_observed else 'modelled'}"
        share = self.prefill_share
        prefill = (", prefill not timed at this batch size: decode only" if share is None
                   else f", prefill {share:.0%} of engine time" if share >= 0.005 else "")
        advised = self.advised_k
        if advised == 0:
            advice = (f"turn speculation off (remove speculative_config, a restart): no K makes it pay here, and "
                      f"K=0 in vLLM's schedule would run at {self.k0_speedup:.2f}x ({self.k0_basis})")
        elif advised == self.k:
            advice = (f"K={self.k} is already the best" if self.best_k == self.k else
                      f"keep K={self.k}: K={self.best_k}'s {self.best_speedup:.2f}x is within the noise")
        else:
            advice = f"K={advised} would give {self.by_k[advised]:.2f}x"
        near = self.near_best
        if near and near[0] != near[1] and advised:
            advice += f"; K={near[0]}-{near[1]} are within the noise of the best"
        sure = f" ({iv[0]:.2f}-{iv[1]:.2f}x, {self.interval_basis})" if iv else " (no interval: too few requests)"
        return (f"speculation {verdict}: expected speedup {self.expected_speedup:.2f}x{sure} at K={self.k}{at} "
                f"(decode {self.decode_speedup:.2f}x{prefill}; {tokens}; alpha {self.alpha:.2f}; "
                f"c {self.c:.2f}, {self.c_source}); {advice}{self.caveat}")

    def _explain_k0(self) -> str:
        """:meth:`explain` at a batch size the schedule gives K = 0: the range's own speed, then K > 0's prices."""
        iv = self.interval
        verdict = ("pays" if self.pays else "does NOT pay" if self.surely_loses
                   else "may not pay (its interval reaches 1.0x)")
        at = f" at batch {self.batch_size}" if self.batch_size else ""
        share = self.prefill_share
        prefill = (", prefill not timed at this batch size" if share is None
                   else f", prefill {share:.0%} of engine time" if share >= 0.005 else "")
        sure = f" ({iv[0]:.2f}-{iv[1]:.2f}x, {self.interval_basis})" if iv else " (no interval: too few requests)"
        scheduled, advised = self.scheduled_k, self.advised_k
        if advised == 0 and self.best_k == 0:
            advice = ("no K pays here: speculation removed (remove speculative_config, a restart) runs 1.00x; "
                      "remove it if the engine runs at this batch size most")
            if scheduled:
                advice += f"; with speculation configured, K={scheduled} ({self.by_k[scheduled]:.2f}x) beats K=0"
        elif advised == 0:
            advice = f"keep K=0: K={self.best_k}'s {self.best_speedup:.2f}x is within the noise"
        else:
            advice = f"K={advised} would give {self.by_k[advised]:.2f}x"
        return (f"speculation {verdict}: the schedule's K=0 range{at} runs {self.expected_speedup:.2f}x{sure}; "
                f"{self.k0_basis}{prefill}; K>0 priced from the acceptance where the engine drafts (alpha "
                f"{self.alpha:.2f}) and c {self.c:.2f}, {self.c_source}; {advice}{self.caveat}")


def _observed_tokens(snap: Snapshot, k: int) -> float | None:
    """Tokens a request gained per decode step, pooled over the batch sizes that ran ``k`` (acceptance depends on
    the draft and the text, not on the batch): the window's, else the lifetime's."""
    for interval in (snap.window, snap.lifetime):
        times = [t for t in interval.step_times.times if t.steps and snap.engine.k_at(t.batch_size) == k]
        request_steps = sum(t.steps * t.batch_size for t in times)
        if request_steps >= MIN_STEPS and all(t.tokens for t in times):
            return sum(t.tokens for t in times) / request_steps
    return None


def _prefill_per_decode(snap: Snapshot, batch: int | None, tokens: float) -> float | None:
    """ρ at ``batch``: a request's prefill seconds (which speculation leaves as they are) over its decode seconds
    there (which it shortens).

    A request's prefill is what the steps carrying prefill took beyond the decoding they did too (a request joining a
    running batch), over the requests whose prefill they finished (first tokens), at every batch size: a batch's
    first prompts, and a long prompt's chunks, run at batch sizes of their own. Its decode is its output tokens but
    the first (finished requests' mean, else the tokens generated per prefill finished) at ``batch`` requests a step,
    each gaining ``tokens``, at that batch size's step time. From the window's steps, else the lifetime's where the
    window finished no prefill; None (unknown, not 0) without prefill or steps at ``batch``.
    """
    st = steps_at(snap, batch) if batch and tokens > 0 else None
    if st is None:
        return None
    times = snap.window.step_times
    if not any(t.first_tokens for t in times.times):
        times = snap.lifetime.step_times
    started = sum(t.first_tokens for t in times.times)
    length = _output_length(snap) or (sum(t.tokens + t.prefill_tokens for t in times.times) / started
                                      if started else None)
    if length is None:
        return None
    prefill_s, requests = 0.0, 0
    for t in times.times:
        if not t.prefill_steps:
            continue
        step = t.mean_s if t.steps else times.at(t.batch_size, MIN_STEPS) or st.mean_s
        decoded = max(0, t.prefill_tokens - t.first_tokens) / (t.batch_size * tokens)
        prefill_s += max(0.0, t.prefill_s - decoded * step)
        requests += t.first_tokens
    decode_s = max(0.0, length - 1.0) / (st.batch_size * tokens) * st.mean_s
    return prefill_s / requests / decode_s if requests and decode_s > 0 else None


def _output_length(snap: Snapshot) -> float | None:
    """Output tokens of a finished request: the window's mean, else every kept request's; None without one.
    Computed once per snapshot (a schedule prices every batch size up to max_num_seqs)."""
    key = ("output_length",)
    if key not in snap.derived:
        done = [r for r in snap.requests if r.generation_tokens]
        recent = [r for r in done if r.finished_at >= snap.time - snap.window_seconds]
        chosen = [r.generation_tokens or 0 for r in recent or done]
        snap.derived[key] = sum(chosen) / len(chosen) if chosen else None
    return snap.derived[key]


def _draft_prefill(snap: Snapshot) -> float:
    """The draft's prefill cost per token relative to the target's: it prefills every prompt too (a plain engine
    does not). Its parameters per token against the target's; 0 for model-free methods or unknown sizes."""
    sizes = snap.cost_ratio
    if sizes is None or snap.engine.method in MODEL_FREE_METHODS or sizes.draft_params is None:
        return 0.0
    return sizes.value


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
    inputs. Computed once per snapshot and batch size (kept in ``snap.derived``) unless ``cost`` is given.

    c is, in order: ``cost`` if given, measured against a usable baseline, the verify model for model-free
    methods, else the snapshot's estimate from parameters.
    """
    if cost is not None:
        return _estimate(snap, cost, batch_size)
    key = ("estimate", batch_size)
    if key not in snap.derived:
        snap.derived[key] = _estimate(snap, None, batch_size)
    return snap.derived[key]


def _estimate(snap: Snapshot, cost: CostRatio | None, batch_size: int | None) -> SpeedupEstimate | None:
    spec = spec_counts(snap)
    batch = batch_size or snap.decode_batch
    k = snap.engine.k_at(batch) if batch else snap.engine.num_speculative_tokens
    if spec is None or spec.alpha is None:
        return None
    if k == 0 and batch and snap.engine.num_speculative_tokens:
        return _k0_estimate(snap, cost, batch, spec.per_position, spec.alpha)
    if not k:
        return None
    measured = measured_cost(snap, batch) if cost is None and batch else None
    if cost is None and measured is None and snap.engine.method in MODEL_FREE_METHODS:
        cost = verify_cost(snap, batch or 1)
    cost = cost or _weight_floor(snap, measured) or snap.cost_ratio
    if cost is None:
        return None
    a = spec.alpha
    rates = spec.per_position[:k]
    observed = _observed_tokens(snap, k)
    tokens = observed if observed is not None else acc.tokens_per_step(k, rates, a)
    rho, draft_prefill = _prefill_per_decode(snap, batch, tokens), _draft_prefill(snap)
    verify = _verify_part(snap, batch, measured)

    def speedup_at(j: int, rates: tuple[float, ...], a: float, tokens: float, c: float,
                   fixed: float = uncertainty.DRAFT_FIXED) -> float:
        """End-to-end speedup at K = ``j`` > 0 for these inputs (``tokens``: observed at the running K). A draft
        token's c is verifying it (``verify``, which every K pays by the token) and the draft's part, c − verify;
        ``fixed`` is the share of the running K's draft part, k·(c − verify), that a step pays whatever its K (see
        :func:`_interval`), so a step at j costs 1 + j·c + fixed·(c − verify)·(k − j)."""
        now = tokens / (k * c + 1.0)
        if j == k:
            return acc.end_to_end(now, now, rho or 0.0, draft_prefill)
        # The share of request-steps that drafted, so that the model reproduces what was observed at the running K.
        drafted = sum(rates)
        fraction = min(1.0, max(0.0, (tokens - 1.0) / drafted)) if drafted > 0 else 1.0
        step = j * c + 1.0 + fixed * max(0.0, c - verify) * (k - j)
        decode = acc.tokens_per_step(j, rates, a, fraction) / step
        return acc.end_to_end(decode, now, rho or 0.0, draft_prefill)

    by_k = (1.0, *(speedup_at(j, rates, a, tokens, cost.value) for j in range(1, acc.K_MAX + 1)))
    decode_now = tokens / (k * cost.value + 1.0)
    interval, basis, draws, requests = _interval(snap, batch, k, cost.value, measured is not None,
                                                 (rates, a, tokens), speedup_at, uncertainty.DRAFT_FIXED_RANGE)
    k0, k0_basis = k0_decode(snap, cost)
    return SpeedupEstimate(
        alpha=a, k=k, c=cost.value, c_basis=_basis(cost, measured is not None),
        c_source=cost.source, tokens_per_step=tokens, tokens_observed=observed is not None,
        decode_speedup=decode_now, prefill_share=None if rho is None else rho / (1.0 + rho), by_k=by_k,
        batch_size=batch if measured is not None or observed is not None else None,
        k0_speedup=acc.end_to_end(k0, decode_now, rho or 0.0, draft_prefill), k0_basis=k0_basis,
        caveat=(LOSSY_CAVEAT if snap.engine.lossy_verification else "") + _slow_baseline(snap, measured),
        interval=interval, interval_basis=basis, interval_requests=requests, draws=draws,
    )


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
                 a: float) -> SpeedupEstimate | None:
    """The estimate at a batch size the schedule gives K = 0, on an engine that drafts at others.

    Its steps are measured steps of the draft's pass alone (of nothing for n-gram and suffix lookup): the K = 0
    range's speed is measured there, c0 its steps' cost beyond a plain step, and each K > 0 is priced as at any
    batch size, from the acceptance measured where the engine drafted (it depends on the draft and the text, not
    the batch) and c = c0 plus verifying one more token a request (:func:`~specscope.verdict.cost.k0_cost`).
    Without a baseline, c and the K = 0 range are estimated as elsewhere (:func:`k0_decode`).
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
    rho, draft_prefill = _prefill_per_decode(snap, batch, 1.0), _draft_prefill(snap)

    def speedup_at(j: int, rates: tuple[float, ...], a: float, tokens: float, c0: float,
                   fixed: float = uncertainty.FIXED) -> float:
        """End-to-end speedup at K = ``j`` for these inputs (``tokens``: observed at ``k_ref``; 0: the range as it
        runs, with speculation configured). ``fixed``: the share of c0 a step pays whatever its K (see
        :func:`_interval`), paid once, not at each of the j draft passes: 1 + j·(c0 + verify) − (j − 1)·fixed·c0."""
        now = 1.0 / (1.0 + c0)
        if j == 0:
            return acc.end_to_end(now, now, rho or 0.0, draft_prefill)
        drafted = sum(rates)
        fraction = min(1.0, max(0.0, (tokens - 1.0) / drafted)) if drafted > 0 else 1.0
        decode = acc.tokens_per_step(j, rates, a, fraction) / (j * (c0 + verify) + 1.0 - (j - 1) * fixed * c0)
        return acc.end_to_end(decode, now, rho or 0.0, draft_prefill)

    point = (rates, a, tokens)
    interval, basis, draws, requests = _interval(snap, batch, 0, c0, measured is not None, point, speedup_at,
                                                 uncertainty.FIXED_RANGE)
    live = steps_at(snap, batch) is not None
    return SpeedupEstimate(
        alpha=a, k=0, c=c.value, c_basis=_basis(c, measured is not None), c_source=c.source, tokens_per_step=1.0,
        tokens_observed=live, decode_speedup=1.0 / (1.0 + c0),
        prefill_share=None if rho is None else rho / (1.0 + rho),
        by_k=(1.0, *(speedup_at(j, *point, c0) for j in range(1, acc.K_MAX + 1))),
        batch_size=batch if measured is not None or live else None,
        k0_speedup=speedup_at(0, *point, c0), k0_basis=k0_basis,
        caveat=LOSSY_CAVEAT if snap.engine.lossy_verification else "",
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


def _interval(snap: Snapshot, batch: int | None, k: int, c: float, measured: bool,
              point: tuple[tuple[float, ...], float, float],
              speedup_at: Callable[[int, tuple[float, ...], float, float, float, float], float],
              fixed: tuple[float, float],
              ) -> tuple[tuple[float, float] | None, str, Callable[[int], tuple[float, ...]] | None, int]:
    """``(interval at the running K, basis, the speedup at a K in each draw, requests resampled)``: ``speedup_at``
    over the requests' resampled acceptance and, where c is measured, a plain step time drawn from the baseline's
    spread between its rounds (through c) and the machine's drift between moments (a factor on every K's speedup:
    it moves the steps a restart runs, at whatever K). With too few requests to resample (a window at a large batch
    size may finish two), a measured c still draws its step times, with acceptance as observed over the window's
    steps: the step times' unsureness is said, and a point just under 1.0x is not called a loss on it. None with
    neither.

    At a K other than the running one, the model's own unknown is drawn too: a speculative step pays part of its
    cost whatever its K (vLLM's speculative path: sampling, bookkeeping, the proposer's set-up), and one K's step
    time cannot tell that part from the cost per draft token. Each draw takes a share of the draft's cost in the
    range ``fixed`` (:func:`uncertainty.fixed_shares`), which lowers K below the running one and raises K above it;
    the point takes the middle (:data:`uncertainty.DRAFT_FIXED`, at a K = 0 range :data:`uncertainty.FIXED`). Each
    K's interval holds its point."""
    res = uncertainty.resample(snap)
    resampled = res.requests if res is not None and res.draws else 0
    base = usable_baseline(snap)
    rows = [t for t in base.times if t.steps >= MIN_STEPS] if base is not None and measured and batch else []
    spread = min(rows, key=lambda t: abs(t.batch_size - (batch or 1))).spread if rows else 0.0
    # The baseline was timed at another moment, and a restart will run at another again: the machine's speed moves
    # between moments, the plain step's since the baseline and the speculative step's since this window, each by
    # what the run measured it move, the live steps' spread from second to second or the baseline's from round to
    # round (the larger); by the drift assumed (measured on CPU machines) only where the run measured neither.
    live = steps_at(snap, batch) if rows and batch else None
    seconds = live.spread if live is not None else 0.0
    moved = max(seconds, spread)
    drift = ((moved, moved) if moved else (uncertainty.SPEC_DRIFT, uncertainty.PLAIN_DRIFT)) if rows else (0.0, 0.0)

    def why(d: float) -> str:
        return ("as the live steps move from second to second" if seconds >= d else
                "as the baseline's rounds moved" if spread >= d else "the least assumed (no spread measured)")

    spec_why, plain_why = why(drift[0]), why(drift[1])
    each = (f"{drift[0]:.0%}, {spec_why}" if drift[0] == drift[1] else
            f"speculative {drift[0]:.1%}, plain {drift[1]:.1%}, {spec_why}" if spec_why == plain_why else
            f"speculative {drift[0]:.1%} ({spec_why}), plain {drift[1]:.1%} ({plain_why})")
    rounds, apart = spread, (drift[0] * drift[0] + drift[1] * drift[1]) ** 0.5
    spread = (rounds * rounds + apart * apart) ** 0.5
    if not resampled and not spread:
        return None, "", None, 0
    accepted = res.draws if res is not None and resampled else (uncertainty.AS_OBSERVED,) * uncertainty.DRAWS
    rates, a, tokens = point
    n = max(k, 1)  # draft tokens a step pays c for (at a K = 0 range, c is its steps' cost c0: one a step)
    draws = [(tuple(r * (d.rates[i] if i < len(d.rates) else 1.0) for i, r in enumerate(rates)),
              min(0.999, a * d.alpha), 1.0 + (tokens - 1.0) * d.gained,
              max(0.0, ((1.0 + n * c) / m - 1.0) / n) if rounds else c, f)
             for d, m, f in zip(accepted, uncertainty.noise(len(accepted), rounds),
                                uncertainty.fixed_shares(len(accepted), fixed), strict=True)]
    drifted = uncertainty.noise(len(draws), apart, seed=3)

    @functools.cache
    def at(j: int) -> tuple[float, ...]:
        return tuple(speedup_at(j, *x) * g for x, g in zip(draws, drifted, strict=True))

    steps = (f"a {spread:.0%} spread of the step times' ratio (the baseline's rounds, and each step time's drift "
             f"between moments: {each})") if spread else ""
    if resampled:
        basis = f"{uncertainty.COVERAGE:.0%} interval over {resampled} requests" + (f" and {steps}" if steps else "")
    else:
        basis = f"{uncertainty.COVERAGE:.0%} interval over {steps}" + (
            f"; acceptance as observed (too few requests to resample, {uncertainty.MIN_REQUESTS} needed)" if k else "")
    return uncertainty.quantiles(at(k)), basis, at, resampled


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
    return acc.end_to_end(decode, est.decode_speedup, rho, _draft_prefill(snap))


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


def by_batch_line(estimates: list[SpeedupEstimate]) -> str | None:
    """"by batch size 1: 1.14x  8: 0.92x; pays at batch 1, not at 8" for a report; None without estimates."""
    if not estimates:
        return None
    cells = "  ".join(f"{e.batch_size}: {e.expected_speedup:.2f}x" for e in estimates)
    paying = ", ".join(str(e.batch_size) for e in estimates if e.pays)
    losing = ", ".join(str(e.batch_size) for e in estimates if not e.pays)
    if not losing:
        verdict = "pays at every batch size measured"
    elif not paying:
        verdict = "pays at no batch size measured"
    else:
        verdict = f"pays at batch {paying}, not at {losing}"
    return f"by batch size {cells}; {verdict}"

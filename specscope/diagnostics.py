"""Does speculation pay, and at which K? The expected speedup by batch size, from what the engine measured.

At the running K and batch size b the decode speedup is observed, not modelled: tokens a request gains per decode
step (measured) × the step time without speculation / the step time with it. The second comes from the live
engine; the first from a **baseline**, the same target's decode-step times without speculation (``specscope
calibrate``). Their ratio also gives the effective draft cost per draft token, c(b) = (T_spec/T_plain − 1)/K:
everything a speculative step costs beyond a plain one (K draft passes, verifying K+1 tokens per request,
rejection sampling). For other K, tokens per step follow the observed per-position acceptance, extended with the
maximum-likelihood α (Leviathan et al. 2023), and cost 1 + K·c(b).

Prefill is not sped up, and a draft prefills every prompt too: when the engine spends time on prefill (ρ seconds
per second of decode; the steps that carry prefill, less the decode work they also do), the end-to-end speedup of
the workload is (ρ/(1 + c_p) + s)/(ρ + s/s_K), where s is the decode speedup at the running K and c_p the draft's
prefill cost per token relative to the target's (its parameters per token; 0 for n-gram and suffix lookup).

Without a baseline c is estimated: from the two models' per-token parameters (decoding is memory-bound on GPUs),
or, for n-gram and suffix lookup (no model), from a linear fit of the live step times over batch sizes (a
verification of K+1 tokens per request), or an assumed 0.02 per draft token when there is only one batch size.
Each estimate says which.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specscope import acceptance as acc
from specscope import intervals
from specscope.model import (
    SCHEDULABLE_METHODS,
    CostRatio,
    EngineSetup,
    Snapshot,
    StepProfile,
    StepTime,
    TrafficClass,
)
from specscope.sizing import MODEL_FREE_METHODS, ModelSize

#: Decode steps a batch size needs before its mean step time is used.
MIN_STEPS = 3
#: Decode steps a batch size needs to get a row of its own in the by-batch verdict and the K table (batch sizes
#: an engine passes through briefly, as a batch drains, are too noisy to advise on).
MIN_TABLE_STEPS = 20
#: Said of every estimate on an engine whose verification is lossy.
LOSSY_CAVEAT = ("; acceptance counts loose accepts (rejection_sample_method fly): not comparable with exact "
                "verification, and the speedup is that of the lossy method")
#: c assumed for a model-free method when the live step times cannot be fitted (one batch size so far).
ASSUMED_VERIFY_COST = 0.02


@dataclass(frozen=True)
class SpeedupEstimate:
    """Expected speedup over no speculation at one batch size, at the running K and at every K in 0..16."""

    alpha: float
    k: int
    cost_ratio: float
    #: "measured", "parameter counts", "verify model" or "assumed"
    cost_basis: str
    cost_ratio_source: str
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
    #: target (:func:`k0_decode`). Only removing ``speculative_config`` (a restart) gives ``by_k[0]``.
    k0_speedup: float = 1.0
    k0_basis: str = ""
    #: What the estimate cannot account for, for people ("" when nothing).
    caveat: str = ""

    @property
    def expected_speedup(self) -> float:
        """End-to-end speedup at the running K."""
        return self.by_k[self.k] if self.k < len(self.by_k) else self.decode_speedup

    @property
    def best_k(self) -> int:
        """The K that maximises the speedup; 0 means speculation should be turned off."""
        return acc.best_k(self.by_k)[0]

    @property
    def best_speedup(self) -> float:
        """The speedup at :attr:`best_k` (1.0 when that is 0)."""
        return acc.best_k(self.by_k)[1]

    @property
    def scheduled_k(self) -> int:
        """The K to put in vLLM's schedule at this batch size, a K = 0 range priced at :attr:`k0_speedup`."""
        return acc.best_k((self.k0_speedup, *self.by_k[1:]))[0]

    @property
    def scheduled_speedup(self) -> float:
        """The speedup at :attr:`scheduled_k` with speculation configured."""
        return acc.best_k((self.k0_speedup, *self.by_k[1:]))[1]

    @property
    def pays(self) -> bool:
        """True when speculation at the running K is expected to be faster than plain decoding."""
        return self.expected_speedup >= 1.0

    @property
    def measured(self) -> bool:
        """True when c comes from live step times against a baseline."""
        return self.cost_basis == "measured"

    def explain(self) -> str:
        """One paragraph a person can act on."""
        verdict = "pays" if self.pays else "does NOT pay"
        at = f" and batch {self.batch_size}" if self.batch_size else ""
        tokens = f"{self.tokens_per_step:.2f} tokens/step {'observed' if self.tokens_observed else 'modelled'}"
        share = self.prefill_share
        prefill = (", prefill not timed at this batch size: decode only" if share is None
                   else f", prefill {share:.0%} of engine time" if share >= 0.005 else "")
        if self.best_k == 0:
            advice = (f"turn speculation off (remove speculative_config, a restart): no K makes it pay here, and "
                      f"K=0 in vLLM's schedule would run at {self.k0_speedup:.2f}x ({self.k0_basis})")
        elif self.best_k == self.k:
            advice = f"K={self.k} is already the best"
        else:
            advice = f"K={self.best_k} would give {self.best_speedup:.2f}x"
        return (f"speculation {verdict}: expected speedup {self.expected_speedup:.2f}x at K={self.k}{at} "
                f"(decode {self.decode_speedup:.2f}x{prefill}; {tokens}; alpha {self.alpha:.2f}; "
                f"c {self.cost_ratio:.2f}, {self.cost_ratio_source}); {advice}{self.caveat}")


def cost_ratio_from_sizes(target: ModelSize | None, draft: ModelSize | None, method: str | None) -> CostRatio | None:
    """c from per-token parameters of the loaded configs; None for model-free methods or unknown sizes."""
    if method in MODEL_FREE_METHODS or target is None or draft is None or not target.per_token:
        return None
    return CostRatio(draft.per_token / target.per_token,
                     f"estimated from parameters per token ({draft.per_token:,} draft / {target.per_token:,} target)",
                     target.weights, draft.weights)


def _spec(snap: Snapshot) -> Any:
    """The window's speculative counts, or the lifetime's while the window has no drafts."""
    return snap.window.spec if snap.window.spec and snap.window.spec.drafts else snap.lifetime.spec


def _step(snap: Snapshot, batch: int) -> StepTime | None:
    """This engine's steps at ``batch``: the window's when it has enough, else the lifetime's."""
    return snap.window.step_times.get(batch, MIN_STEPS) or snap.lifetime.step_times.get(batch, MIN_STEPS)


def _spec_step_time(snap: Snapshot, batch: int) -> float | None:
    st = _step(snap, batch)
    if st is not None:
        return st.mean_s
    return snap.window.step_times.at(batch, MIN_STEPS) or snap.lifetime.step_times.at(batch, MIN_STEPS)


def baseline_problem(baseline: StepProfile, setup: EngineSetup | None) -> str | None:
    """Why ``baseline`` cannot be used for an engine of ``setup``; None when it can (or either is unknown)."""
    if baseline.setup is None or setup is None:
        return None
    diff = baseline.setup.differences(setup)
    return f"{baseline.source} was measured on another setup ({'; '.join(diff)})" if diff else None


def with_baseline(snap: Snapshot, baseline: StepProfile) -> Snapshot:
    """``snap`` with ``baseline`` in place of its own (refused, with the reason, when the setups differ)."""
    return replace(snap, baseline=baseline, baseline_problem=baseline_problem(baseline, snap.engine.setup))


def usable_baseline(snap: Snapshot) -> StepProfile | None:
    """The baseline, unless it was measured on another setup."""
    return snap.baseline if snap.baseline is not None and snap.baseline_problem is None else None


def measured_cost(snap: Snapshot, batch_size: int) -> CostRatio | None:
    """c at ``batch_size`` from live step times against the baseline; None without both, or where a speculative
    step measures faster than the baseline's plain one."""
    k = snap.engine.k_at(batch_size)
    base = usable_baseline(snap)
    if base is None or not k:
        return None
    t_spec, t_plain = _spec_step_time(snap, batch_size), base.at(batch_size, MIN_STEPS)
    if t_spec is None or not t_plain or t_spec < t_plain:
        # A speculative step verifies K+1 tokens a request: faster than a plain step, it says the baseline is not
        # comparable now (taken while the machine ran slower, or elsewhere), not that speculation is free.
        return None
    sizes = snap.cost_ratio
    return CostRatio(
        (t_spec / t_plain - 1.0) / k,
        f"measured at batch {batch_size}: {1e3 * t_spec:.1f} ms per speculative step, "
        f"{1e3 * t_plain:.1f} ms without speculation ({base.source})",
        sizes.target_params if sizes else None,
        sizes.draft_params if sizes else None,
    )


def verify_cost(snap: Snapshot, batch_size: int) -> CostRatio:
    """c for a model-free method without a baseline: the verification of K+1 tokens per request, modelled.

    The live step times T(b) are fitted as T0 + β·(tokens a step verifies); without speculation a step would
    verify one token per request, so c(b) = β·b / (T0 + β·b). With fewer than two batch sizes to fit, c is the
    assumed :data:`ASSUMED_VERIFY_COST`.
    """
    k = snap.engine.k_at(batch_size) or 1
    spec = _spec(snap)
    times = [t for t in snap.lifetime.step_times.times if t.steps >= MIN_STEPS]
    request_steps = sum(t.steps * t.batch_size for t in times)
    per_request = 1.0 + (spec.draft_tokens / request_steps if spec is not None and request_steps else k)
    if len(times) >= 2:
        xs = [t.batch_size * per_request for t in times]
        ys = [t.mean_s for t in times]
        n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
        t0 = my - beta * mx
        if beta > 0 and t0 > 0:
            c = beta * batch_size / (t0 + beta * batch_size)
            return CostRatio(c, f"verify model: live step times fitted over {n} batch sizes "
                                f"({1e3 * t0:.1f} ms + {1e6 * beta:.0f} us per verified token); no baseline")
    return CostRatio(ASSUMED_VERIFY_COST, f"assumed {ASSUMED_VERIFY_COST} per draft token for verifying K+1 tokens; "
                                          "run specscope calibrate for a measured c")


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
    """ρ at ``batch``: engine time on prefill per second of decode, from every step the engine ran there.

    Steps carrying prefill often decode other requests too (a new request joins a running batch), so their time is
    not all prefill. Over the steps at ``batch`` (pure decode and carrying prefill), the tokens decoded cost
    (generated − first tokens) / (batch × E) decode steps of T_spec(batch); what the steps took beyond that is
    prefill, which speculation leaves as it is. From the window's steps, else the lifetime's where the window timed
    no step carrying prefill there; None (unknown, not 0) where neither did.
    """
    if not batch or tokens <= 0:
        return None
    st = _step(snap, batch)
    if st is None or not st.prefill_steps:
        st = snap.lifetime.step_times.get(batch, MIN_STEPS)
    if st is None or not st.prefill_steps:
        return None
    decoded = st.tokens + st.prefill_tokens - st.first_tokens
    decode_s = decoded / (st.batch_size * tokens) * st.mean_s
    prefill_s = st.steps * st.mean_s + st.prefill_s - decode_s
    return max(0.0, prefill_s) / decode_s if decode_s > 0 else 0.0


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
    spec = _spec(snap)
    batch = batch_size or snap.decode_batch
    k = snap.engine.k_at(batch) if batch else snap.engine.num_speculative_tokens
    if not k or spec is None or spec.alpha is None:
        return None
    measured = measured_cost(snap, batch) if cost is None and batch else None
    if cost is None and measured is None and snap.engine.method in MODEL_FREE_METHODS:
        cost = verify_cost(snap, batch or 1)
    cost = cost or measured or snap.cost_ratio
    if cost is None:
        return None
    a = spec.alpha
    rates = spec.per_position[:k]
    observed = _observed_tokens(snap, k)
    modelled_now = acc.tokens_per_step(k, rates, a)
    tokens = observed if observed is not None else modelled_now
    # The share of request-steps that drafted, so that the model reproduces what was observed at the running K.
    drafted = sum(rates)
    fraction = min(1.0, max(0.0, (tokens - 1.0) / drafted)) if drafted > 0 else 1.0
    decode = [acc.tokens_per_step(j, rates, a, fraction) / (j * cost.value + 1.0) for j in range(acc.K_MAX + 1)]
    decode_now = tokens / (k * cost.value + 1.0)
    if k < len(decode):
        decode[k] = decode_now
    rho, draft_prefill = _prefill_per_decode(snap, batch, tokens), _draft_prefill(snap)
    by_k = (1.0, *(acc.end_to_end(s, decode_now, rho or 0.0, draft_prefill) for s in decode[1:]))
    k0, k0_basis = k0_decode(snap, cost)
    return SpeedupEstimate(
        alpha=a, k=k, cost_ratio=cost.value, cost_basis=_basis(cost, measured is not None),
        cost_ratio_source=cost.source, tokens_per_step=tokens, tokens_observed=observed is not None,
        decode_speedup=decode_now, prefill_share=None if rho is None else rho / (1.0 + rho), by_k=by_k,
        batch_size=batch if measured is not None or observed is not None else None,
        k0_speedup=acc.end_to_end(k0, decode_now, rho or 0.0, draft_prefill), k0_basis=k0_basis,
        caveat=LOSSY_CAVEAT if snap.engine.lossy_verification else "",
    )


def k0_decode(snap: Snapshot, cost: CostRatio) -> tuple[float, str]:
    """Decode speedup of a K = 0 range in vLLM's schedule, and how it was priced.

    vLLM's proposers for draft models, EAGLE and MTP run their first forward pass before they look at K, so that
    the drafter's KV cache holds every token the target accepted: at K = 0 a step still costs one draft pass. Its
    cost is taken as c at the smallest batch size measured, where verifying more tokens costs the target least,
    so c is mostly the draft pass (a draft pass grows with the batch as a target step does; verification grows
    faster); without a measured c, the estimate's c (an upper bound). n-gram and suffix lookup run no model at
    K = 0: no cost is modelled (vLLM's speculative path still costs a few percent: ``benchmarks/results/k0.json``).
    """
    if snap.engine.method in MODEL_FREE_METHODS:
        return 1.0, "n-gram and suffix lookup run no model at K=0"
    for t in snap.lifetime.step_times.times:
        if t.steps >= MIN_STEPS and (smallest := measured_cost(snap, t.batch_size)) is not None:
            return 1.0 / (1.0 + smallest.value), (f"the draft still runs a pass a step: c {smallest.value:.2f} "
                                                  f"measured at batch {t.batch_size}")
    return 1.0 / (1.0 + cost.value), f"the draft still runs a pass a step: at most c {cost.value:.2f}"


def class_speedup(snap: Snapshot, cls: TrafficClass, est: SpeedupEstimate | None = None) -> float | None:
    """Expected end-to-end speedup for traffic of class ``cls`` at the operating batch: the engine's estimate
    (``est``, default :func:`estimate`) with the class's own tokens per speculative step in place of the
    engine's; None without the estimate or the class's window steps."""
    est = est or estimate(snap)
    length = cls.window.mean_acceptance_length
    if est is None or length is None:
        return None
    share = est.prefill_share or 0.0
    rho = share / (1.0 - share) if share < 1.0 else 0.0
    decode = length / (est.k * est.cost_ratio + 1.0)
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


@dataclass(frozen=True)
class KChoice:
    """The best K at one batch size, with its expected speedup and the running K's."""

    batch_size: int
    k: int
    speedup: float
    running_k: int
    running_speedup: float
    #: What a K = 0 range in vLLM's schedule runs at here (not plain speed: see :func:`k0_decode`).
    k0_speedup: float


def k_table(snap: Snapshot) -> list[KChoice]:
    """The K for vLLM's schedule at every batch size measured: the one that maximises goodput with speculation
    configured, a K = 0 range priced at what it costs there."""
    return [KChoice(e.batch_size or 0, e.scheduled_k, e.scheduled_speedup, e.k, e.expected_speedup, e.k0_speedup)
            for e in by_batch_size(snap)]


def k_schedule(snap: Snapshot, max_batch: int | None = None) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: (first batch, last batch, K) ranges from 1 to
    ``max_batch`` (default: the engine's max_num_seqs, else the largest batch measured).

    Between measured batch sizes step times are interpolated, and the best K there is kept between the two
    measured sizes' K and moves one way from the first to the second (:func:`monotone_between`), so noise in the
    interpolation never makes K zig-zag; beyond the largest, its K carries on (as vLLM does for batch sizes past
    the last range). Empty without measured estimates.
    """
    table = k_table(snap)
    if not table:
        return []
    setup = snap.engine.setup
    last = max_batch or (setup.max_num_seqs if setup and setup.max_num_seqs else table[-1].batch_size)
    measured_to = table[-1].batch_size
    ks: list[int] = []
    for b in range(1, last + 1):
        if b > measured_to:
            ks.append(ks[-1])
            continue
        est = estimate(snap, batch_size=b)
        ks.append(est.scheduled_k if est is not None and est.measured else (ks[-1] if ks else table[0].k))
    ks = monotone_between(ks, [(c.batch_size, c.k) for c in table])
    out: list[tuple[int, int, int]] = []
    for b, k in enumerate(ks, start=1):
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], b, k)
        else:
            out.append((b, b, k))
    return out


def monotone_between(ks: list[int], measured: list[tuple[int, int]]) -> list[int]:
    """``ks`` (the best K at batch 1, 2, ...) with each stretch between two measured batch sizes ``(batch, K)``
    held between their K and moving only from the first's toward the second's."""
    out = list(ks)
    for (b0, k0), (b1, k1) in itertools.pairwise(measured):
        lo, hi = min(k0, k1), max(k0, k1)
        prev = k0
        for b in range(b0 + 1, min(b1, len(out) + 1)):
            k = min(hi, max(lo, out[b - 1]))
            prev = out[b - 1] = min(k, prev) if k1 <= k0 else max(k, prev)
    return out


def schedule_config(schedule: list[tuple[int, int, int]]) -> dict[str, Any] | None:
    """The speculative-config keys that apply ``schedule``; None when no batch size should speculate."""
    top = max((k for _, _, k in schedule), default=0)
    if top == 0:
        return None
    return {"num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]}


def recommended_config(snap: Snapshot) -> dict[str, Any] | None:
    """The schedule to configure, or None where speculation should be removed (``speculative_config`` dropped, a
    restart): where no batch size measured pays even at its best K, since a K = 0 range still costs a draft pass.
    For a method whose schedule vLLM drops (:data:`SCHEDULABLE_METHODS`), one K: the best at the operating batch."""
    table = k_table(snap)
    if not any(c.speedup >= 1.0 for c in table):
        return None
    method = snap.engine.method
    if method is not None and method not in SCHEDULABLE_METHODS:
        est = estimate(snap)
        k = est.best_k if est is not None and est.measured else max(table, key=lambda c: c.speedup).k
        return {"num_speculative_tokens": k} if k else None
    return schedule_config(k_schedule(snap))


def schedule_text(snap: Snapshot) -> list[str]:
    """The K table and the ready-to-paste schedule, as lines (empty without a usable baseline)."""
    table = k_table(snap)
    if not table:
        return []
    lines = ["batch  best K  speedup   (running K)"]
    for c in table:
        zero = "   K=0 is not off: speculation removed runs 1.00x" if c.k == 0 else ""
        lines.append(f"{c.batch_size:>5}  {c.k:>6}  {c.speedup:6.2f}x   (K={c.running_k}: {c.running_speedup:.2f}x)"
                     + zero)
    config = recommended_config(snap)
    fixed = snap.engine.method is not None and snap.engine.method not in SCHEDULABLE_METHODS
    if fixed:
        lines.append(f"vLLM keeps no per-batch-size schedule for method {snap.engine.method}: one K, the best at "
                     "the operating batch")
    if config is None and fixed and any(c.speedup >= 1.0 for c in table):
        lines.append("remove speculative_config: no K pays at the operating batch")
    elif config is None:
        worst = min(table, key=lambda c: c.k0_speedup)
        lines.append("turn speculation off: remove speculative_config (a restart); no K pays at any batch size "
                     f"measured, and K=0 in vLLM's schedule still runs the draft ({worst.k0_speedup:.2f}x at batch "
                     f"{worst.batch_size})")
    else:
        lines.append("speculative_config: " + json.dumps(config, separators=(", ", ": ")))
        losing = [c for c in table if c.speedup < 1.0]
        if losing:
            lines.append("costs at batch " + ", ".join(f"{c.batch_size} ({c.speedup:.2f}x)" for c in losing)
                         + ": if the engine runs there most, remove speculative_config instead (a restart)")
    return lines


# ----------------------------------------------------------------------------- baselines
def save_profile(profile: StepProfile, path: str | Path) -> None:
    """Write step times and the setup they were measured on as a baseline file (JSON) for :func:`load_profile`."""
    setup = profile.setup or EngineSetup()
    doc = {"setup": asdict(setup),
           "step_times": [{"batch_size": t.batch_size, "steps": t.steps, "mean_s": t.mean_s} for t in profile.times]}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def merge_profiles(profiles: list[StepProfile]) -> StepProfile:
    """One baseline from several calibrations of the same setup (step-weighted means by batch size)."""
    return functools.reduce(intervals.add, profiles) if profiles else StepProfile((), "no calibration")


def load_profile(path: str | Path) -> StepProfile:
    """Read a baseline file; ValueError with one line saying what is wrong."""
    try:
        doc = json.loads(Path(path).read_text())
        times = tuple(StepTime(int(t["batch_size"]), int(t["steps"]), float(t["mean_s"])) for t in doc["step_times"])
        raw = doc.get("setup") or {}
        setup = EngineSetup(**{k: v for k, v in raw.items() if k in EngineSetup.__dataclass_fields__}) if raw else None
    except OSError as exc:
        raise ValueError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a specscope baseline (step_times by batch size): {exc}") from None
    if not times or any(t.batch_size < 1 or t.steps < 1 or t.mean_s <= 0 for t in times):
        raise ValueError(f"{path} is not a usable baseline: it needs positive batch sizes, steps and times")
    name = setup.model if setup else doc.get("model")
    return StepProfile(times, f"baseline {Path(path).name}" + (f" of {name}" if name else ""), setup)


@dataclass(frozen=True)
class DraftKVCost:
    """The draft's cost in KV capacity: blocks the target's KV cache would have without it, their share of that
    capacity, and how many sequences of the observed mean length they would hold (None before any is seen)."""

    blocks: float
    share: float
    mean_length: float | None
    sequences: float | None

    def explain(self) -> str:
        """One line for people."""
        seqs = (f" = {self.sequences:.1f} concurrent sequences of {self.mean_length:.0f} tokens"
                if self.sequences is not None and self.mean_length else "")
        return f"the draft takes {self.blocks:.0f} KV blocks ({self.share:.1%} of the capacity){seqs}"


def draft_kv_cost(snap: Snapshot) -> DraftKVCost | None:
    """What the draft costs this engine's KV cache (weights and its own KV layers); None without the inputs.

    The mean sequence length is the live one (tokens held / running requests) where the KV estimate exists,
    else that of the recent finished requests (prompt + output)."""
    mem, kv = snap.engine.draft_memory, snap.kv
    if mem is None or not kv.num_blocks or not kv.block_size:
        return None
    blocks = mem.blocks_lost(kv.num_blocks, kv.block_size)
    mean: float | None = None
    if kv.tokens_held and snap.running:
        mean = kv.tokens_held / snap.running
    else:
        lengths = [(r.prompt_tokens or 0) + (r.generation_tokens or 0) for r in snap.requests if r.prompt_tokens]
        mean = sum(lengths) / len(lengths) if lengths else None
    return DraftKVCost(blocks=blocks, share=mem.capacity_share(kv.num_blocks, kv.block_size), mean_length=mean,
                       sequences=blocks * kv.block_size / mean if mean else None)


@dataclass(frozen=True)
class AllocatorWaste:
    """Memory torch's caching allocator in this process holds on one GPU without it being allocated."""

    device: int
    reserved_bytes: int
    allocated_bytes: int
    #: The device's used / total memory (NVML), None where NVML cannot tell.
    device_used: float | None

    @property
    def idle_bytes(self) -> int:
        """Reserved but not allocated: cached blocks and fragments only this allocator can reuse."""
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def share(self) -> float:
        """Idle bytes / reserved bytes."""
        return self.idle_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    def explain(self) -> str:
        """"GPU 0: torch reserves 30.0 GiB, allocates 18.0 GiB: 12.0 GiB (40%) idle; device 96% used"."""
        gib = 1 << 30
        used = "device use unknown" if self.device_used is None else f"device {self.device_used:.0%} used"
        return (f"GPU {self.device}: torch reserves {self.reserved_bytes / gib:.1f} GiB, allocates "
                f"{self.allocated_bytes / gib:.1f} GiB: {self.idle_bytes / gib:.1f} GiB ({self.share:.0%}) idle; "
                f"{used}")


def allocator_waste(snap: Snapshot) -> AllocatorWaste | None:
    """The GPU where torch's allocator in this process holds the most reserved-but-unallocated memory; None where
    torch is not using CUDA in this process (vLLM's workers are other processes: see their NVML memory)."""
    used = {d.index: d.used_fraction for d in snap.gpu.devices if d.total_bytes}
    found = [AllocatorWaste(a.device_index, a.reserved_bytes, a.allocated_bytes, used.get(a.device_index))
             for a in snap.gpu.allocator if a.reserved_bytes > 0]
    return max(found, key=lambda w: w.idle_bytes, default=None)

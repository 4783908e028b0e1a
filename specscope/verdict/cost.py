"""The cost ratio c: what one draft token costs as a share of a plain decode step, measured against a baseline,
modelled for model-free methods, or estimated from the configs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specscope.core.model import (
    CostRatio,
    Snapshot,
    StepProfile,
    StepTime,
)
from specscope.core.sizing import MODEL_FREE_METHODS, ModelSize
from specscope.verdict import uncertainty
from specscope.verdict.baseline import usable_baseline
from specscope.verdict.forward import fit_forward

#: Decode steps a batch size needs before its mean step time is used.
MIN_STEPS = 3


#: c assumed for a model-free method when the live step times cannot be fitted (one batch size so far).
ASSUMED_VERIFY_COST = 0.02


def cost_ratio_from_sizes(target: ModelSize | None, draft: ModelSize | None, method: str | None) -> CostRatio | None:
    """c from per-token parameters of the loaded configs; None for model-free methods or unknown sizes."""
    if method in MODEL_FREE_METHODS or target is None or draft is None or not target.per_token:
        return None
    return CostRatio(draft.per_token / target.per_token,
                     f"estimated from parameters per token ({draft.per_token:,} draft / {target.per_token:,} target)",
                     target.weights, draft.weights)


def spec_counts(snap: Snapshot) -> Any:
    """The window's speculative counts, or the lifetime's while the window has no drafts."""
    return snap.window.spec if snap.window.spec and snap.window.spec.drafts else snap.lifetime.spec


def steps_at(snap: Snapshot, batch: int) -> StepTime | None:
    """This engine's steps at ``batch``: the window's when it has enough, else the lifetime's."""
    return snap.window.step_times.get(batch, MIN_STEPS) or snap.lifetime.step_times.get(batch, MIN_STEPS)


def live_context(snap: Snapshot, batch: int) -> float | None:
    """Tokens a request attended over in this engine's decode steps at ``batch`` (:func:`steps_at`); None where not
    recorded."""
    live = steps_at(snap, batch)
    return live.context if live is not None and live.context else None


def _spec_step_time(snap: Snapshot, batch: int) -> float | None:
    st = steps_at(snap, batch)
    if st is not None:
        return st.mean_s
    return snap.window.step_times.at(batch, MIN_STEPS) or snap.lifetime.step_times.at(batch, MIN_STEPS)


def weight_share(snap: Snapshot) -> float | None:
    """The least c a draft model's token can cost: its parameter share, since each draft pass reads all the draft's
    weights as a plain step reads the target's (sampling, verification and the step's overhead only add); None for
    other methods or unknown sizes."""
    sizes = snap.cost_ratio
    if snap.engine.method != "draft_model" or sizes is None or sizes.draft_params is None:
        return None
    return sizes.value


def at_least_share(snap: Snapshot, value: float) -> tuple[float, str]:
    """``value`` (a measured c, or a K = 0 range's pass) raised to :func:`weight_share` where it is under it, and what
    was done, to append to its source ("" where nothing was)."""
    share = weight_share(snap)
    if share is None or value >= share:
        return value, ""
    return share, f"{value:.2f} measured, under the draft's parameter share: priced at the share, {share:.2f}"


#: How far past the largest batch size a baseline was calibrated at its forward's fit is extended.
FORWARD_REACH = 2.0
#: The least share of a speculative step the target's forward must take for its speed to stand for the machine's.
#: Where the draft's passes take most of the step (a draft as large as its target), the forward runs slower than
#: the same machine runs it in a plain engine: the tiny pair's, 15-19% of its step, ran 20-30% over its calibrated
#: fit at every shape while the plain engine served 6% under its calibration (deep01's, 55-73%: 5-7%).
MIN_FORWARD_SHARE = 1 / 3
#: The most the live context may move the baseline's plain step (priced at it, against as calibrated) for the
#: target's forward to anchor it. The forward then is priced at the calibration's context; the forward now runs at
#: the live one, and a verify forward (K+1 tokens a request) grows with context by another share than a plain step:
#: over RAG prompts (~450 tokens, 8x the calibration's, moving the plain step by 10-80%) the anchored plain step came
#: 15% under what the plain engine served at batch 16 and 6% over at batch 1, where priced at the context it came
#: within 3%. Chat traffic's contexts (1.1-1.7x the calibration's) move it by 6% at most.
MAX_ANCHOR_CONTEXT_MOVE = 0.08


def forward_at(base: StepProfile, requests: int, tokens: float) -> float | None:
    """The baseline's target forward for ``requests`` requests running ``tokens`` tokens in all (a plain decode step
    at batch b runs b, a speculative one b·(K+1)), from the fit over every forward its calibration timed, prompts
    and decode steps (:func:`specscope.verdict.forward.fit_forward`); None without a fit, past
    :data:`FORWARD_REACH` times its largest batch size, or where the fit says a token costs nothing or a request less
    than nothing. Calibrated at two batch sizes, a fit holds a one-token forward that runs off the line the others
    make (slower than the four-request one, as on width-768 targets on a 2-core CPU) by pricing a request under
    nothing: an 8-layer, width-768 target at batch 1 and 4 gave -1.45 ms a request, both decode forwards within 1%,
    and its anchored plain step came 34% under the one served; :func:`_fit_misses` cannot see it there."""
    fit = fit_forward(base.forward_moments)
    largest = max((t.batch_size for t in base.times if t.steps >= MIN_STEPS), default=0)
    if fit is None or requests > FORWARD_REACH * largest:
        return None
    a, per_request, per_token = fit
    value = a + per_request * requests + per_token * tokens
    return value if per_token > 0 and per_request >= 0 and value > 0 else None


def _fit_misses(base: StepProfile, batch_size: int) -> bool:
    """Whether the baseline's forward fit misses the calibration's own decode forward at the calibrated batch size
    nearest ``batch_size`` by more than the drift between moments the anchor corrects (:data:`uncertainty.DRIFT`):
    there the fit's error is the larger of the two. A 13-layer, width-768 target on a 2-core CPU ran its one-token
    forward at batch 1 slower than its four-request forward at batch 4, which no line holds: the fit missed both by
    15-19%, and the plain step it anchored came 25% under what was served (docs/speed-anchor.md). False where no
    calibrated batch size timed its forwards (nothing to check the fit on)."""
    rows = [t for t in base.times if t.forwards >= MIN_STEPS and t.forward_s > 0]
    if not rows:
        return False
    near = min(rows, key=lambda t: abs(t.batch_size - batch_size))
    then = forward_at(base, near.batch_size, near.forward_tokens)
    return then is None or abs(then / near.forward_s - 1) > uncertainty.DRIFT


def plain_step(snap: Snapshot, base: StepProfile, batch_size: int) -> tuple[float | None, str, bool]:
    """The target's plain decode step at ``batch_size`` now: ``(seconds, how it was priced, anchored)``.

    Where the live engine's target forward is timed at this batch size, takes :data:`MIN_FORWARD_SHARE` of its
    step or more, the live context is near the calibration's (:data:`MAX_ANCHOR_CONTEXT_MOVE`), the baseline's
    forwards price the same forward (:func:`forward_at`) and price their own near it (:func:`_fit_misses`), the
    baseline's step scaled by the forward now over the forward then: the machine's speed at this moment and what
    little the live context adds both enter through the forward, a steady share of a step (anchored). Otherwise the
    baseline's step priced at the live context (:func:`live_context`)."""
    live, context = steps_at(snap, batch_size), live_context(snap, batch_size)
    t_cal, t_context = base.at(batch_size, MIN_STEPS), base.at(batch_size, MIN_STEPS, context)
    if live is not None and live.forwards >= MIN_STEPS and t_cal and t_context and \
            live.forward_s >= MIN_FORWARD_SHARE * live.mean_s and abs(t_context / t_cal - 1) <= MAX_ANCHOR_CONTEXT_MOVE:
        then = forward_at(base, batch_size, live.forward_tokens)
        if then and not _fit_misses(base, batch_size):
            return (t_cal * live.forward_s / then,
                    f" (priced from the target's forward: {1e3 * live.forward_s:.1f} ms now for {batch_size} "
                    f"request{'s' if batch_size > 1 else ''} of {live.forward_tokens / batch_size:.1f} tokens, "
                    f"{1e3 * then:.1f} ms at the calibration's speed)", True)
    return t_context, _priced_at(base, batch_size, context), False


def measured_cost(snap: Snapshot, batch_size: int) -> CostRatio | None:
    """c at ``batch_size`` from live step times against the baseline (never under 0); None without both, or where a
    speculative step measures faster than the baseline's plain one and no :func:`weight_share` bounds c from below.
    """
    k = snap.engine.k_at(batch_size)
    base = usable_baseline(snap)
    if base is None or not k:
        return None
    t_spec, (t_plain, priced, anchored) = _spec_step_time(snap, batch_size), plain_step(snap, base, batch_size)
    if t_spec is None or not t_plain or (t_spec < t_plain and weight_share(snap) is None):
        # A speculative step verifies K+1 tokens a request: faster than a plain step, it says the baseline is not
        # comparable now (taken while the machine ran slower, or elsewhere), not that speculation is free. A draft
        # model's c is then priced at its weight share (the estimate's floor), as it is just above the baseline.
        return None
    sizes = snap.cost_ratio
    return CostRatio(
        max(0.0, t_spec / t_plain - 1.0) / k,
        f"measured at batch {batch_size}: {1e3 * t_spec:.1f} ms per speculative step, "
        f"{1e3 * t_plain:.1f} ms without speculation{priced} ({base.source})",
        sizes.target_params if sizes else None,
        sizes.draft_params if sizes else None,
        anchored,
    )


def k0_cost(snap: Snapshot, batch_size: int) -> tuple[float, CostRatio] | None:
    """At a batch size the schedule gives K = 0: ``(c0, c)``, what its steps cost beyond a plain step (one draft
    pass for a draft model, EAGLE or MTP; for n-gram and suffix lookup, no model, the speculative path alone), and
    c for pricing a K > 0 there: c0 plus verifying one more token a request (:func:`verify_share`). None without a
    usable baseline and steps there, or where a draft model's step measures faster than the baseline's plain one
    (the baseline is not comparable now) and no :func:`weight_share` bounds the pass from below. A draft model's pass
    is priced at its weight share at least, as a draft token is."""
    base = usable_baseline(snap)
    if base is None or snap.engine.k_at(batch_size) != 0:
        return None
    context = live_context(snap, batch_size)
    t_step, (t_plain, priced, anchored) = _spec_step_time(snap, batch_size), plain_step(snap, base, batch_size)
    model_free, share = snap.engine.method in MODEL_FREE_METHODS, weight_share(snap)
    if t_step is None or not t_plain or (t_step < t_plain and not model_free and share is None):
        return None
    c0, floor = max(0.0, t_step / t_plain - 1.0), ""
    if not anchored:
        c0, floor = at_least_share(snap, c0)
    floor = f", {floor}" if floor else ""
    verify = verify_share(base, batch_size, context)
    sizes = snap.cost_ratio
    what = "the speculative path" if model_free else "the draft's pass"
    return c0, CostRatio(
        c0 + (verify or 0.0),
        f"measured at batch {batch_size}, where the schedule runs K=0: {what} {c0:.2f} ({1e3 * t_step:.1f} ms a "
        f"step, {1e3 * t_plain:.1f} ms without speculation{priced}{floor}) plus "
        + (f"{verify:.2f} for verifying one more token a request (the baseline's step times over batch sizes)"
           if verify is not None else "nothing for verification (a baseline of one batch size: a lower bound)")
        + f" ({base.source})",
        sizes.target_params if sizes else None,
        sizes.draft_params if sizes else None,
        anchored,
    )


def verify_share(base: StepProfile, batch_size: int, context: float | None = None) -> float | None:
    """What verifying one more token a request costs at ``batch_size``, as a share of a plain step: the verify
    model (:func:`verify_cost`) on the baseline's plain steps, which verify one token a request, T(b) = T0 + β·b
    fitted over its batch sizes at ``context``: β·b / T(b). None with fewer than two batch sizes calibrated."""
    rows = sorted({t.batch_size for t in base.times if t.steps >= MIN_STEPS})
    points = [(float(b), t) for b in rows if (t := base.at(b, MIN_STEPS, context))]
    t_b = base.at(batch_size, MIN_STEPS, context)
    if len(points) < 2 or not t_b:
        return None
    _, beta = least_squares_line(points)
    return max(0.0, beta) * batch_size / t_b


def verify_forward_share(base: StepProfile, batch_size: int) -> float | None:
    """What the target's forward adds for one more token a request at ``batch_size``, as a share of the baseline's
    plain step there (both as calibrated): the per-token term of its forward fit (:func:`specscope.verdict.forward.
    fit_forward`), times the batch. The part of a measured c that grows with K through verification alone; None
    without a fit or a step at ``batch_size``, or where the fit says a token costs nothing."""
    fit = fit_forward(base.forward_moments)
    t_b = base.at(batch_size, MIN_STEPS)
    if fit is None or not t_b or fit[2] <= 0:
        return None
    return fit[2] * batch_size / t_b


def least_squares_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line through ``points`` (x, y): (intercept, slope); slope 0 where every x is the same."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    beta = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - beta * mx, beta


def _priced_at(base: StepProfile, batch_size: int, context: float | None) -> str:
    """Where the baseline was priced: " at 412 tokens of context (calibrated at 60 tokens)", or why not."""
    rows = [t for t in base.times if t.steps >= MIN_STEPS]
    if not rows or not any(t.context_slope for t in rows):
        return " (a baseline with no context dependence measured)"
    if context is None:
        return " (the live context unknown: priced as calibrated)"
    near = min(rows, key=lambda t: abs(t.batch_size - batch_size))
    return f" at {context:.0f} tokens of context (calibrated at {near.context:.0f} tokens)"


def verify_cost(snap: Snapshot, batch_size: int) -> CostRatio:
    """c for a model-free method without a baseline: the verification of K+1 tokens per request, modelled.

    The live step times T(b) are fitted as T0 + β·(tokens a step verifies); without speculation a step would
    verify one token per request, so c(b) = β·b / (T0 + β·b). Draft tokens, request-steps and step times all come
    from one interval: the window where it drafted and has two batch sizes to fit, else the lifetime. With fewer
    than two batch sizes to fit, c is the assumed :data:`ASSUMED_VERIFY_COST`.
    """
    k = snap.engine.k_at(batch_size) or 1
    interval = snap.window
    times = [t for t in interval.step_times.times if t.steps >= MIN_STEPS]
    if len(times) < 2 or not (interval.spec and interval.spec.drafts):
        interval = snap.lifetime
        times = [t for t in interval.step_times.times if t.steps >= MIN_STEPS]
    spec = interval.spec
    request_steps = sum(t.steps * t.batch_size for t in times)
    per_request = 1.0 + (spec.draft_tokens / request_steps if spec is not None and request_steps else k)
    if len(times) >= 2:
        n = len(times)
        t0, beta = least_squares_line([(t.batch_size * per_request, t.mean_s) for t in times])
        if beta > 0 and t0 > 0:
            c = beta * batch_size / (t0 + beta * batch_size)
            return CostRatio(c, f"verify model: live step times fitted over {n} batch sizes "
                                f"({1e3 * t0:.1f} ms + {1e6 * beta:.0f} us per verified token); no baseline")
    return CostRatio(ASSUMED_VERIFY_COST, f"assumed {ASSUMED_VERIFY_COST} per draft token for verifying K+1 tokens; "
                                          "run specscope calibrate for a measured c")

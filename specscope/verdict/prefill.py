"""What speculation leaves as it is, prefill: a request's prefill against its decode, and the draft's own prefill.

ρ (:func:`prefill_per_decode`) is what the end-to-end speedup weighs the decode speedup by; a draft prefills every
prompt too, which a plain engine does not (:func:`draft_prefill`). :func:`specscope.core.acceptance.end_to_end`
takes both.
"""

from __future__ import annotations

from specscope.core import derived
from specscope.core.model import Snapshot
from specscope.core.sizing import MODEL_FREE_METHODS
from specscope.verdict.cost import MIN_STEPS, steps_at


def prefill_per_decode(snap: Snapshot, batch: int | None, tokens: float) -> float | None:
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


def output_lengths(snap: Snapshot) -> tuple[int, ...]:
    """Output tokens of each finished request: the window's, else every kept request's; () without one. Computed
    once per snapshot (a schedule prices every batch size up to max_num_seqs)."""
    def lengths() -> tuple[int, ...]:
        done = [r for r in snap.requests if r.generation_tokens]
        recent = [r for r in done if r.finished_at >= snap.time - snap.window_seconds]
        return tuple(r.generation_tokens or 0 for r in recent or done)

    return derived.once(snap, ("output_lengths",), lengths)


def _output_length(snap: Snapshot) -> float | None:
    """A finished request's output tokens, the mean of :func:`output_lengths`; None without one."""
    lengths = output_lengths(snap)
    return sum(lengths) / len(lengths) if lengths else None


def draft_prefill(snap: Snapshot) -> float:
    """The draft's prefill cost per token relative to the target's: it prefills every prompt too (a plain engine
    does not). Its parameters per token against the target's; 0 for model-free methods or unknown sizes."""
    sizes = snap.cost_ratio
    if sizes is None or snap.engine.method in MODEL_FREE_METHODS or sizes.draft_params is None:
        return 0.0
    return sizes.value

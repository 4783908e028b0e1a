"""An estimate in words: the paragraph a person acts on, and one line over several batch sizes.

The sentences the verdict says of a :class:`~specscope.verdict.speedup.SpeedupEstimate`, which holds the numbers and
the decisions they make (the advised K, whether it pays); every word here is read off them, and nothing here
computes a number of its own.
"""

from __future__ import annotations

from specscope.verdict.speedup import SpeedupEstimate


def explain(est: SpeedupEstimate) -> str:
    """``est`` in one paragraph a person can act on."""
    if est.k == 0:
        return _explain_k0(est)
    iv = est.interval
    verdict = ("pays" if est.pays else "does NOT pay" if est.surely_loses
               else "may not pay (its interval reaches 1.0x)")
    at = f" and batch {est.batch_size}" if est.batch_size else ""
    tokens = f"{est.tokens_per_step:.2f} tokens/step {'observed' if est.tokens_observed else 'modelled'}"
    share = est.prefill_share
    prefill = (", prefill not timed at this batch size: decode only" if share is None
               else f", prefill {share:.0%} of engine time" if share >= 0.005 else "")
    advised = est.advised_k
    if advised == 0:
        advice = (f"turn speculation off (remove speculative_config, a restart): no K makes it pay here, and "
                  f"K=0 in vLLM's schedule would run at {est.k0_speedup:.2f}x ({est.k0_basis})")
    elif advised == est.k:
        advice = (f"K={est.k} is already the best" if est.best_k == est.k else
                  f"keep K={est.k}: K={est.best_k}'s {est.best_speedup:.2f}x is within the noise")
    else:
        advice = f"K={advised} would give {est.by_k[advised]:.2f}x"
    near = est.near_best
    if near and near[0] != near[1] and advised:
        advice += f"; K={near[0]}-{near[1]} are within the noise of the best"
    sure = f" ({iv[0]:.2f}-{iv[1]:.2f}x, {est.interval_basis})" if iv else " (no interval: too few requests)"
    return (f"speculation {verdict}: expected speedup {est.expected_speedup:.2f}x{sure} at K={est.k}{at} "
            f"(decode {est.decode_speedup:.2f}x{prefill}; {tokens}; alpha {est.alpha:.2f}; "
            f"c {est.c:.2f}, {est.c_source}); {advice}{est.caveat}")


def _explain_k0(est: SpeedupEstimate) -> str:
    """:func:`explain` at a batch size the schedule gives K = 0: the range's own speed, then K > 0's prices."""
    iv = est.interval
    verdict = ("pays" if est.pays else "does NOT pay" if est.surely_loses
               else "may not pay (its interval reaches 1.0x)")
    at = f" at batch {est.batch_size}" if est.batch_size else ""
    share = est.prefill_share
    prefill = (", prefill not timed at this batch size" if share is None
               else f", prefill {share:.0%} of engine time" if share >= 0.005 else "")
    sure = f" ({iv[0]:.2f}-{iv[1]:.2f}x, {est.interval_basis})" if iv else " (no interval: too few requests)"
    scheduled, advised = est.scheduled_k, est.advised_k
    if advised == 0 and est.best_k == 0:
        advice = ("no K pays here: speculation removed (remove speculative_config, a restart) runs 1.00x; "
                  "remove it if the engine runs at this batch size most")
        if scheduled:
            advice += f"; with speculation configured, K={scheduled} ({est.by_k[scheduled]:.2f}x) beats K=0"
    elif advised == 0:
        advice = f"keep K=0: K={est.best_k}'s {est.best_speedup:.2f}x is within the noise"
    else:
        advice = f"K={advised} would give {est.by_k[advised]:.2f}x"
    return (f"speculation {verdict}: the schedule's K=0 range{at} runs {est.expected_speedup:.2f}x{sure}; "
            f"{est.k0_basis}{prefill}; K>0 priced from the acceptance where the engine drafts (alpha "
            f"{est.alpha:.2f}) and c {est.c:.2f}, {est.c_source}; {advice}{est.caveat}")


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

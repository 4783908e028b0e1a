"""How sure an estimate is, priced: its inputs drawn as :mod:`specscope.verdict.uncertainty` draws them (the
requests' acceptance resampled, the step times and the machine's drift drawn, the step's fixed share drawn), each
draw priced at every K as the point is, and the interval at the running K said in words (its basis).
:func:`specscope.verdict.speedup.estimate` passes the pricing in, one function of K and a draw's inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from specscope.core.model import Snapshot
from specscope.verdict import uncertainty
from specscope.verdict.baseline import usable_baseline
from specscope.verdict.cost import MIN_STEPS, steps_at


def speedup_interval(snap: Snapshot, batch: int | None, k: int, c: float, measured: bool,
                     point: tuple[tuple[float, ...], float, float],
                     speedup_at: Callable[[int, tuple[float, ...], float, float, float, float], float],
                     fixed: tuple[float, float],
                     ) -> tuple[tuple[float, float] | None, str, Callable[[int], tuple[float, ...]] | None, int]:
    """``(interval at the running K, basis, the speedup at a K in each draw, requests resampled)``: ``speedup_at``
    over the requests' resampled acceptance and, where c is measured, a plain step time drawn from the baseline's
    median at its standard error (through c), and the machine's drift between moments with the live steps' mean at
    its standard error (a factor on every K's speedup: it moves the steps a restart runs, at whatever K). With too
    few requests to resample (a window at a large batch size may finish two), a measured c still draws its step
    times, with acceptance as observed over the window's steps: the step times' unsureness is said, and a point
    just under 1.0x is not called a loss on it. None with neither.

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
    near = min(rows, key=lambda t: abs(t.batch_size - (batch or 1))) if rows else None
    live = steps_at(snap, batch) if near is not None and batch else None
    # The plain step is priced from the baseline's median of its rounds, the speculative step from this window's
    # mean over its seconds: each as sure as its standard error. What neither shows, the machine's speed moving
    # between moments minutes apart (the baseline's and a restart's plain step, this window's and a restart's
    # speculative step), is the drift fitted on CPU machines' runs.
    rounds = uncertainty.standard_error(near.spread, near.readings, median=True) if near is not None else 0.0
    window = uncertainty.standard_error(live.spread, live.readings) if live is not None else 0.0
    drift = uncertainty.DRIFT if near is not None else 0.0
    apart = (drift ** 2 + window ** 2) ** 0.5
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

    parts = []
    if near is not None and rounds:
        over = f" over {near.readings} rounds" if near.readings else ""
        parts.append(f"the baseline's median ±{rounds:.1%}{over}")
    if live is not None and window:
        over = f" over {live.readings} seconds" if live.readings else ""
        parts.append(f"the live steps' mean ±{window:.1%}{over}")
    if drift:
        parts.append(f"the drift between moments ±{drift:.1%}, as CPU runs moved")
    steps = f"a {spread:.0%} spread of the step times' ratio ({'; '.join(parts)})" if spread else ""
    if resampled:
        basis = f"{uncertainty.COVERAGE:.0%} interval over {resampled} requests" + (f" and {steps}" if steps else "")
    else:
        basis = f"{uncertainty.COVERAGE:.0%} interval over {steps}" + (
            f"; acceptance as observed (too few requests to resample, {uncertainty.MIN_REQUESTS} needed)" if k else "")
    return uncertainty.quantiles(at(k)), basis, at, resampled

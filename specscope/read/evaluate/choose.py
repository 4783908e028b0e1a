"""Which K, and which candidate: vLLM's schedule from each candidate's measured speedups (by the live verdict's
rule, :func:`~specscope.verdict.schedule.k_ranges`), and the ranking by :data:`RANKING_RULE`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from specscope.read.evaluate.results import Candidate, Choice, Schedule
from specscope.verdict.schedule import k_ranges, schedule_config

RANKING_RULE = ("the geometric mean, over the batch sizes given, of each candidate's best measured speedup there "
                "(at its best K; refused and failed candidates last)")


def choose_schedule(cand: Candidate, batch_sizes: Sequence[int], max_batch: int,
                    one_k: bool = False) -> Schedule | None:
    """The best K at each batch size measured and vLLM's schedule from it, to ``max_batch``; None before anything
    was measured.

    The schedule follows the live verdict's rule (:func:`~specscope.verdict.schedule.k_ranges`): below the first
    measured batch size its K; between two, the best K on step times linear in the batch size
    (:func:`_k_between`), held between the two measured K and moving one way; beyond the largest, its K. A K = 0
    range costs what specscope's estimate prices it at, and is never scheduled where it has no price; where no K
    pays at any batch size, the advice is to run without speculation (``config`` None). One K throughout is a plain
    ``num_speculative_tokens``, measured by that K's runs. With ``one_k`` (a server vLLM runs with one K whatever
    its config says: data parallel), the K whose speedups score best over the batch sizes (:data:`RANKING_RULE`).
    """
    choices = []
    for b in sorted(batch_sizes):
        best = cand.best(b)
        if best is None:
            continue
        k, speedup = best
        prices = [run.k0_price[b] for run in cand.runs.values() if b in run.k0_price]
        k0 = statistics.median(prices) if prices else None
        scheduled, expected = (0, k0) if k0 is not None and k0 > speedup else (k, speedup)
        choices.append(Choice(b, k if speedup > 1.0 else 0, max(speedup, 1.0), scheduled, expected, k0))
    if not choices:
        return None
    last = max(max_batch, choices[-1].batch_size)
    if one_k:
        scored = [(s, k) for k, run in cand.runs.items()
                  if (s := _geomean([c.speedup for b in batch_sizes if (c := run.cells.get(b)) and c.speedup]))]
        top_score, top_k = max(scored, default=(0.0, 0))
        ranges = [(1, last, top_k if top_score > 1.0 else 0)]
    else:
        ranges = k_ranges([(c.batch_size, c.k) for c in choices], last, lambda b: _k_between(cand, choices, b))
    config = schedule_config(ranges) if any(c.best_k for c in choices) else None
    same = config["num_speculative_tokens"] if config is not None and len(config) == 1 else None
    return Schedule(choices, ranges, config, cand.runs[same].cells if same else {}, same)


def _k_between(cand: Candidate, choices: Sequence[Choice], b: int) -> int | None:
    """The K to schedule at batch ``b`` between two measured batch sizes, found as the verdict finds it there: with
    step times linear in the batch size between them. Each K's speedup at ``b`` is then the two measured ones'
    harmonic mean weighted by the plain step time at each end (and a K = 0 range's price likewise). None outside
    the measured sizes, or where no K was measured at both."""
    lo = next((c for c in reversed(choices) if c.batch_size < b), None)
    hi = next((c for c in choices if c.batch_size > b), None)
    if lo is None or hi is None:
        return None
    x = (b - lo.batch_size) / (hi.batch_size - lo.batch_size)
    w0, w1 = (1.0 - x) * _plain_step(cand, lo.batch_size), x * _plain_step(cand, hi.batch_size)

    def at(s0: float, s1: float) -> float:
        return (w0 + w1) / (w0 / s0 + w1 / s1)

    found = []
    for k, run in cand.runs.items():
        c0, c1 = run.cells.get(lo.batch_size), run.cells.get(hi.batch_size)
        s0, s1 = (c0.speedup if c0 else None), (c1.speedup if c1 else None)
        if s0 and s1:
            found.append((at(s0, s1), -k))
    if not found:
        return None
    speedup, k = max(found)
    if lo.k0_price is not None and hi.k0_price is not None and at(lo.k0_price, hi.k0_price) > speedup:
        return 0
    return -k


def _plain_step(cand: Candidate, b: int) -> float:
    """The plain engine's step time at batch ``b``: ``b`` over its median output tokens/s there."""
    return b / statistics.median(x for run in cand.runs.values() if b in run.cells for x in run.cells[b].plain if x > 0)


def score(cand: Candidate, batch_sizes: Sequence[int]) -> float | None:
    """The ranking score (:data:`RANKING_RULE`) over the batch sizes measured; None where none was."""
    return _geomean([found[1] for b in batch_sizes if (found := cand.best(b)) is not None])


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in values) / len(values)) if values else None


def rank(candidates: Sequence[Candidate], batch_sizes: Sequence[int]) -> list[tuple[Candidate, float | None]]:
    """The candidates, best first, with their scores (:data:`RANKING_RULE`)."""
    scored = [(c, score(c, batch_sizes)) for c in candidates]
    return sorted(scored, key=lambda cs: (cs[0].status in ("refused", "failed"), cs[1] is None, -(cs[1] or 0.0)))

"""Step-time rows from rounds of one engine (what calibration and `specscope evaluate`'s baseline are made of)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specscope.core.counts import forward_moments
from specscope.core.model import StepProfile, StepTime
from specscope.engine.measure import median_moments, median_rows, serve_until_row, settled, sloped_rows
from specscope.verdict.forward import fit_forward
from specscope.verdict.speedup import MIN_TABLE_STEPS
from tests.verdict.test_forward import forward


def test_a_row_is_its_median_round_with_the_rounds_spread_and_pooled_steps() -> None:
    rounds = [StepProfile((StepTime(1, 100, 0.010, context=60.0), StepTime(4, 50, 0.020, context=70.0)), "r1"),
              StepProfile((StepTime(1, 100, 0.030, context=60.0), StepTime(16, 5, 0.1)), "r2"),  # a slow spell
              StepProfile((StepTime(1, 200, 0.012, context=90.0),), "r3")]
    rows = {t.batch_size: t for t in median_rows(rounds, (1, 4))}
    assert set(rows) == {1, 4}  # batch 16 was not asked for
    one = rows[1]
    assert one.mean_s == pytest.approx(0.012)  # the slow round does not move it
    assert one.steps == 400 and one.context == pytest.approx(75.0)  # steps pooled, context step-weighted
    assert one.spread == pytest.approx(statistics.stdev([0.010, 0.030, 0.012]) / 0.012)
    assert rows[4].mean_s == pytest.approx(0.020) and rows[4].spread == 0.0  # one round: no spread known


def test_rounds_are_settled_when_their_median_is_sure_at_every_batch_size() -> None:
    """The median's standard error, 1.25 * spread / sqrt(rounds), under SETTLED at each batch size: three rounds 2%
    apart are; three 6% apart are not, nine are; one round never is (no spread to tell)."""
    def rounds(spread: float, n: int, batch: int = 1) -> list[StepProfile]:
        # Rounds alternating around 10 ms by +-spread (their standard deviation / median is about spread).
        return [StepProfile((StepTime(batch, 10, 0.010 * (1 + spread * (-1) ** i)),), "r") for i in range(n)]

    assert not settled(rounds(0.0, 1), (1,))
    assert settled(rounds(0.02, 3), (1,))
    assert not settled(rounds(0.06, 3), (1,)) and settled(rounds(0.06, 9), (1,))
    assert not settled(rounds(0.15, 9), (1,))  # a slow day's: nine rounds are as sure as it gets (max_rounds)
    # Every batch size must be: a quiet batch 1 beside a noisy batch 8 is not.
    both = [StepProfile(q.times + n.times, "r") for q, n in zip(rounds(0.0, 3), rounds(0.2, 3, 8), strict=True)]
    assert not settled(both, (1, 8)) and settled(both, (1,))


def test_the_context_slope_comes_from_the_rounds_that_timed_both_contexts_at_all_the_rounds_speed() -> None:
    """Three rounds timed the short and the long prompts together, on a machine running at 1.0x, 1.2x, 1.0x; six
    more timed the short ones alone (calibration's extra rounds), slower: the slope is the paired rounds' (10 ms to
    30 ms over 900 tokens), scaled to the speed of the median of all nine short rounds."""
    def at(batch: int, mean_s: float, context: float) -> StepProfile:
        return StepProfile((StepTime(batch, 30, mean_s, context=context),), "r")

    short = [at(8, 0.010 * s, 100.0) for s in (1.0, 1.2, 1.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.4)]
    long = [at(8, 0.030 * s, 1000.0) for s in (1.0, 1.2, 1.0)]
    (row,) = sloped_rows(short, long, (8,))
    assert row.mean_s == pytest.approx(0.013)  # the median of the nine
    assert row.context_slope == pytest.approx(0.020 / 900 * 1.3)
    assert StepProfile((row,), "r").at(8, context=1000.0) == pytest.approx(0.039)  # priced at the long context
    # No contrast, or one too near the reference's context to tell a slope: the rows carry none.
    assert sloped_rows(short, [], (8,))[0].context_slope == 0.0
    assert sloped_rows(short, [at(8, 0.012, 140.0)] * 3, (8,))[0].context_slope == 0.0


def test_the_rounds_forward_sums_are_pooled_at_the_median_rounds_speed() -> None:
    """Two rounds of the same forwards, the second timed on a machine running twice as slow: pooled, and priced at
    the speed the rows' median step says (here round one's, a third under the pooled mean)."""
    def round_(slow: float) -> StepProfile:
        rows = [(1, 1, 40, 40 * slow * forward(1, 1)), (4, 4, 40, 40 * slow * forward(4, 4)),
                (4, 48, 2, 2 * slow * forward(4, 48))]
        return StepProfile((StepTime(1, 40, slow * 0.004), StepTime(4, 40, slow * 0.005)), "r",
                           forward_moments=tuple(forward_moments(rows)))

    rounds = [round_(1.0), round_(2.0)]
    # Two rounds' median is their mean, 1.5 times round one's: rows as if a third round had made it round one's.
    rows = [replace(t, mean_s=t.mean_s / 1.5) for t in median_rows(rounds, (1, 4))]
    fit = fit_forward(median_moments(rounds, rows))
    assert fit is not None and fit[0] + fit[1] * 4 + fit[2] * 20 == pytest.approx(forward(4, 20))
    assert median_moments(rounds, [])[0] == 2 * 82  # no rows to scale by: pooled as timed


class _Served:
    """An engine whose batch size 16 gains ``per_window`` decode steps a window served."""

    def __init__(self, per_window: int) -> None:
        self.per_window, self.steps, self.windows = per_window, 0, 0

    def serve(self) -> None:
        self.windows += 1
        self.steps += self.per_window

    def snapshot(self) -> SimpleNamespace:
        times = (StepTime(16, self.steps, 0.05),) if self.steps else ()
        return SimpleNamespace(lifetime=SimpleNamespace(step_times=StepProfile(times)))


@pytest.mark.parametrize(("per_window", "windows", "row"), [(25, 1, True), (7, 3, True), (2, 4, False)])
def test_serve_until_row_serves_until_the_k_table_row_has_its_steps(per_window: int, windows: int,
                                                                      row: bool) -> None:
    engine = _Served(per_window)
    assert serve_until_row(engine, 16, engine.serve) is row
    assert engine.windows == windows
    assert (engine.snapshot().lifetime.step_times.get(16, MIN_TABLE_STEPS) is not None) is row

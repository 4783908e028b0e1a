"""Step-time rows from rounds of one engine (what calibration and `specscope evaluate`'s baseline are made of)."""

from __future__ import annotations

import statistics

import pytest

from specscope.measure import median_rows
from specscope.model import StepProfile, StepTime


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

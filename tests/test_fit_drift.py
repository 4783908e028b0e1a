"""``benchmarks/fit_constants.py --drift``: the drift it fits is the spread a normal's band would need to hold the
moves, and the interval takes the value it fitted (``results/fit_drift.json``)."""

from __future__ import annotations

import json
import random

from benchmarks import fit_constants
from specscope.verdict import uncertainty
from tests.conftest import REPO


def test_the_fitted_spread_is_the_normal_spread_that_holds_nine_moves_in_ten() -> None:
    rng = random.Random(0)
    moves = [rng.gauss(0.0, 0.08) for _ in range(4000)]
    spread = fit_constants.spread_holding(moves)
    assert abs(spread - 0.08) < 0.004 and abs(fit_constants.held(moves, spread) / len(moves) - 0.9) < 0.001
    # A few slow spells (a tenth of the moves ten times as far) move the spread far less than a root mean square.
    tails = moves[:3600] + [10 * m for m in moves[3600:]]
    rms = (sum(m * m for m in tails) / len(tails)) ** 0.5
    assert fit_constants.spread_holding(tails) < 0.15 < 0.25 < rms


def test_a_pair_left_out_is_scored_on_a_value_its_moves_took_no_part_in() -> None:
    fit = fit_constants.fit_drift({"a": [0.01, -0.01] * 10, "b": [0.2, -0.2] * 10, "c": [0.02, -0.02] * 10}, 0.05)
    folds = {f["left_out"]: f for f in fit["folds"]}
    # Left out, the wide pair is judged by the two narrow ones' spread, which holds none of its moves.
    assert folds["b"]["chosen"] < 0.02 and folds["b"]["held"] == 0 and folds["b"]["own"] > 0.1
    assert folds["a"]["held"] == 20 and fit["cross_validated"] == {"moves": 60, "held": 40}
    assert fit["committed_on_the_same_moves"]["held"] == 40


def test_the_interval_takes_the_drift_the_script_fitted() -> None:
    doc = json.loads((REPO / "benchmarks" / "results" / "fit_drift.json").read_text())
    assert doc["judged"].startswith("fitted") and not doc["dirty"]
    assert uncertainty.DRIFT == doc["drift"]["fitted"] == doc["drift"]["committed"]

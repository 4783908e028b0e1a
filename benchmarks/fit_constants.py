"""The verdict's chosen constants, chosen again from the saved user-path runs, with leave-one-pair-out
cross-validation: engine-free, on each run's saved predicting snapshot (``truth_user*_<pair>.snapshot.json``) and
the speedups its results measured (``truth_user*.json``), judged as ``bench_truth_user.py --replay`` judges them.

The constants, one at a time (the others at their committed values):

- :data:`specscope.verdict.uncertainty.DRAFT_FIXED`: the share of the draft's part of the running K's step that a
  step pays whatever its K, with its range (0 to twice the point, as ``DRAFT_FIXED_RANGE`` is). It moves only the
  cells at a K other than the running one, which are the cells it is judged on;
- :data:`specscope.verdict.cost.MIN_FORWARD_SHARE`: the least share of a speculative step the target's forward
  must take to anchor the baseline to the machine's speed (above 1: never anchored);
- :data:`specscope.verdict.cost.MAX_ANCHOR_CONTEXT_MOVE`: the most the live context may move the plain step for the
  forward to anchor it (0: only at the calibration's context; inf: at any context).

The two anchoring constants move every cell, the running K's included, and are judged on all of them. For each
pair left out (tiny, deep01, deep01-rag, wide01, over every run that has it), the value is chosen on the other
pairs' cells (the most predictions within 10% of the measured speedup; ties: the interval's coverage nearest 90%,
then the value nearest the committed one), then scored on the left-out pair's cells, beside the committed value's
score there. The fresh runs (``truth_fresh_*``), the accuracy the README quotes, are not read: no constant is chosen
on them.

The drift assumed between moments (``SPEC_DRIFT``, ``PLAIN_DRIFT``) is not fitted here: every saved run measured
its own spreads, which the verdict uses instead, so no saved cell depends on it.

Run: python benchmarks/fit_constants.py (a few minutes). Results: benchmarks/results/fit_constants.json.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, write
from benchmarks.bench_truth_user import BATCHES, RUNNING_K, judge
from specscope.core import codec
from specscope.verdict import cost, estimate, uncertainty


@dataclass(frozen=True)
class Constant:
    """A constant of the verdict, where it lives, the values tried and which cells it moves."""

    name: str
    module: Any
    attribute: str
    grid: tuple[float, ...]
    #: Whether only cells at a K other than the running one depend on it.
    other_k_only: bool = False
    #: The module's attribute holding its range, set to 0 to twice the point along with it (None: no range).
    range_attribute: str | None = None

    @property
    def committed(self) -> float:
        return float(COMMITTED[self.name])

    def set(self, value: float) -> None:
        setattr(self.module, self.attribute, value)
        if self.range_attribute is not None:
            setattr(self.module, self.range_attribute, (0.0, 2 * value))


CONSTANTS = (
    Constant("uncertainty.DRAFT_FIXED (range 0 to twice it)", uncertainty, "DRAFT_FIXED",
             (0.0, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25), other_k_only=True,
             range_attribute="DRAFT_FIXED_RANGE"),
    Constant("cost.MIN_FORWARD_SHARE", cost, "MIN_FORWARD_SHARE", (0.0, 0.1, 0.2, 0.25, 1 / 3, 0.4, 0.5, 0.6, 1.01)),
    Constant("cost.MAX_ANCHOR_CONTEXT_MOVE", cost, "MAX_ANCHOR_CONTEXT_MOVE",
             (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, math.inf)),
)
COMMITTED = {c.name: getattr(c.module, c.attribute) for c in CONSTANTS}
Saved = list[tuple[str, str, Any, list[dict[str, Any]]]]


def runs() -> Saved:
    """(run, pair, predicting snapshot, measured cells) for every saved run's pair that has its snapshot."""
    out = []
    for path in sorted(RESULTS.glob("truth_user*.json")):
        if path.name.endswith(".snapshot.json"):
            continue
        doc = json.loads(path.read_text())
        for pair, result in doc.get("pairs", {}).items():
            snap_path = RESULTS / f"{path.stem}_{pair}.snapshot.json"
            if not snap_path.is_file():
                continue
            cells = [{k: c[k] for k in ("k", "batch", "measured", "rounds")} for c in result["cells"]
                     if c.get("measured")]
            out.append((path.stem, pair, codec.from_dict(json.loads(snap_path.read_text())), cells))
    return out


def judged(constant: Constant, value: float, saved: Saved) -> dict[str, list[dict[str, Any]]]:
    """Each pair's cells that ``constant`` moves, judged with it at ``value``."""
    constant.set(value)
    try:
        out: dict[str, list[dict[str, Any]]] = {}
        for _, pair, snap, cells in saved:
            fresh = replace(snap)  # a snapshot's estimates are kept with it: a fresh one for each value
            moved = [c for c in cells if not constant.other_k_only or c["k"] != RUNNING_K]
            out.setdefault(pair, []).extend(judge(moved, {b: estimate(fresh, batch_size=b) for b in BATCHES}))
        return out
    finally:
        constant.set(constant.committed)


def score(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Cells predicted, within 10% of the measured speedup, and inside their interval."""
    done = [c for c in cells if c.get("predicted") is not None]
    return {"cells": len(done), "within_10pct": sum(bool(c["within_10pct"]) for c in done),
            "inside_interval": sum(bool(c["inside_interval"]) for c in done if c["inside_interval"] is not None)}


def _add(scores: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: sum(s[key] for s in scores) for key in ("cells", "within_10pct", "inside_interval")}


def _rank(s: dict[str, Any], value: float, committed: float) -> tuple[float, ...]:
    return (s["within_10pct"], -abs(s["inside_interval"] / s["cells"] - uncertainty.COVERAGE) if s["cells"] else 0.0,
            -abs(value - committed) if math.isfinite(value) else -math.inf)


def cross_validate(constant: Constant, saved: Saved) -> dict[str, Any]:
    """``constant`` chosen on all pairs but one and scored on that one, for each pair."""
    grid = constant.grid if constant.committed in constant.grid else (*constant.grid, constant.committed)
    by_value = {v: {pair: score(cells) for pair, cells in judged(constant, v, saved).items()} for v in grid}
    pairs = sorted(by_value[constant.committed])
    folds: list[dict[str, Any]] = []
    for left_out in pairs:
        train = {v: _add([s for pair, s in by_value[v].items() if pair != left_out]) for v in grid}
        chosen = max(grid, key=lambda v: _rank(train[v], v, constant.committed))
        folds.append({"left_out": left_out, "chosen": _json(chosen), "train": train[chosen],
                      "test": by_value[chosen][left_out], "test_at_committed": by_value[constant.committed][left_out]})
    everywhere = {v: _add(list(by_value[v].values())) for v in grid}
    return {"constant": constant.name, "committed": _json(constant.committed), "grid": [_json(v) for v in grid],
            "moves": "cells at a K other than the running one" if constant.other_k_only else "every cell",
            "cells": {p: by_value[constant.committed][p]["cells"] for p in pairs}, "folds": folds,
            "cross_validated": _add([f["test"] for f in folds]),
            "committed_on_the_same_cells": _add([f["test_at_committed"] for f in folds]),
            "best_on_all_pairs": _json(max(grid, key=lambda v: _rank(everywhere[v], v, constant.committed))),
            "by_value": {str(_json(v)): {"all": everywhere[v], **by_value[v]} for v in grid}}


def _json(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def main() -> None:
    saved = runs()
    results = [cross_validate(c, saved) for c in CONSTANTS]
    write("fit_constants", {"runs": sorted({run for run, *_ in saved}), "constants": results},
          judged=f"replay of the saved truth_user runs ({len(saved)} pair runs)")
    for r in results:
        print(f"\n{r['constant']} (committed {r['committed']}; moves {r['moves']})")
        print(f"{'left out':<12}{'chosen':>8}{'train within 10%':>18}{'test within 10%':>17}{'inside':>8}"
              f"{'committed':>11}")
        for f in r["folds"]:
            t, c = f["test"], f["test_at_committed"]
            print(f"{f['left_out']:<12}{f['chosen']!s:>8.6}{f['train']['within_10pct']:>10}/{f['train']['cells']:<7}"
                  f"{t['within_10pct']:>10}/{t['cells']:<6}{t['inside_interval']:>8}"
                  f"{c['within_10pct']:>7}/{c['cells']}")


if __name__ == "__main__":
    main()

"""The verdict's fitted constant, fitted again from the saved user-path runs, with leave-one-pair-out
cross-validation: engine-free, on each run's saved predicting snapshot (``truth_user*_<pair>.snapshot.json``) and
the speedups its results measured (``truth_user*.json``), judged as ``bench_truth_user.py --replay`` judges them.

The constant is :data:`specscope.verdict.uncertainty.DRAFT_FIXED`, the share of the draft's part of the running K's
step that a step pays whatever its K, with its range (0 to twice the point, as ``DRAFT_FIXED_RANGE`` is). It moves
only the cells at a K other than the running one. For each pair left out (tiny, deep01, deep01-rag, wide01, over
every run that has it), the point is chosen on the other pairs' cells (the most predictions within 10% of the
measured speedup; ties: the interval's coverage nearest 90%, then the smaller point), then scored on the left-out
pair's cells, beside the committed point's score there.

The drift assumed between moments (``SPEC_DRIFT``, ``PLAIN_DRIFT``) is not fitted here: every saved run measured
its own spreads, which the verdict uses instead, so no saved cell depends on it.

Run: python benchmarks/fit_constants.py (about a minute). Results: benchmarks/results/fit_constants.json.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, write
from benchmarks.bench_truth_user import BATCHES, RUNNING_K, judge
from specscope import codec
from specscope.verdict import estimate, uncertainty

GRID = (0.0, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25)
COMMITTED = uncertainty.DRAFT_FIXED


def runs() -> list[tuple[str, str, Any, list[dict[str, Any]]]]:
    """(run, pair, predicting snapshot, measured cells at a K other than the running one) for every saved run's
    pair that has its snapshot."""
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
                     if c["k"] != RUNNING_K and c.get("measured")]
            out.append((path.stem, pair, codec.from_dict(json.loads(snap_path.read_text())), cells))
    return out


def judged(point: float, saved: list[tuple[str, str, Any, list[dict[str, Any]]]]) -> dict[str, list[dict[str, Any]]]:
    """Each pair's cells judged with the draft's fixed share at ``point`` (its range 0 to twice it)."""
    uncertainty.DRAFT_FIXED, uncertainty.DRAFT_FIXED_RANGE = point, (0.0, 2 * point)
    out: dict[str, list[dict[str, Any]]] = {}
    for _, pair, snap, cells in saved:
        fresh = replace(snap)  # a snapshot's estimates are kept with it: a fresh one for each point
        out.setdefault(pair, []).extend(judge(cells, {b: estimate(fresh, batch_size=b) for b in BATCHES}))
    return out


def score(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Cells predicted, within 10% of the measured speedup, and inside their interval."""
    done = [c for c in cells if c.get("predicted") is not None]
    return {"cells": len(done), "within_10pct": sum(bool(c["within_10pct"]) for c in done),
            "inside_interval": sum(bool(c["inside_interval"]) for c in done if c["inside_interval"] is not None)}


def _add(scores: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: sum(s[key] for s in scores) for key in ("cells", "within_10pct", "inside_interval")}


def _rank(s: dict[str, Any], point: float) -> tuple[float, ...]:
    return (s["within_10pct"], -abs(s["inside_interval"] / s["cells"] - uncertainty.COVERAGE) if s["cells"] else 0.0,
            -point)


def main() -> None:
    saved = runs()
    by_point = {p: {pair: score(cells) for pair, cells in judged(p, saved).items()} for p in (*GRID, COMMITTED)}
    uncertainty.DRAFT_FIXED, uncertainty.DRAFT_FIXED_RANGE = COMMITTED, (0.0, 2 * COMMITTED)
    pairs = sorted(by_point[COMMITTED])
    folds = []
    for left_out in pairs:
        train = {p: _add([s for pair, s in by_point[p].items() if pair != left_out]) for p in GRID}
        chosen = max(GRID, key=lambda p: _rank(train[p], p))
        folds.append({"left_out": left_out, "chosen": chosen, "train": train[chosen],
                      "test": by_point[chosen][left_out], "test_at_committed": by_point[COMMITTED][left_out]})
    everywhere = {p: _add(list(by_point[p].values())) for p in GRID}
    result = {
        "constant": "uncertainty.DRAFT_FIXED (range 0 to twice it)", "committed": COMMITTED, "grid": list(GRID),
        "runs": sorted({run for run, *_ in saved}), "cells_at_other_k": {p: by_point[COMMITTED][p]["cells"]
                                                                          for p in pairs},
        "folds": folds,
        "cross_validated": _add([f["test"] for f in folds]),
        "committed_on_the_same_cells": _add([f["test_at_committed"] for f in folds]),
        "best_on_all_pairs": max(GRID, key=lambda p: _rank(everywhere[p], p)),
        "by_point": {str(p): {"all": everywhere[p], **by_point[p]} for p in GRID},
    }
    write("fit_constants", result, judged=f"replay of the saved truth_user runs ({len(saved)} pair runs)")
    print(f"{'left out':<12}{'chosen':>8}{'train within 10%':>18}{'test within 10%':>17}{'inside':>8}"
          f"{'committed':>11}")
    for f in folds:
        t, c = f["test"], f["test_at_committed"]
        print(f"{f['left_out']:<12}{f['chosen']:>8}{f['train']['within_10pct']:>10}/{f['train']['cells']:<7}"
              f"{t['within_10pct']:>10}/{t['cells']:<6}{t['inside_interval']:>8}{c['within_10pct']:>7}/{c['cells']}")


if __name__ == "__main__":
    main()

"""The verdict's chosen constants, chosen again from the saved user-path runs, with leave-one-pair-out
cross-validation: engine-free, on each run's saved predicting snapshot (``<run>_<pair>.snapshot.json``) and the
speedups its results measured (``<run>.json``), judged as ``bench_truth_user.py --replay`` judges them. The runs are
the benchmark's current result (``truth_user.json``, in the tree) and the earlier user-path runs, which are no longer
in the tree: :data:`HISTORY` names each one and the last commit that holds its files, and they are read from git
(``git show COMMIT:benchmarks/results/FILE``). A clone without that history (a shallow one) cannot run this: it says
so in one line and exits 2.

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
score there. The fresh runs (``truth_fresh_*``), the accuracy docs/evidence.md quotes, are not read: no constant is
chosen on them.

The drift between moments (:data:`specscope.verdict.uncertainty.DRIFT`), a factor on every cell's interval, is
fitted with ``--drift``: not by replaying the snapshots (those runs kept no count of their baseline's rounds or their
window's seconds, which the interval takes beside the drift) but from what each run measured of it, on the same
runs and pairs: at each batch size, the step times' ratio the verdict predicted from (the speculative step on the
sample it was predicted from, ``spec_step_ms``; the plain step at its calibration's price, ``plain_priced_ms``)
against the ratio on the sample measured (the speculative step there; the plain step served, ``plain_serving_ms``).
The drift is the normal spread whose central ``COVERAGE`` (90%) holds that share of the moves (their 90th
percentile of size / 1.645: a few slow spells do not inflate it as they would a root mean square, and it is the band
the interval states). Leaving each pair out, the value from the other pairs is scored on the left-out pair's moves:
how many of them its band holds.

Run: python benchmarks/fit_constants.py [--drift] [--results NAME] (about a minute; ``--drift``, a second).
Results: benchmarks/results/fit_constants.json, with ``--drift`` fit_drift.json (``--results`` names them
otherwise).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, ROOT, write
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


#: The user-path runs taken out of the tree (issue 49), each with the last commit that holds its files (its results
#: and its pairs' predicting snapshots: ``git log -1 --format=%H -- benchmarks/results/<run>.json``). Two saved no
#: predicting snapshot and add no cells: ``truth_user_day5ctx`` (``truth_user_day5`` judged again) and
#: ``truth_user_fit`` (whose snapshots ``truth_user_gate`` judges again).
HISTORY = (
    ("truth_user_anchor", "d828e3abd03db0756780a7fa0b89b2535a8eb382"),
    ("truth_user_corpus", "3e66290289a33161bde05ee3be64ad04481f58bc"),
    ("truth_user_day3", "38dbb3d92ebe0c056a2b148006f9743c80bdb7d9"),
    ("truth_user_day5", "c20aabe3464afe51578e8e6b81ac262a92162eec"),
    ("truth_user_day5b", "8ba411836b18cf7dc8275a59e34b7c26dbd9bdfa"),
    ("truth_user_day5ctx", "c20aabe3464afe51578e8e6b81ac262a92162eec"),
    ("truth_user_day6", "4bf98db8b5e81483859a6d805957e5bd57f1fcd0"),
    ("truth_user_drawn", "40a5773a7b39f781845e7b754d7a8d2639e7d883"),
    ("truth_user_fit", "efb3b758ae170be6552bc2d8809880996bfe9baf"),
    ("truth_user_gate", "efb3b758ae170be6552bc2d8809880996bfe9baf"),
    ("truth_user_quiet", "efb3b758ae170be6552bc2d8809880996bfe9baf"),
    ("truth_user_r5", "40a5773a7b39f781845e7b754d7a8d2639e7d883"),
    ("truth_user_slow", "d88885d1a5422c006dd830a5d9935dab40cc933c"),
    ("truth_user_windows", "d88885d1a5422c006dd830a5d9935dab40cc933c"),
)
#: The benchmark's current result, read from the tree.
CURRENT = "truth_user"


class NoHistory(Exception):
    """A run of :data:`HISTORY` that git cannot give: a shallow clone, or no repository at all."""


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError as e:
        raise NoHistory(f"git cannot run ({e})") from e
    if done.returncode != 0:
        raise NoHistory(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"git {args[0]} failed")
    return done.stdout


def history_reader(commit: str) -> tuple[set[str], Callable[[str], str]]:
    """The results files ``commit`` holds, and a reader of one of them by name."""
    _git("cat-file", "-e", f"{commit}^{{commit}}")
    names = _git("ls-tree", "--name-only", commit, "benchmarks/results/").splitlines()
    return {Path(n).name for n in names}, lambda name: _git("show", f"{commit}:benchmarks/results/{name}")


def documents() -> list[tuple[str, str, dict[str, Any], Callable[[str], str] | None]]:
    """(run, pair, the pair's results, a reader of its predicting snapshot or None where the run saved none) for
    every saved run's pair: the current run from the tree, the earlier ones from git (:data:`HISTORY`)."""
    def in_tree(name: str) -> str:
        return (RESULTS / name).read_text()

    if _git("rev-parse", "--is-shallow-repository").strip() == "true":
        raise NoHistory("this clone is shallow")
    sources: list[tuple[str, set[str], Callable[[str], str]]] = [
        (CURRENT, {p.name for p in RESULTS.iterdir()}, in_tree)]
    sources += [(stem, *history_reader(commit)) for stem, commit in HISTORY]
    out = []
    for stem, names, read in sorted(sources, key=lambda s: s[0]):
        doc = json.loads(read(f"{stem}.json"))
        for pair, result in doc.get("pairs", {}).items():
            snapshot = f"{stem}_{pair}.snapshot.json"
            out.append((stem, pair, result,
                        (lambda name=snapshot, read=read: read(name)) if snapshot in names else None))
    return out


def runs() -> Saved:
    """(run, pair, predicting snapshot, measured cells) for every saved run's pair that has its snapshot."""
    out = []
    for stem, pair, result, snapshot in documents():
        if snapshot is None:
            continue
        cells = [{k: c[k] for k in ("k", "batch", "measured", "rounds")} for c in result["cells"] if c.get("measured")]
        out.append((stem, pair, codec.from_dict(json.loads(snapshot())), cells))
    return out


def judged(constant: Constant, value: float, saved: Saved) -> dict[str, list[dict[str, Any]]]:
    """Each pair's cells that ``constant`` moves, judged with it at ``value``."""
    # Imported here: bench_truth_user imports vLLM, and a clone without the runs' history says so before that.
    from benchmarks.bench_truth_user import BATCHES, RUNNING_K, judge

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


#: The drift the interval took before it was fitted: the speculative step's 6.5% and the plain step's 4.6%, assumed
#: (``uncertainty.SPEC_DRIFT``, ``PLAIN_DRIFT`` until commit ec7656b), together.
FORMER_DRIFT = round(math.hypot(0.065, 0.046), 3)


def ratio_move(result: dict[str, Any], batch: str) -> float | None:
    """How far the step times' ratio a saved pair predicted from at ``batch`` (the speculative step on the sample it
    was predicted from, the plain step as its calibration priced it) was from the ratio on the sample measured (the
    speculative step there, the plain step served beside it); None where the run lacks either."""
    spec = result.get("spec_step_ms", {})
    then, now = spec.get("sample_a", {}).get(batch), spec.get("sample_b", {}).get(batch)
    priced, served = result.get("plain_priced_ms", {}).get(batch), result.get("plain_serving_ms", {}).get(batch)
    return (priced / then) / (served / now) - 1.0 if then and now and priced and served else None


#: The half-width of a standard normal's central :data:`uncertainty.COVERAGE` (1.645 at 90%).
BAND = statistics.NormalDist().inv_cdf(0.5 + uncertainty.COVERAGE / 2)


def spread_holding(moves: list[float]) -> float:
    """The normal spread whose central :data:`uncertainty.COVERAGE` holds that share of ``moves``: their percentile
    of size at it over :data:`BAND`."""
    size = sorted(abs(m) for m in moves)
    return size[round(uncertainty.COVERAGE * (len(size) - 1))] / BAND


def held(moves: list[float], spread: float) -> int:
    """How many of ``moves`` the central :data:`uncertainty.COVERAGE` of a normal ``spread`` holds."""
    return sum(abs(m) <= BAND * spread for m in moves)


def fit_drift(by_pair: dict[str, list[float]], committed: float) -> dict[str, Any]:
    """One drift fitted on every pair's moves, and chosen on all pairs but one and scored on that one, for each."""
    folds = []
    for left_out, moves in sorted(by_pair.items()):
        chosen = spread_holding([m for pair, ms in by_pair.items() if pair != left_out for m in ms])
        folds.append({"left_out": left_out, "chosen": round(chosen, 3), "moves": len(moves),
                      "held": held(moves, chosen), "held_at_committed": held(moves, committed),
                      "own": round(spread_holding(moves), 3)})
    every = [m for ms in by_pair.values() for m in ms]
    return {"fitted": round(spread_holding(every), 3), "committed": committed, "moves": len(every),
            "root_mean_square": round(math.sqrt(sum(m * m for m in every) / len(every)), 3), "folds": folds,
            "cross_validated": {"moves": sum(f["moves"] for f in folds), "held": sum(f["held"] for f in folds)},
            "committed_on_the_same_moves": {"moves": len(every), "held": held(every, committed)},
            "former": {"value": FORMER_DRIFT, "held": held(every, FORMER_DRIFT)}}


def drift() -> tuple[list[str], dict[str, Any]]:
    """The runs read, and the drift fitted from their pairs' moves (:func:`ratio_move`)."""
    by_pair: dict[str, list[float]] = {}
    read = set()
    for run, pair, result, snapshot in documents():
        if snapshot is None:  # a run judged again, whose moves another run's files hold
            continue
        read.add(run)
        by_pair.setdefault(pair, []).extend(m for b in ("1", "4", "16") if (m := ratio_move(result, b)) is not None)
    return sorted(read), {"constant": "uncertainty.DRIFT",
                          **fit_drift({p: ms for p, ms in by_pair.items() if ms}, uncertainty.DRIFT)}


def _json(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drift", action="store_true", help="fit the drift between moments (uncertainty.DRIFT)")
    ap.add_argument("--results", help="the results' name in benchmarks/results (fit_constants; fit_drift)")
    args = ap.parse_args(argv)
    try:
        if args.drift:
            read, fitted = drift()
            write(args.results or "fit_drift", {"runs": read, "drift": fitted},
                  judged=f"fitted from the saved truth_user runs ({len(read)} runs)")
            return
        saved = runs()
    except NoHistory as e:
        print(f"fit_constants: the earlier user-path runs are read from git history, which this clone lacks ({e}): "
              "fetch the full history (git fetch --unshallow)", file=sys.stderr)
        sys.exit(2)
    results = [cross_validate(c, saved) for c in CONSTANTS]
    write(args.results or "fit_constants", {"runs": sorted({run for run, *_ in saved}), "constants": results},
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

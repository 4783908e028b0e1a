"""Where the verdict's curve over K misses, taken apart: the tokens a step gains and the step's cost, each K's
predicted against its own engine's steps.

A fresh truth run (``bench_truth_user.py --fresh``; a diagnostic ``--ks`` run too, ``diag_*``) keeps each measured
K's decode steps on sample B, and the advice engine's (``steps_by_k``: tokens a request gained per step, the step's
ms, at each batch size). The verdict prices K = j from the running K's snapshot
(:func:`specscope.verdict.speedup.decode_step`): the tokens a step gains at j and the step's cost. Both are set here
beside the running K's, predicted and measured, so that the machine's speed, which moves all of a moment's steps
alike, drops out of the comparison:

- ``tokens``: (tokens at j / at the running K) predicted over measured, minus one. Positive: acceptance at j
  over-valued (past the drafted positions, the geometric extension).
- ``tokens_unkept``: the same, had a request's last step kept every token its drafts gained (the verdict before
  it priced what requests' ends drop: :func:`specscope.core.acceptance.kept_share`).
- ``step``: (step at j / at the running K) predicted over measured, minus one. Negative: the step at j priced too
  cheap.
- ``decode``: (1 + tokens) / (1 + step) − 1, the decode speedup at j relative to the running K's, over-valued where
  positive.

Each K's engine ran minutes apart from the running K's, so the step ratio carries the machine's drift between them.
Engine-free: it reads saved results.

    python benchmarks/k_curve.py    # writes benchmarks/results/k_curve.json
    python benchmarks/k_curve.py --only truth_fresh_155631_ngram --name k_curve_checked    # some runs only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, as_run_results, write
from specscope.core import acceptance, codec
from specscope.verdict import estimate, scheduled_k


def rows_of(stem: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each (pair and traffic, batch size, K) of one results file (``stem``) that kept ``steps_by_k``."""
    out = []
    for name, pair in doc["pairs"].items():
        steps = pair.get("steps_by_k")
        if not steps:
            continue
        snap = codec.from_dict(json.loads((RESULTS / f"{stem}_{name}.snapshot.json").read_text()))
        k = snap.engine.num_speculative_tokens
        mine = steps.get(str(k))
        if not k or not mine:
            continue
        for b in sorted(mine["tokens_per_step"], key=int):
            est = estimate(snap, batch_size=int(b))
            tok_k, ms_k = mine["tokens_per_step"][b], mine["step_ms"][b]
            if est is None or est.decode_at is None or not tok_k or not ms_k:
                continue
            pred_tok_k, pred_step_k = est.decode_at(k)
            for label, own in steps.items():
                j = scheduled_k(pair["advice"]["config"], int(b)) if label == "advice" else int(label)
                tok, ms = own["tokens_per_step"].get(b), own["step_ms"].get(b)
                if j in (0, k) or not tok or not ms:
                    continue
                pred_tok, pred_step = est.decode_at(j)
                tokens = (pred_tok / pred_tok_k) / (tok / tok_k) - 1.0
                unkept = (est.decode_at(j, kept=())[0] / pred_tok_k) / (tok / tok_k) - 1.0
                step = (pred_step / pred_step_k) / (ms / ms_k) - 1.0
                out.append({"file": f"{stem}.json", "pair": name, "batch": int(b), "k": j, "advice": label == "advice",
                            "tokens_measured": tok, "tokens_predicted": round(pred_tok * tok_k / pred_tok_k, 3),
                            "step_ms_measured": ms, "step_ms_predicted": round(pred_step * ms_k / pred_step_k, 2),
                            "tokens": round(tokens, 3), "tokens_unkept": round(unkept, 3), "step": round(step, 3),
                            "decode": round((1.0 + tokens) / (1.0 + step) - 1.0, 3)})
    return out


def summary(rows: list[dict[str, Any]], running_k: int = 4) -> dict[str, dict[str, Any]]:
    """The medians of each part over the Ks below the running K, just above it (up to 6) and far above it."""
    groups = {"below the running K": lambda j: j < running_k, f"{running_k + 1}-6": lambda j: running_k < j <= 6,
              "7 and over": lambda j: j > 6}
    out = {}
    for name, within in groups.items():
        sel = [r for r in rows if within(r["k"])]
        if sel:
            out[name] = {"cells": len(sel), **{part: round(statistics.median(r[part] for r in sel), 3)
                                               for part in ("tokens", "tokens_unkept", "step", "decode")}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="STEM",
                        help="read only these results files (e.g. truth_fresh_155631_ngram); default: every as-run "
                             "fresh and diagnostic run")
    parser.add_argument("--name", default="k_curve", help="the results file to write (default: k_curve)")
    parser.add_argument("--without-extension-check", action="store_true",
                        help="price as the verdict did before 2026-12-07: past the drafted positions geometric with "
                             "α (written as a replay)")
    args = parser.parse_args()
    judged = "as-run"
    if args.without_extension_check:
        acceptance.extension_check = lambda *_, **__: 1.0
        judged = "replay with acceptance.extension_check off"
    runs = as_run_results("truth_fresh_*.json", "diag_*.json")
    if args.only:
        runs = [(stem, doc) for stem, doc in runs if stem in args.only]
        if {stem for stem, _ in runs} != set(args.only):
            sys.exit(f"k_curve: no as-run results for {sorted(set(args.only) - {stem for stem, _ in runs})}")
    rows = [r for stem, doc in runs for r in rows_of(stem, doc)]
    write(args.name, {"what": __doc__.splitlines()[0], "summary": summary(rows), "rows": rows,
                      **({"only": args.only} if args.only else {})}, judged=judged)


if __name__ == "__main__":
    main()

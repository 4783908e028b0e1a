"""Does the demo tell the truth with its own numbers, run after run? ``specscope demo --headless`` run N times, one
at a time, as a newcomer runs it (vLLM's default process layout): for the good draft at batch 1 and 16, the
measured speedup (median of three alternating rounds against the plain target) beside specscope's prediction and
its interval, and the alerts each scenario fired.

Goals: predicted (before, on another sample) within 10% of measured at both batch sizes in every run, at K=6 and for
the advice followed; no ``SpecscopeSpeculationNotPaying`` on the good draft where it measured 1.05x or more.

Run: python benchmarks/bench_demo.py [--runs 5]   (about 3 minutes a run on 2 cores)
     python benchmarks/bench_demo.py --logs A.log B.log ...   (judge saved outputs of ``demo --headless``)
Results: benchmarks/results/demo_runs.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write

GOOD = "good draft"
#: The demo's lines that set a measurement on sample B beside the prediction made before it from sample A: at the
#: running K, and for the advice followed as vLLM takes it.
LINE = re.compile(r"good draft at batch (\d+): (measured|its advice measured) ([\d.]+)x(?: on sample B)?, predicted "
                  r"before (K=\d+|speculation removed): ([\d.]+)x(?: \(([\d.]+)-([\d.]+)x\))?")


def judge(out: str) -> dict[str, Any]:
    """One run's good-draft cells and alerts, from the headless demo's output."""
    cells = []
    for b, kind, m, k, p, lo, hi in LINE.findall(out):
        measured, predicted = float(m), float(p)
        cells.append({"batch": int(b), "config": ("advice " if kind.startswith("its") else "running ") + k,
                      "measured": measured, "predicted": predicted,
                      "interval": [float(lo), float(hi)] if lo else None,
                      "error": round(predicted / measured - 1.0, 3),
                      "within_10pct": abs(predicted / measured - 1.0) <= 0.10,
                      "inside_interval": bool(lo) and float(lo) <= measured <= float(hi)})
    fired = dict(re.findall(r"\n== ([^\n]+)\n.*?alerts fired: ([^\n]*)", out, re.S))
    good = next((v for k, v in fired.items() if k.startswith(GOOD)), "")
    running = [c for c in cells if c["config"].startswith("running")]
    paying = bool(running) and min(c["measured"] for c in running) >= 1.05
    return {"cells": cells, "alerts": fired,
            "wrong_not_paying": paying and "SpecscopeSpeculationNotPaying" in good}


def run_once() -> str:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "demo", "--headless"], capture_output=True,
                       text=True, timeout=900, env=env)
    if r.returncode:
        raise SystemExit(f"the demo failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--logs", nargs="*", type=Path, help="judge these saved outputs instead of running the demo")
    args = ap.parse_args()
    runs = []
    for i, log in enumerate(args.logs or [None] * args.runs):
        t0 = time.monotonic()
        out = log.read_text() if log else run_once()
        runs.append({"run": i + 1, **({} if log else {"seconds": round(time.monotonic() - t0)}), **judge(out)})
        print(runs[-1]["cells"], flush=True)
    cells = [c for r in runs for c in r["cells"]]
    write("demo_runs", {
        "workload": "specscope demo --headless as shipped: the good draft (deep01's layer 0, K=6) predicted at batch "
                    "1 and 16 from one run on sample A against the demo's calibration, then measured on sample B at "
                    "K=6 and as its advice configures it, each as the median of three alternating 5 s rounds against "
                    "the plain target (prompts walked through with their own output lengths, prefix caching off)",
        "summary": {"runs": len(runs), "cells": len(cells), "within_10pct": sum(c["within_10pct"] for c in cells),
                    "inside_interval": sum(c["inside_interval"] for c in cells),
                    "runs_all_within_10pct": sum(all(c["within_10pct"] for c in r["cells"]) for r in runs),
                    "wrong_not_paying": sum(r["wrong_not_paying"] for r in runs)},
        "runs": runs})


if __name__ == "__main__":
    main()

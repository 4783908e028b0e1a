"""Advice under requests arriving at random (issue 26.6): every follow-the-advice check holds the batch full, but
vLLM picks K from each step's batch, which moves as requests come and go. Through real ``vllm serve`` servers of
the deep01 pair (where speculation pays at small batches and fades at large ones), requests arrive as a Poisson
process at several rates; for each configuration and rate: output tokens/s, time per output token and time to
first token (p50 and p99, from streamed completions).

1. ``specscope calibrate`` with its defaults writes the baseline.
2. A server at K = 4 (the running K) with that baseline takes every rate; after each, its snapshot (the window
   holds that rate alone) gives specscope's advice for that traffic: the traffic's predicted speedup, the one K best
   for it (each batch size's speedup weighed by the step time spent there) and whether a schedule threshold sits
   where the engine spends its time; after all, the recommended schedule from the K table of every batch size run.
3. The same traffic without speculation, at each advised fixed K (when it is not 4) and under the recommended
   schedule, each on its own server.

Run: python benchmarks/bench_arrivals.py [--rates 0.5,2,5] [--seconds 30]
Results: benchmarks/results/arrivals.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import httpx

from benchmarks._common import serve, write
from specscope import tiny_models
from specscope.core import codec
from specscope.verdict import k_schedule, recommended_config, schedule_text, traffic_speedup
from specscope.verdict.traffic import best_single_k, flapping
from tests.e2e.test_server import stop

TOKENS = 64
PROMPTS = tiny_models.prompts(256, seed=61)
ENGINE = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "32"]


def one(url: str, model: str, prompt: str, out: list[dict[str, float]]) -> None:
    """A streamed completion: its time to first token, time per output token and tokens."""
    t0 = time.perf_counter()
    first, chunks = None, 0
    body = {"model": model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    if first is not None:
        out.append({"ttft": first - t0, "tpot": (end - first) / max(1, TOKENS - 1), "start": t0, "end": end})


def arrivals(url: str, model: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` a second for ``seconds``; every request run to the end."""
    rng = random.Random(seed)
    done: list[dict[str, float]] = []
    threads = []
    t_end = time.perf_counter() + seconds
    i = 0
    next_at = time.perf_counter()
    while next_at < t_end:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        th = threading.Thread(target=one, args=(url, model, PROMPTS[(seed * 97 + i) % len(PROMPTS)], done))
        th.start()
        threads.append(th)
        i += 1
        next_at += rng.expovariate(rate)
    for th in threads:
        th.join()
    span = max(d["end"] for d in done) - min(d["start"] for d in done)

    def q(key: str, p: float) -> float:
        values = sorted(d[key] for d in done)
        return round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 1)

    return {"requests": len(done), "tok_s": round(len(done) * TOKENS / span, 1),
            "tpot_ms": {"p50": q("tpot", 0.5), "p99": q("tpot", 0.99)},
            "ttft_ms": {"p50": q("ttft", 0.5), "p99": q("ttft", 0.99)}}


def advice(url: str) -> dict[str, Any]:
    """specscope's advice from the server's snapshot."""
    snap = codec.from_dict(httpx.get(f"{url}/specscope/snapshot", timeout=30).json())
    schedule = k_schedule(snap)
    best = best_single_k(snap)
    traffic = traffic_speedup(snap)
    flap = flapping(snap, schedule)
    return {"recommended": recommended_config(snap), "schedule": schedule,
            "best_single_k": best[0] if best else None, "best_single_k_speedup": round(best[1], 3) if best else None,
            "traffic": traffic.explain() if traffic else None, "flap": flap.explain() if flap else None,
            "time_at_batch": {t.batch_size: round(t.steps * t.mean_s + t.prefill_s, 2)
                              for t in snap.window.step_times.times},
            "schedule_text": schedule_text(snap)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="0.5,2,5")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    tiny = tiny_models.build()
    target, draft = tiny["deep01-target"], tiny["deep01-draft"]
    work = Path(tempfile.mkdtemp(prefix="specscope-arrivals-"))
    baseline = work / "baseline.json"
    subprocess.run([sys.executable, "-m", "specscope.cli", "calibrate", str(target), "--batch-sizes", "1,2,4,8,16",
                    "--out", str(baseline), "--engine-arg", "max_model_len=1024", "--engine-arg", "enforce_eager=true",
                    "--engine-arg", "dtype=float32", "--engine-arg", "max_num_seqs=32"], check=True)
    draft_spec = {"method": "draft_model", "model": str(draft)}
    results: dict[str, Any] = {}

    def run(name: str, spec: dict[str, Any] | None, advise: bool = False) -> None:
        print(f"== {name}: {spec}", flush=True)
        proc, url = serve(target, spec, ENGINE, work / f"{name}.log", {"SPECSCOPE_BASELINE": str(baseline)})
        try:
            one(url, str(target), PROMPTS[0], [])  # warm
            results[name] = {"config": spec, "by_rate": {}, "advice_by_rate": {}}
            for n, rate in enumerate(rates):
                results[name]["by_rate"][str(rate)] = got = arrivals(url, str(target), rate, args.seconds, n)
                print(f"   rate {rate}/s: {got}", flush=True)
                if advise:  # the window (60 s) holds this rate's traffic alone: then idle it out
                    results[name]["advice_by_rate"][str(rate)] = given = advice(url)
                    print(f"   advice: {json.dumps(given)}", flush=True)
                    if n + 1 < len(rates):
                        time.sleep(max(0.0, 62.0 - args.seconds))
            if spec is not None:
                results[name]["advice"] = advice(url)  # the K table over every rate's batch sizes
        finally:
            stop(proc)

    run("k4", {**draft_spec, "num_speculative_tokens": 4}, advise=True)
    by_rate = results["k4"]["advice_by_rate"]
    run("plain", None)
    for k in sorted({a["best_single_k"] for a in by_rate.values() if a["best_single_k"] not in (None, 4)}):
        run(f"k{k}", {**draft_spec, "num_speculative_tokens": k})
    recommended = results["k4"]["advice"]["recommended"]
    if recommended and "num_speculative_tokens_per_batch_size" in recommended:
        run("schedule", {**draft_spec, **recommended})
    plain = results["plain"]["by_rate"]
    table = {}
    for rate in map(str, rates):
        best = by_rate[rate]["best_single_k"]
        row = {"plain_tok_s": plain[rate]["tok_s"], "advised_fixed_k": best}
        for name, res in results.items():
            if name != "plain":
                r = res["by_rate"][rate]
                row[name] = {"speedup": round(r["tok_s"] / plain[rate]["tok_s"], 3), "tpot_p50": r["tpot_ms"]["p50"],
                             "tpot_p99": r["tpot_ms"]["p99"], "ttft_p99": r["ttft_ms"]["p99"]}
        row["plain"] = {"tpot_p50": plain[rate]["tpot_ms"]["p50"], "tpot_p99": plain[rate]["tpot_ms"]["p99"],
                        "ttft_p99": plain[rate]["ttft_ms"]["p99"]}
        row["predicted_traffic"] = by_rate[rate]["traffic"]
        row["flap"] = by_rate[rate]["flap"]
        table[rate] = row
    write("arrivals", {"pair": "deep01", "tokens": TOKENS, "rates": rates, "seconds": args.seconds,
                       "recommended": recommended, "by_rate": table, "results": results})


if __name__ == "__main__":
    main()

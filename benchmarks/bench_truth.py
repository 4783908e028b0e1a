"""Is the verdict true? specscope's predicted speedup against the measured one, for every K and batch size.

For each target/draft pair, for K in {1, 2, 3, 4, 6} and batch sizes {1, 4, 16}:

- **measured**: output tokens/s with speculation / without, greedy, 96 tokens a request, with the batch held full
  for a few seconds (each finished request replaced by the next prompt, as a serving engine with a queue does),
  the plain and the speculative engine alive together and run alternately, the median of the per-round ratios;
- **model on measured runs**: the same estimate on the measured runs' own data (their step times, tokens and
  prefill, against the plain engine's steps in those runs): the model's error without the noise of separate runs;
- **predicted**: ``verdict.estimate(snapshot, batch_size=b)`` from prediction runs kept apart from the
  measured ones: in each round, after the measured runs, the plain target is calibrated on the pair's prompts
  (``measure_step_times``, what ``specscope calibrate --prompts`` writes) and the speculative engine runs the
  workload once more into a hub of its own; the median over rounds. This machine's speed drifts by ±10-25%
  over minutes and has slow spells of 10-15% lasting seconds (plain vLLM alone included), so predictions and
  measurements are interleaved and both
  are medians; the prediction from the first round alone (one short run) is reported beside it.

Every run takes the same prompts in the same order, so the comparison tests specscope's measurements and model,
not how well a handful of prompts stands for another handful (with greedy decoding, acceptance differs by ±10%
between small prompt sets). Batches are held full because that is the speedup at a batch size: a fixed batch
that drains would end on partial batches, and only under speculation (its requests finish at different steps).

Also: the prediction for every K made from the K=4 engine's short run alone (what ``specscope top`` shows an
operator running K=4), and whether the K it recommends at each batch size measures within 5% of the best K measured
(K = 0, speculation off, included). Pairs: the deep family (f = 0.01 and 0.03; speculation pays on a CPU), the tiny
family's copy and 10%-noise drafts (same-size drafts: c ≈ 1), the deep01 target with its EAGLE-3 head (method
``eagle3``) and its EAGLE-1 head (method ``eagle``), and n-gram lookup on the deep01 target with prompts it can
look up (each prompt followed by the target's own greedy continuation and the prompt again, as retrieval-augmented
prompts quote the answer) and with the plain prompts; and the deep01 target as a MiMo model with its MTP layer
(method ``mtp``). For each cell the c the estimate used and c from the configs are kept, so the ratio tells
operators without a baseline how far the config estimate is off.

Run: python benchmarks/bench_truth.py [--pairs deep01,deep03,copy,noise10,eagle3,eagle,ngram-retrieval,ngram-novel,
mtp] [--rounds 3]
Results: benchmarks/results/truth_<pair>.json (and .md) for each pair as it is measured, then truth.json (and
truth.md, the table) joining this run's pairs; ``--merge FILE...`` joins saved runs' files into truth.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import RESULTS, write
from specscope import tiny_models
from specscope.engine.measure import measure_step_times, steady_throughput


@dataclass(frozen=True)
class Pair:
    """A target and how it speculates: a draft model, an EAGLE-3 or EAGLE-1 head, n-gram lookup or the target's own
    MTP layer (``draft`` None for the last two)."""

    target: str
    draft: str | None
    method: str = "draft_model"
    #: "plain" (the workload's prompts) or "retrieval" (each followed by the target's greedy continuation and
    #: itself again: text n-gram lookup can find).
    prompts: str = "plain"

    def speculative_config(self, models: dict[str, Path], k: int) -> dict[str, Any]:
        if self.method == "ngram":
            return {"method": self.method, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "num_speculative_tokens": k}
        if self.draft is None:
            return {"method": self.method, "num_speculative_tokens": k}
        return {"method": self.method, "model": str(models[self.draft]), "num_speculative_tokens": k}


PAIRS = {"deep01": Pair("deep01-target", "deep01-draft"), "deep03": Pair("deep03-target", "deep03-draft"),
         "copy": Pair("target", "copy"), "noise10": Pair("target", "noise10"),
         "eagle3": Pair("deep01-target", "deep01-eagle3", "eagle3"),
         "eagle": Pair("deep01-target", "deep01-eagle", "eagle"),
         "ngram-retrieval": Pair("deep01-target", None, "ngram", "retrieval"),
         "ngram-novel": Pair("deep01-target", None, "ngram"),
         "mtp": Pair("deep01-mimo", None, "mtp")}
KS = (1, 2, 3, 4, 6)
BATCHES = (1, 4, 16)
TOKENS = 96
#: The workload's prompts, taken in order by every engine and run.
PROMPTS = tiny_models.prompts(64, seed=31)
#: Prefix caching off: every round repeats the workload's prompts, which would otherwise turn prefill into cache
#: hits from the second round on, and the prediction run into a different workload from the measured one.
ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False}


#: Seconds each throughput measurement keeps its batch full.
WINDOW_S = 5.0


def steady(llm: Any, batch: int, prompts: list[str]) -> float:
    """Output tokens/s with the batch held full for :data:`WINDOW_S` (``specscope.engine.measure.steady_throughput``):
    every engine, run and round of a pair takes its prompts in the same order."""
    return steady_throughput(llm, batch, WINDOW_S, prompts, TOKENS)


def retrieval_prompts(plain: Any) -> list[str]:
    """Each workload prompt, the target's greedy continuation of it, and the prompt again: the answer is quoted."""
    from vllm import SamplingParams

    outs = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)
    return [f"{p}{o.outputs[0].text} {p}" for p, o in zip(PROMPTS, outs, strict=True)]


def shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def measured_round(plain: Any, spec: Any, r: int, prompts: list[str]) -> dict[int, float]:
    """Speculative tok/s / plain tok/s at each batch size, the two run one after the other (order alternating)."""
    out = {}
    for b in BATCHES:
        if r % 2:
            s, p = steady(spec, b, prompts), steady(plain, b, prompts)
        else:
            p, s = steady(plain, b, prompts), steady(spec, b, prompts)
        out[b] = s / p
    return out


def run_k(plain: Any, spec: Any, rounds: int, prompts: list[str]) -> tuple[
        dict[int, float], dict[int, list[Any]], dict[str, Any]]:
    """Measured speedups and predictions, the predictions from runs separate from the measured ones.

    Each round runs the workload measured (plain and speculative, alternating), then a prediction run: the plain
    target calibrated (``measure_step_times``, as ``specscope calibrate`` does) and the workload once more on the
    speculative engine into a hub of its own, whose estimate is that round's prediction. Both sides are medians
    over rounds: this machine has slow spells of 10-15% lasting seconds, and drifts over minutes. Returns the
    measured speedups (medians), each round's estimates by batch size, and the raw inputs of both sides (step
    times, tokens per step, prefill) for the record.
    """
    import specscope
    from specscope.core.model import StepProfile
    from specscope.verdict import estimate

    # Windows as long as the whole measurement: the model-on-measured-runs check pools every round on both sides.
    measuring, plain_measuring = specscope.Hub(window_s=3600), specscope.Hub(window_s=3600)
    plain_hub = plain.specscope
    ratios: dict[int, list[float]] = {b: [] for b in BATCHES}
    estimates: dict[int, list[Any]] = {b: [] for b in BATCHES}
    calibrations: dict[int, list[float]] = {b: [] for b in BATCHES}
    for r in range(rounds):
        specscope.instrument(spec, measuring)
        specscope.instrument(plain, plain_measuring)
        for b, ratio in measured_round(plain, spec, r, prompts).items():
            ratios[b].append(ratio)
        specscope.instrument(plain, plain_hub)
        baseline = measure_step_times(plain, BATCHES, tokens=TOKENS, rounds=1, prompts=prompts)
        for t in baseline.times:
            calibrations[t.batch_size].append(1e3 * t.mean_s)
        predicting = specscope.Hub()
        predicting.set_baseline(baseline)
        specscope.instrument(spec, predicting)
        for b in BATCHES:
            steady(spec, b, prompts)
        for b in BATCHES:
            estimates[b].append(estimate(predicting.snapshot(), batch_size=b))

    def inputs(hub: Any) -> dict[str, Any]:
        life = hub.snapshot().lifetime
        rows = [t for t in life.step_times.times if t.steps >= 20]
        return {"step_ms": {t.batch_size: round(1e3 * t.mean_s, 2) for t in rows},
                "tokens_per_step": {t.batch_size: round(t.tokens_per_request_step or 0, 3) for t in rows},
                "prefill_steps_s": {t.batch_size: [t.prefill_steps, round(t.prefill_s, 3)] for t in rows}}

    raw = {"plain_calibration_step_ms": {b: [round(x, 2) for x in v] for b, v in calibrations.items()},
           "plain_measured": inputs(plain_measuring), "spec_measured": inputs(measuring),
           "spec_predicting_last_round": inputs(predicting),
           "measured_ratios": {b: [round(x, 3) for x in v] for b, v in ratios.items()},
           "predicted_per_round": {b: [None if e is None else round(e.expected_speedup, 3) for e in v]
                                   for b, v in estimates.items()}}
    # The model alone: specscope's estimate on the measured runs' own data, against the plain engine's own steps
    # there (the inputs of the measured speedup, without the noise of separate runs).
    measuring.set_baseline(StepProfile(plain_measuring.snapshot().lifetime.step_times.times, "plain, measured runs"))
    on_measured = measuring.snapshot()
    raw["model_on_measured_runs"] = {b: None if (e := estimate(on_measured, batch_size=b)) is None
                                     else round(e.expected_speedup, 3) for b in BATCHES}
    return {b: statistics.median(v) for b, v in ratios.items()}, estimates, raw


def median_estimate(ests: list[Any]) -> tuple[float | None, tuple[float, ...]]:
    """The median over rounds of the speedup at the running K, and of the speedup at each K."""
    ests = [e for e in ests if e is not None]
    if not ests:
        return None, ()
    by_k = tuple(statistics.median(e.by_k[j] for e in ests) for j in range(len(ests[0].by_k)))
    return statistics.median(e.expected_speedup for e in ests), by_k


def run_pair(name: str, models: dict[str, Path], rounds: int, measured_ks: tuple[int, ...]) -> dict[str, Any]:
    from vllm import SamplingParams

    import specscope

    pair = PAIRS[name]
    target = str(models[pair.target])
    # The small family's models hold 512 positions, the deep family's 1024.
    engine = {**ENGINE, "max_model_len": ENGINE["max_model_len"] if pair.target.startswith("deep") else 512}
    plain = specscope.LLM(target, specscope_hub=specscope.Hub(), **engine)
    prompts = retrieval_prompts(plain) if pair.prompts == "retrieval" else PROMPTS
    cells: dict[int, dict[int, dict[str, Any]]] = {}
    from_k4: dict[int, tuple[float, ...]] = {}
    inputs: dict[int, dict[str, Any]] = {}
    recommended: dict[int, int] = {}
    ks = list(measured_ks)
    i = 0
    while i < len(ks):
        k = ks[i]
        i += 1
        spec_llm = specscope.LLM(target, specscope_hub=specscope.Hub(),
                                 speculative_config=pair.speculative_config(models, k), **engine)
        for llm in (plain, spec_llm):  # warm-up
            for b in BATCHES:
                llm.generate(prompts[:b], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        measured, estimates, raw = run_k(plain, spec_llm, rounds, prompts)
        snap = spec_llm.snapshot()
        configs_c = None if snap.cost_ratio is None else snap.cost_ratio.value
        cells[k] = {}
        for b in BATCHES:
            predicted, by_k = median_estimate(estimates[b])
            first = estimates[b][0]
            cells[k][b] = {"measured": round(measured[b], 3),
                           "predicted": None if predicted is None else round(predicted, 3),
                           "predicted_first_run": None if first is None else round(first.expected_speedup, 3),
                           "model_on_measured_runs": raw["model_on_measured_runs"][b],
                           "c_basis": None if first is None else first.c_basis,
                           "c": None if first is None else round(first.c, 4),
                           "c_from_configs": None if configs_c is None else round(configs_c, 4),
                           "tokens_per_step": None if first is None else round(first.tokens_per_step, 3),
                           "prefill_share": None if first is None or first.prefill_share is None
                           else round(first.prefill_share, 3)}
            if k == 4:
                from_k4[b] = by_k
                recommended[b] = max(range(len(by_k)), key=lambda j: (by_k[j], -j)) if by_k else 4
        inputs[k] = raw
        print(f"{name} K={k} inputs: {raw}", flush=True)
        spec = snap.lifetime.spec
        print(f"{name} K={k}: acceptance {spec and spec.acceptance_rate} alpha {spec and spec.alpha} "
              + "  ".join(f"b{b} measured {cells[k][b]['measured']} predicted {cells[k][b]['predicted']}"
                          for b in BATCHES), flush=True)
        if k == 4:
            ks += sorted({r for r in recommended.values() if r and r not in ks})  # measure a recommendation too
        shutdown(spec_llm)
    shutdown(plain)
    return {"target": pair.target, "draft": pair.draft or pair.method, "method": pair.method,
            "prompts": pair.prompts, "cells": cells, "from_k4": from_k4,
            "recommended": recommended, "inputs": inputs}


def summarize(pairs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Errors per cell, verdicts, and the recommended K against the best measured K."""
    errors, verdicts, recs = [], [], []
    first_errors: list[float] = []
    model_errors: list[float] = []
    for name, p in pairs.items():
        cells = p["cells"]
        for k in KS:
            for b in BATCHES:
                c = cells.get(k, {}).get(b)
                if c is None or c["predicted"] is None:
                    continue
                err = c["predicted"] / c["measured"] - 1
                errors.append((name, k, b, err))
                if c.get("predicted_first_run") is not None:
                    first_errors.append(c["predicted_first_run"] / c["measured"] - 1)
                if c.get("model_on_measured_runs") is not None:
                    model_errors.append(c["model_on_measured_runs"] / c["measured"] - 1)
                if abs(c["measured"] - 1) > 0.05:
                    verdicts.append((name, k, b, (c["predicted"] >= 1) == (c["measured"] >= 1)))
        for b in BATCHES:
            measured = {0: 1.0, **{k: cells[k][b]["measured"] for k in cells}}
            best_k = max(measured, key=lambda k: measured[k])
            rec = p["recommended"].get(b)
            if rec is not None and rec in measured:
                recs.append((name, b, rec, best_k, measured[rec] / measured[best_k]))
    return {
        "cells": len(errors),
        "cells_within_10pct": sum(abs(e) <= 0.10 for *_, e in errors),
        "max_abs_error": round(max(abs(e) for *_, e in errors), 3) if errors else None,
        "misses": [{"pair": n, "k": k, "batch": b, "error": round(e, 3)} for n, k, b, e in errors if abs(e) > 0.10],
        "model_on_measured_runs_within_10pct": sum(abs(e) <= 0.10 for e in model_errors),
        "model_on_measured_runs_max_abs_error": round(max(abs(e) for e in model_errors), 3) if model_errors else None,
        "first_run_cells_within_10pct": sum(abs(e) <= 0.10 for e in first_errors),
        "first_run_max_abs_error": round(max(abs(e) for e in first_errors), 3) if first_errors else None,
        "verdict_cells": len(verdicts),
        "verdicts_right": sum(ok for *_, ok in verdicts),
        "wrong_verdicts": [{"pair": n, "k": k, "batch": b} for n, k, b, ok in verdicts if not ok],
        "recommended_k": [{"pair": n, "batch": b, "recommended": r, "best_measured": bk,
                           "throughput_vs_best": round(ratio, 3)} for n, b, r, bk, ratio in recs],
    }


def table(pairs: dict[str, dict[str, Any]]) -> str:
    """The results as a Markdown table: measured / predicted (error) per K and batch size."""
    lines = ["| pair | K | " + " | ".join(f"batch {b}: measured / predicted" for b in BATCHES) + " |",
             "|---|---|" + "---|" * len(BATCHES)]
    for name, p in pairs.items():
        for k in sorted(p["cells"]):
            row = []
            for b in BATCHES:
                c = p["cells"][k][b]
                pred = c["predicted"]
                err = "" if pred is None else f" ({100 * (pred / c['measured'] - 1):+.0f}%)"
                row.append(f"{c['measured']:.2f}x / {'n/a' if pred is None else f'{pred:.2f}x'}{err}")
            lines.append(f"| {name} | {k} | " + " | ".join(row) + " |")
    lines += ["", "| pair | batch | recommended K (from K=4's run) | best K measured | recommended / best |",
              "|---|---|---|---|---|"]
    for name, p in pairs.items():
        for b in BATCHES:
            measured = {0: 1.0, **{k: p["cells"][k][b]["measured"] for k in p["cells"]}}
            best = max(measured, key=lambda k: measured[k])
            rec = p["recommended"].get(b)
            ratio = measured[rec] / measured[best] if rec in measured else None
            lines.append(f"| {name} | {b} | {rec} | {best} | {'n/a' if ratio is None else f'{ratio:.3f}'} |")
    return "\n".join(lines) + "\n"


GOAL = ("|predicted/measured - 1| <= 10% in every cell; verdict right where measured is outside 0.95-1.05; "
        "recommended K within 5% of the best K measured")


def _int_keys(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def merge_results(paths: list[str]) -> dict[str, Any]:
    """Results of several runs (each a truth.json of some pairs and Ks) as one: cells of the same pair are joined,
    a later run's cell replacing an earlier one's; the recommendation comes from the run that measured K=4."""
    pairs: dict[str, dict[str, Any]] = {}
    workloads, minutes = set(), 0.0
    for path in paths:
        doc = json.loads(Path(path).read_text())
        workloads.add(doc["workload"])
        minutes += doc.get("minutes", 0.0)
        for name, p in doc["pairs"].items():
            cells = {k: _int_keys(v) for k, v in _int_keys(p["cells"]).items()}
            into = pairs.setdefault(name, {"target": p["target"], "draft": p["draft"],
                                           "method": p.get("method", "draft_model"),
                                           "prompts": p.get("prompts", "plain"), "cells": {},
                                           "from_k4": {}, "recommended": {}, "inputs": {}})
            into["cells"].update(cells)
            into["inputs"].update(_int_keys(p.get("inputs", {})))
            if p.get("recommended"):
                into["recommended"] = _int_keys(p["recommended"])
                into["from_k4"] = _int_keys(p.get("from_k4", {}))
    return {"workload": " | ".join(sorted(workloads)), "pairs": pairs, "minutes": round(minutes, 1),
            "merged_from": [Path(x).name for x in paths]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", default=",".join(map(str, KS)))
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="join earlier runs' results into truth.json")
    args = parser.parse_args()
    if args.merge:
        main_merge(args.merge)
        return
    from specscope import tiny_models

    models = tiny_models.build()
    ks = tuple(int(k) for k in args.ks.split(","))
    workload = (f"greedy, {TOKENS} output tokens a request, batch sizes {BATCHES} held full for {WINDOW_S:g} s "
                f"(each finished request replaced), K {ks}, prefix caching off; {args.rounds} rounds, each: "
                "throughput measured (plain and speculative alternating), then a prediction run (the plain "
                "target calibrated as specscope calibrate does, the speculative engine run again into a hub of "
                "its own)")
    RESULTS.mkdir(exist_ok=True)
    files = []
    for name in args.pairs.split(","):  # each pair's result saved as soon as it is measured: truth_<pair>.json
        t0 = time.monotonic()
        pair = {name: run_pair(name, models, args.rounds, ks)}
        (RESULTS / f"truth_{name}.md").write_text(table(pair))
        write(f"truth_{name}", {"workload": workload, "goal": GOAL, "summary": summarize(pair), "pairs": pair,
                                "minutes": round((time.monotonic() - t0) / 60, 1)})
        files.append(str(RESULTS / f"truth_{name}.json"))
    main_merge(files)


def main_merge(paths: list[str]) -> None:
    """truth.json and truth.md from the runs' files."""
    merged = merge_results(paths)
    md = table(merged["pairs"])
    (RESULTS / "truth.md").write_text(md)
    print(md)
    write("truth", {"workload": merged["workload"], "goal": GOAL, "summary": summarize(merged["pairs"]),
                    "pairs": merged["pairs"], "minutes": merged["minutes"], "merged_from": merged["merged_from"]})


if __name__ == "__main__":
    main()

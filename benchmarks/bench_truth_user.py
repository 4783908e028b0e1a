"""Is the verdict true on the path a user takes? ``specscope calibrate`` as the CLI runs it by default, one run at
the running K on one sample of traffic, and the predictions checked against measurements on another sample of the
same traffic, for three model sizes.

For each pair:

- **baseline**: ``measure_step_times`` with the CLI's defaults (its own short prompts and a long contrast set, 64
  tokens, 3 rounds; the batch sizes of the cells): no ``--prompts``, no flag a user must know. It runs with the
  speculative engine idle beside it, as every later phase runs with one engine idle beside the one at work;
- **prediction**: a speculative engine at K = 4 (the running K) with that baseline runs sample A of the traffic
  (``tiny_models.prompts(64, seed=11)``, each request's output length drawn from 48-144 tokens) with the batch held
  full at each batch size for a few seconds (from the step that prefilled its first prompts), once, walking on
  through the sample from one batch size to the next as a server's queue does; the estimate at each batch size
  gives the expected speedup at every K, with its interval;
- **measured**: for K in 1, 2, 4, 6, a speculative engine at that K and the plain target run sample B (``seed=12``,
  its own output lengths from the same range) alternately, the batch held full, the median of the rounds' ratios of
  output tokens/s; every window (predicting ones too) counts from the step where the batch had turned over once
  (as many requests finished as it holds) and lasts until as many more have finished, so that it holds prefills
  and decoding in the proportion served traffic's steps do. Counted from its first prompts, a window decoded them
  whole before the first replacement's prefill: on the retrieval prompts at batch 16, where prefill takes half the
  plain engine's time, that window measured speculation 8-11% faster than one counted after a turnover (1.27x
  against 1.15-1.19x, K = 4, two rounds each). Each round walks on through the sample from
  where the cell's last round stopped (both engines of a round run the same prompts): a cell at batch 1 is not the
  sample's first ten prompts again and again. Every engine runs without prefix caching: each engine prefills each
  prompt it is given, as both would for a served request never seen before.

Output lengths vary as served traffic's do: with one length for every request, the plain engine's batch finishes
in lockstep and prefills its replacements together in one step, while a speculative engine's requests finish
apart (their acceptance differs) and each replacement costs a step of its own, a difference no server's traffic
has.

Per cell (K × batch size): the error of the prediction, whether the measured speedup falls inside the stated
interval, whether the pays / does-not-pay call is right where the measured speedup is outside 0.95-1.05, and
whether a "not paying" call (the interval's top under 1.0, what the alert fires on) was made on a K that measured
above 1.05, and the error had the baseline been anchored to the machine's speed (:func:`anchored`: as served, and at
the predicting window's moment). The summary adds how much the measurement itself allows:
the rounds' spread and the share of cells a prediction equal to the true speedup would meet within 10%.

Pairs: the tiny family's target with its 2%-noise draft (1.1M parameters, a same-size draft: speculation
loses), the deep01 target with its layer-0 draft (40.6M) on short prompts and on long retrieval-style ones (eleven
passages from one corpus and the question, ~450 tokens: a context the calibration's short prompts do not have), and
a wide target built here (12 layers of width 1024, 158M parameters) with its layer-0 draft.

**Fresh** (``--fresh [SEED]``, SEED drawn and printed when not given): what the run is judged on drawn from SEED
(:mod:`benchmarks.fresh`): draft-model pairs never built before, an EAGLE-3 head and n-gram lookup on drawn targets,
short chat and 300+-token retrieval-style traffic from a generator the tests do not use; K 1, 2, 3, 4, 6 at batch
1, 4, 16 on each pair and shape, from one plain engine and one engine per K serving both shapes; a cell's rounds go on
(``--min-rounds`` 2 to ``--max-rounds`` 4) until their range is under 5% of their median, and each cell reports it;
and the advice as vLLM takes it (``recommended_config`` of the predicting snapshot, run on its own engine where it is
not one of the fixed Ks measured) beside the best fixed K measured (or plain). The summaries, overall and per pair and
shape, count the goals: within 10%, inside the interval, wrong "not paying" calls, the interval's half-width at the
running K at most 15% of its point, the advice within 5% of the best. ``--smoke``: the code paths only (numbers not to
keep, written as ``smoke_fresh_SEED``).

Run: python benchmarks/bench_truth_user.py [--pairs tiny,deep01,deep01-rag,wide01] [--rounds 3] [--results NAME]
     python benchmarks/bench_truth_user.py --fresh [SEED] [--draft-pairs 2] [--only draft0,eagle3,...]
Results: benchmarks/results/truth_user.json (and truth_user.md, the table); each pair's predicting snapshot in
truth_user_<pair>.snapshot.json, which ``--replay`` judges again with the checkout's verdict. ``--results`` names
them otherwise. The tree keeps one current result: a new run replaces truth_user.json and its snapshots, and the
earlier runs are in git history (``benchmarks/fit_constants.py`` reads them from there). A fresh run's are
truth_fresh_<SEED>.json, .md and truth_fresh_<SEED>_<pair>-<shape>.snapshot.json. Every file records the commit,
whether the tree was dirty, the date, the seed (fresh) and ``judged``: "as-run", or for a replay "replay of <file> by
<commit>"; a replay of as-run results must be written under another name (``--replay-as NAME``), which keeps them as
measured.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks import fresh
from benchmarks._common import RESULTS, provenance, write
from specscope import tiny_models
from specscope.core import codec, intervals
from specscope.engine.measure import PromptOrder, measure_step_times, serve_until_row, steady_throughput
from specscope.read.workload import output_lengths
from specscope.tiny_models.models import llama_config
from specscope.verdict.baseline import MAX_ROUNDS

KS = (1, 2, 4, 6)
#: The fresh run's Ks (``--fresh``).
FRESH_KS = (1, 2, 3, 4, 6)
RUNNING_K = 4
BATCHES = (1, 4, 16)
#: The predicting run's seconds at each batch size, and each measuring round's, counted once the batch's first
#: prompts are prefilled and it turned over once (``steady_throughput(settle=True, warm=b)``), and each lasting
#: until as many requests as the batch holds have finished (``min_finished``): on a slow day (2026-11-27, steps 3x
#: slower) 16 retrieval prompts took all of the 6 s to prefill, and a 4 s round at batch 16 held ~15 steps, few
#: requests finishing (mostly decoding).
PREDICT_S, WINDOW_S = 6.0, 4.0
#: A fresh cell's rounds go on (up to ``--max-rounds``) until their range is under this share of their median.
SPREAD = 0.05
#: The fresh models' context (prompts up to ~600 tokens and their outputs).
FRESH_LENGTH = 1024
SAMPLE_A, SAMPLE_B = tiny_models.prompts(64, seed=11), tiny_models.prompts(64, seed=12)
#: Each prompt's output length, per sample: 48-144 tokens.
TOKENS_A, TOKENS_B = output_lengths(64, 96, seed=11), output_lengths(64, 96, seed=12)


#: The corpus retrieval-style prompts draw their passages from, one for both samples (as a RAG service's traffic
#: retrieves from one corpus).
CORPUS = tiny_models.prompts(512, seed=10)


def rag(prompts: list[str], seed: int) -> list[str]:
    """Long, retrieval-style prompts (~450 tokens): eleven passages drawn from :data:`CORPUS`, then the question (each
    of ``prompts``). Until stop 51 each sample joined twelve of its own 64 prompts, so a sample's mean length was
    twelve times its prompts' mean: sample B's came 25% longer than sample A's (482 against 387 tokens), more than
    two windows of one service's traffic differ."""
    rng = random.Random(seed)
    return [" ".join([*rng.sample(CORPUS, 11), p]) for p in prompts]


def wide_pair(root: Path) -> tuple[Path, Path]:
    """A 158M-parameter target (12 layers, width 1024) whose later layers are scaled by 0.01, and its layer 0."""
    target, draft = root / "wide01-target", root / "wide01-draft"
    if (target / "config.json").is_file() and (draft / "config.json").is_file():
        return target, draft
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    dims = {"hidden": 1024, "intermediate": 2816, "heads": 16, "positions": 1024}
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(tiny_models.VOCAB_SIZE, 12, **dims)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.01)
            layer.mlp.down_proj.weight.mul_(0.01)
    small = LlamaForCausalLM(llama_config(tiny_models.VOCAB_SIZE, 1, **dims)).eval()
    small.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}, strict=True)
    tok = AutoTokenizer.from_pretrained(tiny_models.build()["deep01-target"])
    for m, path in ((model, target), (small, draft)):
        m.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
    return target, draft


def pairs() -> dict[str, tuple[Path, Path, int, tuple[list[str], list[str]]]]:
    """name -> (target, draft, max_model_len, (sample A, sample B))."""
    models = tiny_models.build()
    short, long = (SAMPLE_A, SAMPLE_B), (rag(SAMPLE_A, 11), rag(SAMPLE_B, 12))
    out = {"tiny": (models["target"], models["noise2"], 512, short),
           "deep01": (models["deep01-target"], models["deep01-draft"], 1024, short),
           "deep01-rag": (models["deep01-target"], models["deep01-draft"], 1024, long)}
    return out | {"wide01": (*wide_pair(tiny_models.cache_root().parent / "bench-models"), 1024, short)}


def draft_config(draft: Path, k: int) -> dict[str, Any]:
    """The ``speculative_config`` of ``draft`` at K = ``k``."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}


def engine(target: Path, length: int, speculative: dict[str, Any] | None = None, **kw: Any) -> Any:
    import specscope
    from specscope.state.hub import Hub

    spec: dict[str, Any] = {} if speculative is None else {"speculative_config": speculative}
    # Prefix caching off, as in bench_truth and `specscope evaluate`: the plain engine serves sample B beside every
    # K's engine in turn, and with its cache warm from the K before, it would prefill the prompts it saw for nothing
    # while each fresh speculative engine pays them (served traffic's new prompts are paid by both).
    return specscope.LLM(str(target), specscope_hub=Hub(window_s=600), enforce_eager=True, dtype="float32",
                         max_model_len=length, seed=0, enable_prefix_caching=False, **spec, **kw)


def shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def run_pair(name: str, target: Path, draft: Path, length: int, samples: tuple[list[str], list[str]],
             rounds: int, stem: str) -> dict[str, Any]:
    plain = engine(target, length)
    # Every phase runs with one engine idle beside the one at work, as the measuring rounds must (they alternate the
    # two): an idle vLLM worker here still takes ~13% of a core, and calibrated alone, the tiny target's plain step
    # was priced 15-33% under the one it served beside the speculative engine (-5% to +10% calibrated beside it).
    spec = engine(target, length, draft_config(draft, RUNNING_K))
    print(f"{name}: calibrating as `specscope calibrate` does by default", flush=True)
    baseline = measure_step_times(plain, BATCHES, max_rounds=MAX_ROUNDS)
    spec.specscope.set_baseline(baseline)
    order = PromptOrder(len(samples[0]))
    for b in BATCHES:
        predicting_window(spec, b, PREDICT_S, samples[0], TOKENS_A, order)
    snap = spec.snapshot()
    (RESULTS / f"{stem}_{name}.snapshot.json").write_text(json.dumps(codec.to_dict(snap)) + "\n")
    shutdown(spec)
    rounds_seen: dict[tuple[int, int], list[float]] = {}
    serving = plain.snapshot().lifetime.step_times
    measuring = None
    for k in KS:
        spec = engine(target, length, draft_config(draft, k))
        for b in BATCHES:
            rounds_seen[(k, b)] = measure_cell(spec, plain, b, samples[1], TOKENS_B, rounds, rounds, WINDOW_S)
        if k == RUNNING_K:
            measuring = spec.snapshot().lifetime.step_times
        shutdown(spec)
        print(f"{name} K={k}: measured " + ", ".join(f"batch {b} {statistics.median(rounds_seen[(k, b)]):.2f}x"
                                                     for b in BATCHES), flush=True)
    serving = intervals.since(plain.snapshot().lifetime.step_times, serving)
    shutdown(plain)
    return assemble(rounds_seen, snap, baseline, serving, measuring, BATCHES)


def measure_cell(spec: Any, plain: Any, b: int, prompts: list[str], tokens: list[int], min_rounds: int,
                 max_rounds: int, window_s: float) -> list[float]:
    """The ratios of ``spec``'s output tokens/s to ``plain``'s at batch ``b`` in alternating rounds, each walking on
    through ``prompts``: ``min_rounds``, then more while their spread (:func:`spread`) is :data:`SPREAD` or more, up
    to ``max_rounds``."""
    ratios: list[float] = []
    order = PromptOrder(len(prompts))
    while len(ratios) < min_rounds or (len(ratios) < max_rounds and spread(ratios) >= SPREAD):
        first, second = (spec, plain) if len(ratios) % 2 else (plain, spec)
        got = {id(llm): steady_throughput(llm, b, window_s, prompts, tokens, order=order, settle=True,
                                          min_finished=b, warm=b) for llm in (first, second)}
        ratios.append(got[id(spec)] / got[id(plain)])
        order.next_window()
    return ratios


def spread(ratios: list[float]) -> float:
    """The rounds' range over their median (what each cell reports as ``rounds_spread``)."""
    return (max(ratios) - min(ratios)) / statistics.median(ratios)


def assemble(rounds: dict[tuple[int, int], list[float]], snap: Any, baseline: Any, serving: Any, measuring: Any,
             batches: Sequence[int]) -> dict[str, Any]:
    """A pair's results: each (K, batch) cell's ``rounds`` judged against the predicting snapshot ``snap``, with
    where a wrong prediction comes from: the ``baseline`` it priced with, the plain engine's own steps while it
    served sample B (``serving``) and the running K's steps on sample B (``measuring``)."""
    from specscope.verdict import estimate

    estimates = {b: estimate(snap, batch_size=b) for b in batches}
    cells = [{"k": k, "batch": b, "measured": round(statistics.median(r), 3), "rounds": [round(x, 3) for x in r]}
             for (k, b), r in sorted(rounds.items())]
    result = {"cells": judge(cells, estimates), **_estimated(estimates), "running_k": running_interval(estimates),
              "baseline": [{"batch": t.batch_size, "ms": round(1e3 * t.mean_s, 2), "context": round(t.context, 1),
                            "us_per_context_token": round(1e6 * t.context_slope, 2), "spread": round(t.spread, 3)}
                           for t in baseline.times],
              # Where a wrong prediction comes from: the plain engine's own steps while it served sample B beside
              # the calibration's, the running K's tokens a request gained per step on sample A (predicting) and on
              # sample B (measuring) ...
              "plain_serving_ms": {b: round(1e3 * t.mean_s, 2) for b in batches
                                   if (t := serving.get(b)) is not None},
              "plain_priced_ms": _priced(baseline, {b: t.context for b in batches
                                                    if (t := serving.get(b)) is not None}),
              "plain_serving_context": {b: round(t.context, 1) for b in batches
                                        if (t := serving.get(b)) is not None},
              "tokens_per_step": {"sample_a": _tokens_per_step(snap.lifetime.step_times, batches),
                                  "sample_b": _tokens_per_step(measuring, batches)},
              # ... and the running K's own decode steps in both: the prediction takes sample A's.
              "spec_step_ms": {"sample_a": _step_ms(snap.lifetime.step_times, batches),
                               "sample_b": _step_ms(measuring, batches)},
              **_verdict_plain(snap, batches)}
    anchored(snap, result, batches)
    return result


def running_interval(estimates: dict[int, Any]) -> dict[int, dict[str, Any] | None]:
    """At each batch size, the estimate at the running K, its interval and the interval's half-width over the point
    (``within_15pct``: at most 15%)."""
    out: dict[int, dict[str, Any] | None] = {}
    for b, est in estimates.items():
        if est is None:
            out[b] = None
            continue
        point = est.by_k[RUNNING_K]
        half = (est.high[RUNNING_K] - est.low[RUNNING_K]) / 2 / point if est.high else None
        out[b] = {"point": round(point, 3), "half_width": None if half is None else round(half, 3),
                  "within_15pct": None if half is None else half <= 0.15}
    return out


def _verdict_plain(snap: Any, batches: Sequence[int] = BATCHES) -> dict[str, Any]:
    """The plain step the verdict priced at each batch size (``plain_verdict_ms``; with the baseline's forward
    anchored to the predicting run's where it could be, ``anchored``) and the target's forward in ms at the tokens
    it ran, in the predicting run and in the baseline (``forward``), and the baseline's fit of its forwards
    (``forward_fit_ms``: ms, ms a request, ms a token)."""
    from specscope.verdict.cost import plain_step
    from specscope.verdict.forward import fit_forward

    if snap.baseline is None:
        return {}
    priced = {b: plain_step(snap, snap.baseline, b) for b in batches}
    forward = {name: {t.batch_size: [round(1e3 * t.forward_s, 2), round(t.forward_tokens, 1)]
                      for t in profile.times if t.forwards and t.batch_size in batches}
               for name, profile in (("predicting", snap.lifetime.step_times), ("baseline", snap.baseline))}
    return {"plain_verdict_ms": {b: round(1e3 * t, 2) for b, (t, _, _) in priced.items() if t},
            "anchored": {b: anchored for b, (_, _, anchored) in priced.items()}, "forward": forward,
            "forward_fit_ms": [round(1e3 * x, 4) for x in fit_forward(snap.baseline.forward_moments) or ()]}


def _estimated(estimates: dict[int, Any]) -> dict[str, dict[int, Any]]:
    """What each batch size's estimate rests on: c, where c came from, and what its interval was drawn from."""
    return {key: {b: None if e is None else value(e) for b, e in estimates.items()}
            for key, value in (("c", lambda e: round(e.c, 3)), ("c_basis", lambda e: e.c_basis),
                               ("interval_basis", lambda e: e.interval_basis))}


def anchored(snap: Any, pair: dict[str, Any], batches: Sequence[int] = BATCHES) -> None:
    """Each cell's error without the verdict's own anchor (``error_unanchored``: no live forward timed), and had the
    baseline been anchored to the machine's speed, two ways, at each batch size:

    - ``error_as_served``: priced exactly the plain step the plain engine served sample B with (``plain_serving_ms``),
      which fixes the calibration's moment;
    - ``error_at_moment``: that step scaled by the predicting run's speculative step over the same engine's on sample
      B (``spec_step_ms``), the plain step at the predicting window's own moment, which a gauge timed in the priced
      steps would give; without the draft's parameter share as c's floor (a guard against a slow baseline, which an
      anchored one is not)."""
    from specscope.verdict import cost, estimate

    unanchored = _without_forwards(snap)
    for b in batches:
        est = estimate(unanchored, batch_size=b)
        for cell in pair["cells"]:
            if cell["batch"] == b and est is not None:
                cell["error_unanchored"] = round(est.by_k[cell["k"]] / cell["measured"] - 1.0, 3)
    served, priced = pair.get("plain_serving_ms", {}), pair.get("plain_priced_ms", {})
    spec = pair.get("spec_step_ms") or {}
    for b in batches:
        s, p = served.get(b, served.get(str(b))), priced.get(b, priced.get(str(b)))
        a, m = (spec.get(name, {}).get(b, spec.get(name, {}).get(str(b))) for name in ("sample_a", "sample_b"))
        if not s or not p or snap.baseline is None:
            continue
        for key, f, floor in (("error_as_served", s / p, cost.weight_share),
                              ("error_at_moment", s / p * a / m if a and m else None, lambda _: None)):
            if f is None:
                continue
            base = replace(snap.baseline, times=tuple(replace(t, mean_s=f * t.mean_s, context_slope=f * t.context_slope)
                                                      for t in snap.baseline.times))
            with mock.patch.object(cost, "weight_share", floor):
                est = estimate(replace(snap, baseline=base), batch_size=b)
            for cell in pair["cells"]:
                if cell["batch"] == b and est is not None:
                    cell[key] = round(est.by_k[cell["k"]] / cell["measured"] - 1.0, 3)


def _without_forwards(snap: Any) -> Any:
    """``snap`` with no live forward timed: the verdict as it prices the plain step without the anchor."""
    def strip(profile: Any) -> Any:
        return replace(profile, times=tuple(replace(t, forwards=0, forward_s=0.0, forward_tokens=0.0)
                                            for t in profile.times))

    return replace(snap, lifetime=replace(snap.lifetime, step_times=strip(snap.lifetime.step_times)),
                   window=replace(snap.window, step_times=strip(snap.window.step_times)))


def judge(cells: list[dict[str, Any]], estimates: dict[int, Any]) -> list[dict[str, Any]]:
    """Each measured cell (K, batch, measured, rounds) with the prediction at its batch size and how it did."""
    out = []
    for cell in cells:
        k, b, m = cell["k"], cell["batch"], cell["measured"]
        rounds = cell["rounds"]
        # How far the measurement itself scatters: its rounds' range over the median it reports.
        base = {"k": k, "batch": b, "measured": m, "rounds": rounds,
                "rounds_spread": round((max(rounds) - min(rounds)) / m, 3)}
        est = estimates[b]
        if est is None:
            out.append({**base, "predicted": None})
            continue
        p = est.by_k[k]
        iv = (est.low[k], est.high[k]) if est.high else None
        decided = not 0.95 <= m <= 1.05
        out.append({
            **base, "predicted": round(p, 3),
            "interval": None if iv is None else [round(iv[0], 3), round(iv[1], 3)],
            "error": round(p / m - 1.0, 3), "within_10pct": abs(p / m - 1.0) <= 0.10,
            "inside_interval": None if iv is None else iv[0] <= m <= iv[1],
            "call_right": None if not decided else (p >= 1.0) == (m >= 1.0),
            # What the alert fires on: the interval's top under 1.0, the point's without an interval.
            "wrong_not_paying": (iv[1] if iv else p) < 1.0 and m > 1.05,
        })
    return out


def run_fresh(pair: fresh.Pair, root: Path, data: dict[str, Any], batches: Sequence[int], ks: Sequence[int],
              args: argparse.Namespace, stem: str) -> dict[str, dict[str, Any]]:
    """One drawn pair on each traffic shape of ``data`` (shape -> (sample A, sample B), each (prompts, output
    lengths)), as :func:`run_pair` runs a named one, one plain engine serving every shape and each K's engine every
    shape in turn; the cells' rounds go on while they spread (:func:`measure_cell`); and the advice the predicting
    snapshot gives (``recommended_config``) run as vLLM takes it and set beside the best fixed K measured."""
    from specscope.verdict import config_text, merge_profiles, recommended_config

    target = root / pair.name / "target"
    plain = engine(target, FRESH_LENGTH)
    spec = engine(target, FRESH_LENGTH, pair.speculative_config(root, RUNNING_K))
    print(f"{pair.name} ({pair.describe()}): calibrating as `specscope calibrate` does by default", flush=True)
    baseline = measure_step_times(plain, batches, max_rounds=MAX_ROUNDS)
    snaps = {}
    for i, shape in enumerate(data):
        if i:  # each shape's prediction from an engine of its own, with the same calibration
            spec = engine(target, FRESH_LENGTH, pair.speculative_config(root, RUNNING_K))
        spec.specscope.set_baseline(baseline)
        (prompts, tokens), _ = data[shape]
        order = PromptOrder(len(prompts))
        for b in batches:
            serve_until_row(spec, b, functools.partial(predicting_window, spec, b, args.predict_s, prompts, tokens,
                                                       order))
        snaps[shape] = spec.snapshot()
        (RESULTS / f"{stem}_{pair.name}-{shape}.snapshot.json").write_text(json.dumps(codec.to_dict(snaps[shape]))
                                                                          + "\n")
        shutdown(spec)
    rounds: dict[str, dict[tuple[int, int], list[float]]] = {shape: {} for shape in data}
    serving: dict[str, list[Any]] = {shape: [] for shape in data}
    measuring: dict[str, Any] = {}
    # Each measured K's own decode steps on sample B (and the advice's, where it ran an engine of its own): where the
    # curve over K misses, whether the tokens a step gains or the step's time moved otherwise than predicted.
    own_steps: dict[str, dict[str, Any]] = {shape: {} for shape in data}

    def measure(spec: Any, shape: str, label: str) -> tuple[dict[int, list[float]], Any]:
        """Sample B of ``shape`` at each batch size: the rounds, and ``spec``'s own steps meanwhile."""
        (prompts, tokens), cells = data[shape][1], {}
        before, own = plain.snapshot().lifetime.step_times, spec.snapshot().lifetime.step_times
        for b in batches:
            t0 = time.monotonic()
            cells[b] = measure_cell(spec, plain, b, prompts, tokens, args.min_rounds, args.max_rounds, args.window_s)
            print(f"{pair.name}-{shape} {label} batch {b}: {statistics.median(cells[b]):.2f}x "
                  f"(spread {spread(cells[b]):.0%}, {len(cells[b])} rounds, {time.monotonic() - t0:.0f} s)",
                  flush=True)
        serving[shape].append(intervals.since(plain.snapshot().lifetime.step_times, before))
        return cells, intervals.since(spec.snapshot().lifetime.step_times, own)

    for k in ks:
        spec = engine(target, FRESH_LENGTH, pair.speculative_config(root, k))
        for shape in data:
            cells, own = measure(spec, shape, f"K={k}")
            rounds[shape].update({(k, b): r for b, r in cells.items()})
            own_steps[shape][str(k)] = _steps(own, batches)
            if k == RUNNING_K:
                measuring[shape] = own
        shutdown(spec)
    out = {}
    for shape, snap in snaps.items():
        config = recommended_config(snap)
        if config is None:
            advice = {b: 1.0 for b in batches}
            how = "speculation removed: the plain engine"
        elif set(config) == {"num_speculative_tokens"} and config["num_speculative_tokens"] in ks:
            advice = {b: statistics.median(rounds[shape][(config["num_speculative_tokens"], b)]) for b in batches}
            how = "one fixed K: its cells"
        else:
            spec = engine(target, FRESH_LENGTH, pair.speculative_config(root, 0) | config)
            cells, own = measure(spec, shape, "advice")
            own_steps[shape]["advice"] = _steps(own, batches)
            shutdown(spec)
            advice = {b: statistics.median(r) for b, r in cells.items()}
            how = "its own engine"
        result = assemble(rounds[shape], snap, baseline, merge_profiles(serving[shape]), measuring[shape], batches)
        result["steps_by_k"] = own_steps[shape]
        result["advice"] = {"config": config, "text": "off" if config is None else config_text(config),
                            "measured_as": how, "by_batch": {}}
        for b in batches:
            best_k, best = max([(0, 1.0)] + [(k, statistics.median(rounds[shape][(k, b)])) for k in ks],
                               key=lambda x: x[1])
            result["advice"]["by_batch"][b] = {"measured": round(advice[b], 3), "best_k": best_k,
                                               "best": round(best, 3), "within_5pct": advice[b] >= 0.95 * best}
        out[f"{pair.name}-{shape}"] = {"pair": pair.describe(), "method": pair.method, "shape": shape, **result}
    shutdown(plain)
    return out


def replay(stem: str) -> dict[str, Any]:
    """The results saved as ``stem`` judged again by this checkout's verdict, on each pair's saved predicting
    snapshot: a change to the model is checked against the same measurements without running the engines again."""
    from specscope.verdict import estimate, recommended_config

    doc = json.loads((RESULTS / f"{stem}.json").read_text())
    for name, pair in doc["pairs"].items():
        snap = codec.from_dict(json.loads((RESULTS / f"{stem}_{name}.snapshot.json").read_text()))
        batches = sorted({c["batch"] for c in pair["cells"]})
        estimates = {b: estimate(snap, batch_size=b) for b in batches}
        pair["cells"] = judge(pair["cells"], estimates)
        pair.update(_estimated(estimates) | _verdict_plain(snap, batches) | {"running_k": running_interval(estimates)})
        if "advice" in pair:  # measured as run: the advice this checkout would give beside it, not measured
            pair["advice"]["config_now"] = recommended_config(snap)
        if snap.baseline is not None:
            pair["plain_priced_ms"] = _priced(snap.baseline, {int(b): context for b, context
                                                              in pair["plain_serving_context"].items()})
        anchored(snap, pair, batches)
    doc["summary"] = summarize(doc["pairs"])
    if "summary_by_pair" in doc:
        doc["summary_by_pair"] = {name: summarize({name: pair}) for name, pair in doc["pairs"].items()}
    return doc


def _priced(baseline: Any, contexts: dict[int, float]) -> dict[int, float]:
    """The plain step in ms the baseline prices at each batch size of ``contexts``, at the context the plain engine
    served sample B at there: set beside ``plain_serving_ms``, how far the calibration is from serving."""
    return {b: round(1e3 * priced, 2) for b, context in contexts.items()
            if (priced := baseline.at(b, context=context)) is not None}


def _step_ms(times: Any, batches: Sequence[int]) -> dict[int, float | None]:
    """The mean decode step in milliseconds at each of ``batches``."""
    return {b: None if (t := times.get(b)) is None else round(1e3 * t.mean_s, 2) for b in batches}


def _steps(times: Any, batches: Sequence[int]) -> dict[str, dict[int, float | None]]:
    """An engine's own decode steps at each of ``batches``: the tokens a request gained per step and the step's ms."""
    return {"tokens_per_step": _tokens_per_step(times, batches), "step_ms": _step_ms(times, batches)}


def _tokens_per_step(times: Any, batches: Sequence[int]) -> dict[int, float | None]:
    """Tokens a request gained per decode step at each of ``batches``."""
    out: dict[int, float | None] = {}
    for b in batches:
        t = times.get(b)
        x = None if t is None else t.tokens_per_request_step
        out[b] = None if x is None else round(x, 3)
    return out


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The goals over ``results``' cells: within 10%, inside the interval, the calls, wrong "not paying" calls, the
    interval's half-width at the running K (at most 15% of the point, per batch size) and, where measured, the
    advice as vLLM took it (within 5% of the best fixed K or plain, per batch size)."""
    cells = [c for r in results.values() for c in r["cells"] if c["predicted"] is not None]
    intervals = [c for c in cells if c["inside_interval"] is not None]
    calls = [c for c in cells if c["call_right"] is not None]
    halves = [h["within_15pct"] for r in results.values() for h in (r.get("running_k") or {}).values()
              if h is not None and h["within_15pct"] is not None]
    advice = [a["within_5pct"] for r in results.values() if "advice" in r for a in r["advice"]["by_batch"].values()]
    return {"cells": len(cells),
            "within_10pct": sum(c["within_10pct"] for c in cells),
            "inside_interval": sum(c["inside_interval"] for c in intervals), "with_interval": len(intervals),
            "calls_right": sum(c["call_right"] for c in calls), "calls": len(calls),
            "wrong_not_paying": sum(c["wrong_not_paying"] for c in cells),
            # Cells whose own measurement is no finer than the 10% goal: their rounds span more than 10% (5%).
            "measured_rounds_over_10pct": sum(c["rounds_spread"] > 0.10 for c in cells),
            "measured_rounds_over_5pct": sum(c["rounds_spread"] >= SPREAD for c in cells),
            "half_width_within_15pct": sum(halves), "half_widths": len(halves),
            **({"advice_within_5pct": sum(advice), "advice_batches": len(advice)} if advice else {}),
            **{f"within_10pct_{key[6:]}": sum(abs(c[key]) <= 0.10 for c in cells if key in c)
               for key in ("error_unanchored", "error_as_served", "error_at_moment")},
            **measurement_ceiling([c["rounds"] for c in cells])}


def measurement_ceiling(rounds: list[list[float]], draws: int = 20000) -> dict[str, float]:
    """How far the measurement alone lets a prediction meet the 10% goal: the rounds' relative standard deviation
    pooled over the cells (each cell's rounds about their mean), and the share of cells in which a prediction equal
    to the true speedup would come within 10% of the median of that many rounds drawn with that spread."""
    spreads = [statistics.stdev(r) / statistics.mean(r) for r in rounds if len(r) > 1]
    if not spreads:
        return {}
    sd, n, rng = (sum(s * s for s in spreads) / len(spreads)) ** 0.5, max(len(r) for r in rounds), random.Random(0)
    hits = sum(abs(1.0 / statistics.median(1.0 + rng.gauss(0.0, sd) for _ in range(n)) - 1.0) <= 0.10
               for _ in range(draws))
    return {"round_sd": round(sd, 3), "exact_prediction_within_10pct": round(hits / draws, 3)}


def table(results: dict[str, Any]) -> str:
    """The results as markdown: each cell's measured speedup [its rounds' spread] / prediction (interval), the plain
    step priced and served, and the advice where measured."""
    cells = [c for r in results.values() for c in r["cells"]]
    batches = sorted({c["batch"] for c in cells})
    lines = ["| pair | K | " + " | ".join(f"batch {b}: measured [spread] / predicted (interval)" for b in batches)
             + " |", "|---|---|" + "---|" * len(batches)]
    for name, r in results.items():
        by = {(c["k"], c["batch"]): c for c in r["cells"]}
        for k in sorted({c["k"] for c in r["cells"]}):
            row = []
            for b in batches:
                c = by.get((k, b))
                iv = c and c.get("interval")
                row.append("n/a" if c is None else f"{c['measured']:.2f} [{c['rounds_spread']:.0%}] / "
                           + ("n/a" if c["predicted"] is None else f"{c['predicted']:.2f}")
                           + ("" if not iv else f" ({iv[0]:.2f}-{iv[1]:.2f})"))
            lines.append(f"| {name} | {k} | " + " | ".join(row) + " |")
    advised = {name: r["advice"] for name, r in results.items() if "advice" in r}
    if advised:
        lines += ["", "The advice as vLLM took it (`recommended_config` of the predicting snapshot) against the best "
                  "fixed K measured (K = 0: plain)", "", "| pair | advice | " + " | ".join(
                      f"batch {b}: advice / best (K)" for b in batches) + " |", "|---|---|" + "---|" * len(batches)]
        for name, a in advised.items():
            by_batch = {str(b): x for b, x in a["by_batch"].items()}
            lines.append(f"| {name} | {a['text']} | " + " | ".join(
                f"{x['measured']:.2f} / {x['best']:.2f} (K={x['best_k']})" if (x := by_batch.get(str(b))) else "n/a"
                for b in batches) + " |")
    lines += ["", "The plain step in ms: priced by the baseline at the context served, and served (sample B, beside "
              "every K)", "", "| pair | " + " | ".join(f"batch {b}: priced / served" for b in batches) + " |",
              "|---|" + "---|" * len(batches)]
    for name, r in results.items():
        priced, served = ({str(b): ms for b, ms in r.get(key, {}).items()}  # int keys until saved as JSON
                          for key in ("plain_priced_ms", "plain_serving_ms"))
        lines.append(f"| {name} | " + " | ".join(
            f"{priced[str(b)]:.2f} / {served[str(b)]:.2f} ({served[str(b)] / priced[str(b)] - 1:+.0%})"
            if str(b) in priced and str(b) in served else "n/a" for b in batches) + " |")
    return "\n".join(lines) + "\n"


def predicting_window(spec: Any, batch: int, seconds: float, prompts: list[str], tokens: list[int],
                      order: PromptOrder) -> None:
    """One predicting window at ``batch``, counted once the batch has turned over, walking on through ``order``."""
    steady_throughput(spec, batch, seconds, prompts, tokens, order=order, settle=True, min_finished=batch, warm=batch)
    order.next_window()


def fresh_seed(seed: int, args: argparse.Namespace) -> None:
    """The fresh run of ``seed``: its pairs drawn and built, its traffic drawn, each pair run and the results
    written (after each pair) as ``truth_fresh_SEED``."""
    from transformers import AutoTokenizer

    print(f"fresh seed: {seed}", flush=True)
    # The widest drawn target's KV cache for 16 retrieval prompts and its draft's need more than 1 GiB.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(2, int(os.environ["VLLM_CPU_KVCACHE_SPACE"])))
    drawn, shapes = fresh.draw_pairs(seed, args.draft_pairs), fresh.SHAPES
    batches: tuple[int, ...] = BATCHES
    ks: tuple[int, ...] = FRESH_KS
    if args.only:
        drawn = [p for p in drawn if p.name in args.only.split(",")]
    if args.ks:  # a diagnostic run: other Ks or batch sizes than the truth run's (parsed by main)
        ks = tuple(sorted({*args.ks, RUNNING_K}))
    if args.batches:
        batches = args.batches
    if args.smoke:
        drawn, shapes, batches, ks = drawn[:1], ("chat",), (1, 16), (2, RUNNING_K)
        args.min_rounds = args.max_rounds = 1
        args.window_s, args.predict_s = 1.5, 2.0
    stem = args.results or f"{'smoke' if args.smoke else 'truth'}_fresh_{seed}"
    t0 = time.monotonic()
    root = fresh.build(seed, drawn)
    tok = AutoTokenizer.from_pretrained(root / drawn[0].name / "target")
    data = {shape: sample for shape, sample in fresh.samples(seed, lambda text: len(tok.encode(text))).items()
            if shape in shapes}
    lengths = {shape: [len(tok.encode(p)) for p in data[shape][1][0]] for shape in shapes}
    minutes = {"build": round((time.monotonic() - t0) / 60, 1)}
    results: dict[str, Any] = {}
    for pair in drawn:
        t0 = time.monotonic()
        results |= run_fresh(pair, root, data, batches, ks, args, stem)
        minutes[pair.name] = round((time.monotonic() - t0) / 60, 1)
        doc = {"workload": f"pairs and traffic drawn from seed {seed} (benchmarks/fresh.py): traffic shapes "
                           f"{', '.join(shapes)}, samples A (predicting) and B (measuring) of "
                           f"{fresh.SAMPLE_SIZE} prompts each, greedy, output lengths drawn per prompt "
                           f"({fresh.MEAN_TOKENS // 2}-{fresh.MEAN_TOKENS * 3 // 2} tokens); batch sizes "
                           f"{tuple(batches)} held full; K {tuple(ks)}; predicted from one K={RUNNING_K} run of "
                           f"{args.predict_s:g} s a batch size on sample A against `specscope calibrate`'s default "
                           f"baseline; measured on sample B, median of {args.min_rounds}-{args.max_rounds} "
                           f"alternating rounds of {args.window_s:g} s (more while their spread was {SPREAD:.0%} or "
                           "more), windows counted as run_pair counts them; prefix caching off on every engine",
               "smoke": args.smoke,
               "drawn": {p.name: {"describe": p.describe(), "method": p.method, "draft_layers": p.draft_layers,
                                  "target": vars(p.target)} for p in drawn},
               "prompt_tokens_sample_b": {shape: [min(n), round(statistics.mean(n)), max(n)]
                                          for shape, n in lengths.items()},
               "minutes": minutes, "summary": summarize(results),
               "summary_by_pair": {name: summarize({name: r}) for name, r in results.items()}, "pairs": results}
        write(stem, doc, seed=seed)
        (RESULTS / f"{stem}.md").write_text(table(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="tiny,deep01,deep01-rag,wide01")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results", help="the results' name in benchmarks/results (default truth_user; with --fresh, "
                    "truth_fresh_SEED)")
    ap.add_argument("--update", action="store_true",
                    help="replace only these pairs in the saved results, keeping the others")
    ap.add_argument("--replay", action="store_true",
                    help="judge the saved measurements again with this checkout's verdict (no engines)")
    ap.add_argument("--replay-as", metavar="NAME",
                    help="with --replay: write the judgement under this name (required where the saved results are "
                    "as run)")
    ap.add_argument("--fresh", nargs="?", type=int, const=-1, metavar="SEED",
                    help="pairs and traffic drawn from SEED (>= 0; drawn and printed when not given)")
    ap.add_argument("--draft-pairs", type=int, default=2, help="with --fresh: draft-model pairs to draw")
    ap.add_argument("--only", metavar="NAMES",
                    help="with --fresh: run only these of the drawn pairs (draft0,eagle3,...)")
    ap.add_argument("--min-rounds", type=int, default=2, help="with --fresh: a cell's rounds at least")
    ap.add_argument("--max-rounds", type=int, default=4,
                    help=f"with --fresh: a cell's rounds at most, while their spread is {SPREAD * 100:.0f}%% or more")
    ap.add_argument("--window-s", type=float, default=WINDOW_S, help="with --fresh: a measuring window's seconds")
    ap.add_argument("--predict-s", type=float, default=PREDICT_S,
                    help="with --fresh: the predicting run's seconds at each batch size")
    ap.add_argument("--ks", metavar="K,K,...",
                    help=f"with --fresh: measure these Ks (K = {RUNNING_K} added: it predicts) instead of the truth "
                    "run's; a diagnostic, not a truth run: name its results with --results")
    ap.add_argument("--batches", metavar="B,B,...",
                    help="with --fresh: these batch sizes instead of the truth run's (a diagnostic, as --ks)")
    ap.add_argument("--smoke", action="store_true",
                    help="with --fresh: the code paths only (one pair, chat, batch 1 and 16, K 2 and 4, one short "
                    "round), written as smoke_fresh_SEED: numbers not to keep")
    args = ap.parse_args()
    if args.replay:
        stem = args.results or "truth_user"
        saved = json.loads((RESULTS / f"{stem}.json").read_text())
        if args.replay_as is None and saved.get("judged", "as-run") == "as-run":
            print(f"{stem}.json holds results as run: write the replay under another name (--replay-as NAME)",
                  file=sys.stderr)
            sys.exit(2)
        doc = replay(stem)
        name = args.replay_as or stem
        as_run = saved.get("as_run") or {k: saved[k] for k in ("commit", "dirty", "date", "machine") if k in saved}
        try:
            write(name, {k: v for k, v in doc.items() if k not in ("benchmark", "machine", "python")}
                  | {"as_run": as_run}, seed=saved.get("seed"), judged=f"replay of {stem}.json by "
                  f"{provenance()['commit']}")
        except FileExistsError as exc:
            print(exc, file=sys.stderr)
            sys.exit(2)
        (RESULTS / f"{name}.md").write_text(table(doc["pairs"]))
        return
    if args.fresh is not None:
        if (args.ks or args.batches) and not args.results:
            print("--ks and --batches make a diagnostic run: name its results (--results NAME)", file=sys.stderr)
            sys.exit(2)
        for name, most in (("ks", 16), ("batches", 256)):
            value = getattr(args, name)
            if value and not all(v.strip().isdigit() and 1 <= int(v) <= most for v in value.split(",")):
                print(f"--{name} takes whole numbers from 1 to {most}, comma-separated: {value!r}", file=sys.stderr)
                sys.exit(2)
            setattr(args, name, tuple(sorted({int(v) for v in value.split(",")})) if value else None)
        fresh_seed(args.fresh if args.fresh >= 0 else random.SystemRandom().randrange(1_000_000), args)
        return
    args.results = args.results or "truth_user"
    available = pairs()
    saved = RESULTS / f"{args.results}.json"
    results = json.loads(saved.read_text())["pairs"] if args.update and saved.is_file() else {}
    for name in args.pairs.split(","):
        results[name] = run_pair(name, *available[name], args.rounds, args.results)
        doc = {"workload": f"greedy, {min(TOKENS_B)}-{max(TOKENS_B)} output tokens a request (drawn per prompt), batch "
                           f"sizes {BATCHES} held full; predicted from one K={RUNNING_K} run of {PREDICT_S:g} s a "
                           "batch size (counted once its first prompts were prefilled and as many requests as it "
                           "holds had finished) on sample A (seed 11) "
                           "against a baseline of `specscope calibrate`'s defaults (taken with the speculative engine "
                           "idle beside it); "
                           f"measured on sample B (seed 12), median of {args.rounds} alternating rounds of "
                           f"{WINDOW_S:g} s counted once the batch's first prompts were prefilled and it had turned "
                           "over once (as many requests finished as it holds), every window "
                           "lasting until as many requests as the batch holds had finished; both samples walked "
                           "through, each window starting where the last stopped; prefix caching off",
               "summary": summarize(results), "pairs": results}
        write(args.results, doc)
        (RESULTS / f"{args.results}.md").write_text(table(results))
        print(summarize(results), flush=True)


if __name__ == "__main__":
    main()

"""Render the benchmark figures README.md and docs/*.md quote from benchmarks/results/*.json, or check them.

In the markdown a figure is written between markers: ``<!-- fig record.ratio -->0.145x<!-- /fig -->``. FIGURES
names each figure's results file and how its text is made from it. ``python scripts/figures.py`` rewrites the
marked spans; ``--check`` changes nothing and exits 1 naming each span whose text differs from its rendering.
An unknown figure, a missing results file or key, or a figure no document quotes is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specscope.verdict.schedule import scheduled_k

ROOT = Path(__file__).resolve().parent.parent

def documents(root: Path) -> list[str]:
    """The documents figures may be quoted in: README.md and every page under docs/."""
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]

#: The fresh-seed truth runs the docs quote (``bench_truth_user.py --fresh``), as run: each one's figures are named
#: ``<prefix>.<figure>``.
FRESH = {"fresh": "truth_fresh_56479.json", "fresh2": "truth_fresh_282999.json", "fresh3": "truth_fresh_333557.json",
         "fresh4": "truth_fresh_333557_eagle3.json", "fresh5": "truth_fresh_333557_ngram.json",
         "fresh6": "truth_fresh_282999_draft0.json", "fresh7": "truth_fresh_282999_eagle3.json",
         "fresh8": "truth_fresh_356101_ngram.json", "fresh9": "truth_fresh_356101_draft0.json",
         "fresh10": "truth_fresh_356101_draft1.json", "fresh11": "truth_fresh_356101_eagle3.json",
         "fresh12": "truth_fresh_56479_ngram.json", "fresh13": "truth_fresh_56479_draft1.json",
         "fresh14": "truth_fresh_333557_draft1.json", "fresh15": "truth_fresh_62829_draft0.json",
         "fresh16": "truth_fresh_487058_draft0.json", "fresh17": "truth_fresh_885482_draft0.json",
         "fresh18": "truth_fresh_580813_eagle3.json", "fresh19": "truth_fresh_901603_ngram.json",
         "fresh20": "truth_fresh_703433_draft1.json", "fresh21": "truth_fresh_155631_ngram.json",
         "fresh22": "truth_fresh_503517_eagle3.json"}
DASH = "\u2013"  # the docs' range dash
MARK = re.compile(r"<!-- fig ([\w.-]+) -->([^<]*)<!-- /fig -->")


class FigureError(Exception):
    """A figure that cannot be rendered: unknown, or its results file or key missing."""


def num(doc: Any, *keys: str) -> float:
    """The number at ``keys`` in a results document."""
    for key in keys:
        doc = doc[key]
    if not isinstance(doc, int | float):
        raise KeyError("/".join(keys))
    return float(doc)


def times(v: float, digits: int = 2) -> str:
    """A ratio as the docs write it: 1.709 -> "1.71x"."""
    return f"{v:.{digits}f}x"


def span(values: list[float], fmt: Callable[[float], str]) -> str:
    """The range of ``values`` as "lo-hi" with an en dash (one value where both ends round alike)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo.rstrip('x%')}{DASH}{hi}"


def pct(v: float, digits: int = 0) -> str:
    """A share as a percentage: 0.00158 -> "0.16%" at two digits."""
    return f"{100 * v:.{digits}f}%"


def _demo(d: Any, batch: int) -> str:
    return span([c["measured"] for r in d["runs"] for c in r["cells"] if c["batch"] == batch], times)


def _k0(d: Any, method: str, key: str) -> list[float]:
    return [num(d, "cells", method, b, key) for b in ("1", "4", "16")]


def _held(d: Any, way: str, stat: str) -> str:
    return f"{num(d, 'loop_held_per_poll', way, 'now', stat):.2f} ms"


def _forward_gauge(d: Any, keys: tuple[str, ...], digits: int) -> str:
    return span([num(b, k) for b in d["batches"].values() for k in keys], lambda v: pct(v, digits))


def _evaluate(d: Any, batch: str, schedule: bool = False) -> str:
    best = d["candidates"][0]["schedule"]
    return times(num(best, "measured", batch, "speedup") if schedule else num(best, "best", batch, "best_speedup"))


def _two(d: Any, *keys: str) -> str:
    return f"{num(d, *keys):.2f}"


def _of(d: Any, hit: str, total: str) -> str:
    """"X of N" from the fresh run's summary."""
    return f"{int(num(d, 'summary', hit))} of {int(num(d, 'summary', total))}"


def _share(hit: int, total: int) -> str:
    """"X of N (P%)"."""
    return f"{hit} of {total} ({hit / total:.0%})"


def _misses(d: Any, key: str) -> str:
    """The fresh run's cells that missed ``key`` (within_10pct, inside_interval): "pair K=k batch b (error)"."""
    out = [f"{name} K={c['k']} batch {c['batch']} ({c['error']:+.1%})" for name, p in d["pairs"].items()
           for c in p["cells"] if c.get(key) is False]
    return "; ".join(out) or "none"


def _widths(d: Any) -> tuple[float, float]:
    """The fresh run's stated interval against its outcome, both as a share of the point: the median cell's
    half-width, and the half-width that would have held 90% of the cells (the measurements' distance from the point,
    the smallest that nine cells in ten are within)."""
    cells = [c for p in d["pairs"].values() for c in p["cells"] if c.get("interval")]
    stated = sorted((c["interval"][1] - c["interval"][0]) / 2 / c["predicted"] for c in cells)
    needed = sorted(abs(c["measured"] / c["predicted"] - 1) for c in cells)
    return stated[(len(stated) - 1) // 2], needed[math.ceil(0.9 * len(needed)) - 1]


def _and(items: list[str]) -> str:
    """"a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _first_ratio(text: str) -> str:
    """The first "1.88x" of a text."""
    found = re.search(r"\d+\.\d+x", text)
    if found is None:
        raise ValueError(f"no ratio in {text!r}")
    return found.group(0)


def _value(v: Any) -> str:
    """A constant's value as the docs write it: 0.1, 0.333, 1.01, inf."""
    return "inf" if v == "inf" or (isinstance(v, float) and math.isinf(v)) else f"{float(v):.3g}"


def _score(s: dict[str, Any], key: str) -> str:
    return f"{int(s[key])} of {int(s['cells'])}"


def _two_digits(v: float) -> str:
    return f"{v:.2f}"


def _c(d: Any, pair: str, batch: str, key: str) -> list[float]:
    """``key`` of ``pair``'s cells at ``batch``, over its Ks."""
    return [float(cells[batch][key]) for cells in d["pairs"][pair]["cells"].values() if batch in cells]


def _k0_within(d: Any, methods: tuple[str, ...]) -> tuple[int, int]:
    """K = 0 cells of ``methods`` whose price is within 10% of the measurement, and all of them."""
    errors = [p / m - 1 for method in methods
              for p, m in zip(_k0(d, method, "k0_predicted"), _k0(d, method, "k0_measured"), strict=True)]
    return sum(abs(e) <= 0.10 for e in errors), len(errors)


#: The Ks bench_truth.py's summary counts; a pair may have measured others too (in truth.md).
EXPERT_KS = ("1", "2", "3", "4", "6")


def _expert(d: Any, pair: str, what: str) -> str:
    """A pair of the expert path (truth.json), as bench_truth.py's summary counts: its cells within 10%, its worst
    error, its pays / does-not-pay calls right where measured outside 0.95-1.05."""
    cells = [c for k, by_batch in d["pairs"][pair]["cells"].items() if k in EXPERT_KS for c in by_batch.values()
             if c.get("predicted") is not None]
    errors = [c["predicted"] / c["measured"] - 1 for c in cells]
    if what == "within":
        return f"{sum(abs(e) <= 0.10 for e in errors)} of {len(errors)}"
    if what == "worst":
        return f"{max(errors, key=abs):+.0%}"
    decided = [(c["predicted"] >= 1) == (c["measured"] >= 1) for c in cells if abs(c["measured"] - 1) > 0.05]
    return f"{sum(decided)} of {len(decided)}"


def _ratio(e: list[float]) -> str:
    """A gate's ratio [value, low, high] as "1.45x (1.32-1.59x, an en dash)"."""
    return f"{times(e[0])} ({times(e[1])[:-1]}{DASH}{times(e[2])})"


def _pair(d: Any, i: int) -> dict[str, Any]:
    """The loop benchmark's i-th pair (1-based) of the gate against the long measurement."""
    return list(d["gate_against_long"].values())[i - 1]


def _gate_acceptance(g: dict[str, Any], cls: str) -> str:
    """A class's acceptance under the incumbent, then the candidate, in a gate run."""
    cand, inc = g["classes"][cls]["acceptance"]
    return f"{inc:.2f} -> {cand:.2f}"


def _growth(d: Any, role: str) -> str:
    """The largest change of resident memory among a results file's processes of ``role`` (a prefix), in MB."""
    rows = [r["change_mb"] for r in d["memory"] if r["role"].startswith(role) and r.get("change_mb") is not None]
    if not rows:
        raise KeyError(f"memory/{role}/change_mb")
    return f"{max(rows, key=abs):+.1f}"


def _mapping(d: Any, mapping: str) -> str:
    """How the worker's resident MB in one mapping moved from the start to the end of an abuse run."""
    (before,) = d["start"]["worker_mappings"].values()
    (after,) = d["end"]["worker_mappings"].values()
    return f"{after[mapping] - before[mapping]:+.1f}"


#: bench_abuse.py runs, as run: key -> results file; with specscope, without it, and with glibc's mmap threshold fixed.
ABUSE = {"with1": "abuse", "with2": "abuse_repeat", "untimed": "abuse_untimed", "with3": "abuse_memory_kinds",
         "mmap": "abuse_mmap_threshold", "bare1": "abuse_without_specscope", "bare2": "abuse_without_specscope_repeat",
         "bare3": "abuse_memory_kinds_without_specscope"}

FULL, INCREMENTAL = "plain, full", "plain, incremental (?since=, 20 new records)"
SERVER = "server (64 kept steps, 3 other processes), full"

# name: (results file under benchmarks/results, its text from the parsed file)
FIGURES: dict[str, tuple[str, Callable[[Any], str]]] = {
    "record.ratio": ("record.json", lambda d: times(num(d, "ratio_specscope_over_vllm"), 3)),
    "record.share": ("record.json", lambda d: pct(num(d, "specscope_share_of_a_decode_step"), 2)),
    "record.ratio_16": ("record.json", lambda d: times(num(d, "ratio_at_16_step_batches"))),
    "demo.batch1": ("demo_runs.json", lambda d: _demo(d, 1)),
    "demo.batch16": ("demo_runs.json", lambda d: _demo(d, 16)),
    "demo.runs": ("demo_runs.json", lambda d: str(int(num(d, "summary", "runs")))),
    "k0.draft.measured": ("k0.json", lambda d: ", ".join(times(v) for v in _k0(d, "draft", "k0_measured"))),
    "k0.draft.priced": ("k0.json", lambda d: span(_k0(d, "draft", "k0_predicted"), times)),
    "k0.eagle.measured": ("k0.json", lambda d: span(_k0(d, "eagle", "k0_measured"), times)),
    "k0.models.measured": ("k0.json", lambda d: span(
        [v for m in ("draft", "eagle3", "mtp", "eagle") for v in _k0(d, m, "k0_measured")], times)),
    "k0.eagle.priced": ("k0.json", lambda d: span(_k0(d, "eagle", "k0_predicted"), times)),
    "middleware.full": ("middleware.json", lambda d: _held(d, FULL, "median_cpu_ms")),
    "middleware.full_worst": ("middleware.json", lambda d: _held(d, FULL, "worst_cpu_ms")),
    "middleware.incremental": ("middleware.json", lambda d: _held(d, INCREMENTAL, "median_cpu_ms")),
    "middleware.server": ("middleware.json", lambda d: _held(d, SERVER, "median_cpu_ms")),
    "middleware.server_worst": ("middleware.json", lambda d: _held(d, SERVER, "worst_cpu_ms")),
    "fleet.cpu": ("prometheus_fleet.json", lambda d: times(num(d, "ratio_refresh_cpu"))),
    "fleet.wall": ("prometheus_fleet.json", lambda d: times(num(d, "ratio_refresh_wall"), 1)),
    "evaluate.best1": ("evaluate.json", lambda d: _evaluate(d, "1")),
    "evaluate.best8": ("evaluate.json", lambda d: _evaluate(d, "8")),
    "evaluate.schedule1": ("evaluate.json", lambda d: _evaluate(d, "1", schedule=True)),
    "evaluate.schedule8": ("evaluate.json", lambda d: _evaluate(d, "8", schedule=True)),
    "evaluate.ngram": ("evaluate.json", lambda d: times(num(d["candidates"][1], "score"), 1)),
    "canary.identical_minutes": ("canary_identical_30min.json", lambda d: f"{num(d, 'load', 'seconds') / 60:.0f}"),
    "canary.identical_refreshes": ("canary_identical_30min.json", lambda d: str(int(num(d, "canary", "documents")))),
    "canary.identical_decided": ("canary_identical_30min.json", lambda d: str(int(
        num(d, "canary", "documents_with_a_decision")))),
    "canary.identical_requests": ("canary_identical_30min.json", lambda d: "{:,.0f}".format(
        sum(num(r, "answered") for r in d["load"]["replicas"].values()))),
    **{f"canary.{run}_{what}": (file, make) for run, (file, digits) in {
        "difference": ("canary_difference.json", 0), "small": ("canary_difference_9points.json", 1)}.items()
       for what, make in {
           "s": lambda d: f"{num(d, 'canary', 'first_decision', 't_s'):.0f}",
           "requests": lambda d: "/".join(str(int(x)) for x in d["canary"]["first_decision"]["requests"]),
           "points": lambda d, digits=digits: "{:.{}f}".format(
               100 * num(d, "acceptance", "per_request_mean", "difference"), digits),
       }.items()},
    "remedy.before_hard": ("remedy_loop.json", lambda d: _two(d, "served_before", "classes", "hard", "acceptance")),
    "remedy.before_engine": ("remedy_loop.json", lambda d: _two(d, "served_before", "engine_acceptance")),
    "remedy.rows": ("remedy_loop.json", lambda d: str(int(num(d, "captured_rows", "rows")))),
    "remedy.gate": ("remedy_loop.json", lambda d: f"{d['gate']['decision']} (exit {int(num(d, 'gate', 'exit_code'))})"),
    "remedy.gate_ratio": ("remedy_loop.json", lambda d: _ratio(d["gate"]["traffic_ratio"])),
    "remedy.gate_hard": ("remedy_loop.json", lambda d: _gate_acceptance(d["gate"], "hard")),
    "remedy.gate_easy": ("remedy_loop.json", lambda d: _gate_acceptance(d["gate"], "easy")),
    "remedy.gate_minutes": ("remedy_loop.json", lambda d: f"{num(d, 'minutes', 'gate'):.0f}"),
    "remedy.canary": ("remedy_loop.json", lambda d: f"{d['canary']['first_decision']['overall']} after "
                      f"{num(d, 'canary', 'first_decision', 't_s'):.0f} s"),
    "remedy.after_hard": ("remedy_loop.json", lambda d: _two(d, "served_after", "classes", "hard", "acceptance")),
    "remedy.after_engine": ("remedy_loop.json", lambda d: _two(d, "served_after", "engine_acceptance")),
    "remedy.minutes": ("remedy_loop.json", lambda d: f"{num(d, 'minutes', 'all'):.0f}"),
    "remedy.matches": ("remedy_loop.json", lambda d: f"{sum(a['match'] for a in d['gate_against_long'].values())} of "
                       f"{len(d['gate_against_long'])}"),
    **{f"remedy.p{i}.{run}": ("remedy_loop.json", lambda d, i=i, run=run: _pair(d, i)[run]["decision"])
       for i in (1, 2, 3) for run in ("short", "long")},
    **{f"remedy.p{i}.{run}_ratio": ("remedy_loop.json", lambda d, i=i, run=run: _ratio(
        _pair(d, i)[run]["traffic_ratio"])) for i in (1, 2, 3) for run in ("short", "long")},
    "gal.matches": ("gate_against_long.json", lambda d: f"{sum(a['match'] for a in d['gate_against_long'].values())} "
                    f"of {len(d['gate_against_long'])}"),
    **{f"gal.g{i}.{run}": ("gate_against_long.json", lambda d, i=i, run=run: _pair(d, i)[run]["decision"])
       for i in (1, 2, 3) for run in ("short", "long")},
    **{f"gal.g{i}.{run}_ratio": ("gate_against_long.json", lambda d, i=i, run=run: _ratio(
        _pair(d, i)[run]["traffic_ratio"])) for i in (1, 2, 3) for run in ("short", "long")},
    "gal.g2.own": ("gate_against_long.json", lambda d: " and ".join(
        str(int(num(d, "prompts", "g2_sample_sizes", s, "own"))) for s in "AB")),
    "gal.minutes": ("gate_against_long.json", lambda d: f"{num(d, 'minutes', 'gate against long'):.0f}"),
    **{f"abuse.{key}.{what}": (f"{stem}.json", make) for key, stem in ABUSE.items() for what, make in {
        "worker": lambda d: _growth(d, "worker"), "api": lambda d: _growth(d, "api-server"),
        "commit": lambda d: str(d["commit"])[:7]}.items()},
    **{f"abuse.{key}.heap": (f"{ABUSE[key]}.json", lambda d: _mapping(d, "[heap]"))
       for key in ("with3", "bare3", "mmap")},
    "abuse.mmap.anon": ("abuse_mmap_threshold.json", lambda d: _mapping(d, "[anon]")),
    "abuse.with1.requests": ("abuse.json", lambda d: "{:,}".format(int(num(d, "load", "requests")))),
    "abuse.with1.lines": ("abuse.json", lambda d: str(int(num(d, "capture_final", "lines")))),
    "gauge.ratio_sd": ("forward_gauge.json", lambda d: _forward_gauge(
        d, ("plain_step_over_forward_rel_sd", "spec_step_over_forward_rel_sd"), 1)),
    "gauge.step_sd": ("forward_gauge.json", lambda d: _forward_gauge(d, ("plain_step_rel_sd",), 0)),
    "user.within": ("truth_user.json", lambda d: _of(d, "within_10pct", "cells")),
    "user.inside": ("truth_user.json", lambda d: _of(d, "inside_interval", "with_interval")),
    "user.calls": ("truth_user.json", lambda d: _of(d, "calls_right", "calls")),
    "user.wrong_not_paying": ("truth_user.json", lambda d: str(int(num(d, "summary", "wrong_not_paying")))),
    "fit.runs": ("fit_constants.json", lambda d: str(len(d["runs"]))),
    "fit.drift.value": ("fit_drift.json", lambda d: pct(num(d, "drift", "fitted"), 1)),
    "fit.drift.runs": ("fit_drift.json", lambda d: str(len(d["runs"]))),
    "fit.drift.chosen": ("fit_drift.json", lambda d: ", ".join(
        f"{f['left_out']} {pct(f['chosen'], 1)}" for f in d["drift"]["folds"])),
    "fit.drift.cv": ("fit_drift.json", lambda d: f"{d['drift']['cross_validated']['held']} of "
                                                 f"{d['drift']['cross_validated']['moves']}"),
    "fit.drift.former": ("fit_drift.json", lambda d: pct(num(d, "drift", "former", "value"), 1)),
    "fit.drift.former_held": ("fit_drift.json", lambda d: f"{d['drift']['former']['held']} of {d['drift']['moves']}"),
    "expert.within": ("truth.json", lambda d: _of(d, "cells_within_10pct", "cells")),
    "expert.model_within": ("truth.json", lambda d: _of(d, "model_on_measured_runs_within_10pct", "cells")),
    "expert.verdicts": ("truth.json", lambda d: _of(d, "verdicts_right", "verdict_cells")),
    "expert.misses": ("truth.json", lambda d: "; ".join(
        f"{m['pair']} K={m['k']} batch {m['batch']} ({m['error']:+.1%})" for m in d["summary"]["misses"]) or "none"),
    "expert.other_k_misses": ("truth.json", lambda d: "; ".join(
        f"{pair} K={k} batch {b} ({c['predicted'] / c['measured'] - 1:+.1%})" for pair, p in d["pairs"].items()
        for k, by_batch in p["cells"].items() if k not in EXPERT_KS for b, c in by_batch.items()
        if c.get("predicted") is not None and abs(c["predicted"] / c["measured"] - 1) > 0.10) or "none"),
    "expert.other_ks": ("truth.json", lambda d: ", ".join(
        f"{pair} K={k}" for pair, p in d["pairs"].items() for k in p["cells"] if k not in EXPERT_KS) or "none"),
    "expert.advice_misses": ("truth.json", lambda d: "; ".join(
        f"{r['pair']} at batch {r['batch']} (K={r['recommended']}, {r['throughput_vs_best']:.3f} of "
        f"K={r['best_measured']})" for r in d["summary"]["recommended_k"] if r["throughput_vs_best"] < 0.95) or "none"),
    "spread_prefill.spreads": ("spread_prefill.json", lambda d: span(
        [num(d, s, b, "spread_context_only") for s in ("chat", "rag") for b in d[s]], lambda v: pct(v, 1))),
    "spread_prefill.ratios": ("spread_prefill.json", lambda d: span(
        [num(d, s, b, "ratio") for s in ("chat", "rag") for b in d[s]], lambda v: f"{v:.2f}")),
    "drift.windows": ("drift.json", lambda d: str(int(num(d, "windows")))),
    "drift.step_ms": ("drift.json", lambda d: f"{num(d, 'step_ms', 'min'):.1f}{DASH}{num(d, 'step_ms', 'max'):.1f}"),
    "drift.off_10": ("drift.json", lambda d: _and(
        [pct(num(d, "calibration_error", f"lag {s} s, rounds 0 s apart", "over_10pct")) for s in (60, 120, 300)])),
    "drift.median_60": ("drift.json", lambda d: pct(num(d, "calibration_error", "lag 60 s, rounds 0 s apart",
                                                          "median"))),
    "arrivals.per_token": ("arrivals.json", lambda d: _and(
        [times(num(r, "plain", "tpot_p50") / num(r, "k4", "tpot_p50")) for r in d["by_rate"].values()])),
    "arrivals.predicted": ("arrivals.json", lambda d: _and(
        [_first_ratio(r["predicted_traffic"]) for r in d["by_rate"].values()])),
    "arrivals.advised": ("arrivals.json", lambda d: _and(
        [str(int(num(r, "advised_fixed_k"))) for r in d["by_rate"].values()])),
    "arrivals.best": ("arrivals.json", lambda d: _and([
        min(("k4", "k5", "k6"), key=lambda k: num(r, k, "tpot_p50"))[1:] for r in d["by_rate"].values()])),
    "arrivals.schedule": ("arrivals.json", lambda d: json.dumps(
        d["recommended"]["num_speculative_tokens_per_batch_size"], separators=(",", ":"))),
}
#: The constants ``benchmarks/fit_constants.py`` cross-validates, by the name their figures take (``fit.NAME.*``).
FITTED = {"draft_fixed": 0, "min_forward_share": 1, "max_anchor_context_move": 2}
FIGURES |= {f"fit.{name}.{what}": ("fit_constants.json", lambda d, i=i, make=make: make(d["constants"][i]))
            for name, i in FITTED.items() for what, make in {
    "committed": lambda c: _value(c["committed"]),
    "chosen": lambda c: ", ".join(f"{f['left_out']} {_value(f['chosen'])}" for f in c["folds"]),
    "cv": lambda c: _score(c["cross_validated"], "within_10pct"),
    "cv_inside": lambda c: _score(c["cross_validated"], "inside_interval"),
    "at_committed": lambda c: _score(c["committed_on_the_same_cells"], "within_10pct"),
    "at_committed_inside": lambda c: _score(c["committed_on_the_same_cells"], "inside_interval"),
    "by_value": lambda c: "; ".join(f"{_value(float(v) if v != 'inf' else math.inf)}: {s['all']['within_10pct']} "
                                    f"({s['all']['inside_interval']})" for v, s in c["by_value"].items()),
    "cells": lambda c: str(sum(c["cells"].values())),
}.items()}
#: The expert path's pairs (``bench_truth.py``, joined in truth.json): each one's figures are ``expert.PAIR.*``.
EXPERT = ("deep01", "deep03", "copy", "noise10", "eagle3", "eagle", "mtp", "ngram-retrieval", "ngram-novel")
FIGURES |= {f"expert.{pair}.{what}": ("truth.json", lambda d, pair=pair, make=make: make(d, pair))
            for pair in EXPERT for what, make in {
    "within": lambda d, pair: _expert(d, pair, "within"),
    "worst": lambda d, pair: _expert(d, pair, "worst"),
    "verdicts": lambda d, pair: _expert(d, pair, "verdicts"),
    "advice": lambda d, pair: " / ".join(f"{r['throughput_vs_best']:.3f}" for r in d["summary"]["recommended_k"]
                                         if r["pair"] == pair),
}.items()}
#: K = 0 in vLLM's schedule against the plain engine (bench_k0.py): ``k0.METHOD.bBATCH`` measured, ``.by_batch``
#: specscope's price at batch 1, 4 and 16 with its errors.
FIGURES |= {f"k0.{m}.b{b}": ("k0.json", lambda d, m=m, b=b: times(num(d, "cells", m, b, "k0_measured")))
            for m in ("draft", "eagle3", "eagle", "mtp", "ngram") for b in ("1", "4", "16")}
FIGURES |= {f"k0.{m}.by_batch": ("k0.json", lambda d, m=m: "{} ({})".format(
    " / ".join(times(v) for v in _k0(d, m, "k0_predicted")), " / ".join(
        f"{p / q - 1:+.0%}" for p, q in zip(_k0(d, m, "k0_predicted"), _k0(d, m, "k0_measured"), strict=True))))
    for m in ("draft", "eagle3", "eagle", "mtp", "ngram")}
FIGURES["k0.models.within"] = ("k0.json", lambda d: "{} of {}".format(
    *_k0_within(d, ("draft", "eagle3", "eagle", "mtp"))))
FIGURES["k0.eagle3.rounds16"] = ("k0.json", lambda d: ", ".join(
    times(v) for v in d["cells"]["eagle3"]["16"]["k0_measured_rounds"]))
FIGURES |= {f"k0.k2.b{b}": ("k0.json", lambda d, b=b: times(num(d, "cells", "draft", b, "k2_measured")))
            for b in ("1", "4", "16")}
#: Time per output token under Poisson arrivals (bench_arrivals.py): ``arrivals.RATE.ENGINE``, "p50 (p99)" in ms.
FIGURES |= {f"arrivals.{rate}.{engine}": ("arrivals.json", lambda d, rate=rate, engine=engine: "{:.1f} ({:.1f})".format(
    num(d, "by_rate", rate, engine, "tpot_p50"), num(d, "by_rate", rate, engine, "tpot_p99")))
    for rate in ("0.5", "2.0", "5.0") for engine in ("plain", "k4", "k5", "k6", "schedule")}
#: c from the configs against c measured (bench_truth.py): ``c.PAIR.configs`` and ``c.PAIR.bBATCH``, over its Ks.
FIGURES |= {f"c.{pair}.configs": (f"truth_{pair}.json", lambda d, pair=pair: "{:.3f}".format(
    _c(d, pair, "1", "c_from_configs")[0])) for pair in ("eagle3", "eagle", "mtp")}
FIGURES |= {f"c.{pair}.b{b}": (f"truth_{pair}.json", lambda d, pair=pair, b=b: span(_c(d, pair, b, "c"), _two_digits))
            for pair in ("eagle3", "eagle", "mtp") for b in ("1", "4", "16")}
FIGURES |= {f"{prefix}.{name}": (file, make) for prefix, file in FRESH.items() for name, make in {
    "seed": lambda d: str(int(num(d, "seed"))),
    "commit": lambda d: str(d["commit"])[:7] + (" (dirty)" if d["dirty"] else ""),
    "pairs": lambda d: ", ".join(d["drawn"]),
    "within": lambda d: _of(d, "within_10pct", "cells"),
    "unanchored": lambda d: _of(d, "within_10pct_unanchored", "cells"),
    "inside": lambda d: _of(d, "inside_interval", "with_interval"),
    "calls": lambda d: _of(d, "calls_right", "calls"),
    "wrong_not_paying": lambda d: str(int(num(d, "summary", "wrong_not_paying"))),
    "half": lambda d: _of(d, "half_width_within_15pct", "half_widths"),
    "advice": lambda d: _of(d, "advice_within_5pct", "advice_batches"),
    "rounds_over_5": lambda d: _of(d, "measured_rounds_over_5pct", "cells"),
    "rounds_over_10": lambda d: _of(d, "measured_rounds_over_10pct", "cells"),
    "exact": lambda d: pct(num(d, "summary", "exact_prediction_within_10pct")),
    "outside_10": lambda d: _misses(d, "within_10pct"),
    "outside_interval": lambda d: _misses(d, "inside_interval"),
    "stated_half": lambda d: f"\u00b1{pct(_widths(d)[0])}",
    "needed_half": lambda d: f"\u00b1{pct(_widths(d)[1])}",
}.items()}
#: Seed 62829's draft0 (fresh15) judged again by the code before the speed anchor's guard (a replay at 6edcf58, the
#: measurements as run): what the guard changed on the first run made after it.
PRE_GUARD = "truth_fresh_62829_draft0_replay_6edcf58.json"
FIGURES |= {f"fresh15_pre_guard.{name}": (PRE_GUARD, lambda d, key=key: _of(d, *key))
            for name, key in {"within": ("within_10pct", "cells"),
                              "inside": ("inside_interval", "with_interval")}.items()}
#: Position 4's acceptance held out and extended from positions 1-3 as the verdict extends past the running K
#: (``acceptance_holdout.json``): observed over extended, the median and range by method family.
FIGURES |= {f"holdout.{name}": ("acceptance_holdout.json", lambda d, family=family: "{:.2f} ({:.2f}{}{:.2f}, {} "
                                "pair-traffics)".format(num(d, "by_family", family, "median_ratio"),
                                                        num(d, "by_family", family, "min_ratio"), DASH,
                                                        num(d, "by_family", family, "max_ratio"),
                                                        int(num(d, "by_family", family, "pair_traffics"))))
            for name, family in {"draft": "draft model", "eagle3": "EAGLE-3 head", "ngram": "n-gram lookup"}.items()}
#: Each K's tokens a step and step cost, predicted beside its own engine's steps (``k_curve.json``; the first n-gram
#: run since the extension check, ``k_curve_checked.json``, and replayed with it off, ``k_curve_checked_without.json``):
#: the median errors relative to the running K, below it, at 5-6 and at 7 and over.
FIGURES |= {f"{name}.{key}": (f"{name}.json", lambda d, group=group: "tokens {} ({} had a last step kept every "
                              "token), step {}, over {} cells".format(
                                  *(f"{num(d, 'summary', group, part):+.1%}" for part in ("tokens", "tokens_unkept",
                                                                                         "step")),
                                  int(num(d, "summary", group, "cells"))))
            for name in ("k_curve", "k_curve_checked", "k_curve_checked_without")
            for key, group in {"below": "below the running K", "near": "5-6", "far": "7 and over"}.items()
            if (name, key) != ("k_curve_checked_without", "below")}  # below the running K the check moves nothing
#: One K at one batch size served twice, by the advice's own engine and a fixed K's cell (``advice_noise.json``): how
#: many pairs of the two measurements, how many more than 5% apart, and their ratio's quartiles.
FIGURES |= {"advice_noise.pairs": ("advice_noise.json", lambda d: str(int(num(d, "pairs")))),
            "advice_noise.apart": ("advice_noise.json", lambda d: "{} of {}".format(
                int(num(d, "under_95pct") + num(d, "over_105pct")), int(num(d, "pairs")))),
            "advice_noise.under": ("advice_noise.json", lambda d: "{} of {}".format(
                int(num(d, "under_95pct")), int(num(d, "pairs")))),
            "advice_noise.quartiles": ("advice_noise.json", lambda d: "{:.2f}{}{:.2f}".format(
                d["quartiles"][0], DASH, d["quartiles"][1]))}
#: One target's plain step served at batch 1 on chat traffic, in ms, in two runs on it: the machine's speed each day.
FIGURES |= {f"{prefix}.plain_chat_b1": (FRESH[prefix], lambda d, pair=pair: "{:.1f}".format(
    num(d, "pairs", f"{pair}-chat", "plain_serving_ms", "1"))) for prefix, pair in (("fresh4", "eagle3"),
                                                                                   ("fresh5", "ngram"))}
#: Every fresh run together (``fresh_all.NAME``): the goals' counts summed over the files of FRESH.
ALL_FRESH = "every file of FRESH"
FIGURES |= {f"fresh_all.{name}": (ALL_FRESH, lambda docs, hit=hit, total=total: _share(
    *(sum(int(num(d, "summary", key)) for d in docs) for key in (hit, total))))
    for name, (hit, total) in {"within": ("within_10pct", "cells"), "inside": ("inside_interval", "with_interval"),
                               "calls": ("calls_right", "calls"),
                               "half": ("half_width_within_15pct", "half_widths"),
                               "advice": ("advice_within_5pct", "advice_batches"),
                               "rounds_over_5": ("measured_rounds_over_5pct", "cells")}.items()}
FIGURES["fresh_all.wrong_not_paying"] = (ALL_FRESH, lambda docs: str(sum(
    int(num(d, "summary", "wrong_not_paying")) for d in docs)))
FIGURES["fresh_all.runs"] = (ALL_FRESH, lambda docs: str(len(docs)))


def _bias(docs: list[Any], batch: int) -> str:
    """The point's mean error at ``batch`` over every fresh cell, by K: "K=1 +2.1%, K=2 +3.3%, ..."."""
    errors: dict[int, list[float]] = {}
    for d in docs:
        for cell in (c for r in d["pairs"].values() for c in r["cells"]):
            if cell["batch"] == batch and cell.get("predicted") is not None:
                errors.setdefault(int(cell["k"]), []).append(float(cell["error"]))
    return ", ".join(f"K={k} {100 * sum(e) / len(e):+.1f}%" for k, e in sorted(errors.items()))


FIGURES |= {f"fresh_all.bias_b{b}": (ALL_FRESH, lambda docs, b=b: _bias(docs, b)) for b in (1, 4, 16)}
#: The K a fresh run predicted from, as its workload states it ("predicted from one K=4 run").
RUNNING_K = re.compile(r"predicted from one K=(\d+) run")


def _advice_cells(docs: list[Any]) -> list[tuple[int, int, bool, bool]]:
    """Every fresh run's advice at each batch size: (the K its schedule ran there, the running K, within 5% of the
    best fixed K, the fixed engine at the advice's K within 5% of that best too)."""
    out = []
    for d in docs:
        match = RUNNING_K.search(d["workload"])
        if match is None:
            raise ValueError("no running K in the workload")
        for r in d["pairs"].values():
            advice = r.get("advice") or {}
            fixed = {(c["k"], c["batch"]): c["measured"] for c in r["cells"]}
            for batch, got in advice.get("by_batch", {}).items():
                b = int(batch)
                k = scheduled_k(advice.get("config"), b)
                same = fixed.get((k, b)) is not None and fixed[(k, b)] >= 0.95 * got["best"]
                out.append((k, int(match.group(1)), bool(got["within_5pct"]), same))
    return out


def _advice_reach(docs: list[Any], name: str) -> str:
    """How far the advice holds where it extrapolates over K: ``above`` (its K above the running one: "X of N"),
    ``above_ks`` (those K: "5-16"), ``within`` (at most the running K), ``within_same_k`` (its misses there where
    the fixed engine at its K met the best: two measurements of one K apart)."""
    cells = _advice_cells(docs)
    above = [c for c in cells if c[0] > c[1]]
    if name == "above_ks":
        return f"{min(c[0] for c in above)}{DASH}{max(c[0] for c in above)}"
    if name == "within_same_k":
        misses = [c for c in cells if c[0] <= c[1] and not c[2]]
        return f"{sum(c[3] for c in misses)} of {len(misses)}"
    chosen = above if name == "above" else [c for c in cells if c[0] <= c[1]]
    return f"{sum(c[2] for c in chosen)} of {len(chosen)}"


FIGURES |= {f"fresh_all.advice_{name}": (ALL_FRESH, lambda docs, name=name: _advice_reach(docs, name))
            for name in ("above", "above_ks", "within", "within_same_k")}


def render(name: str, results: Path, cache: dict[str, Any]) -> str:
    """The text of figure ``name`` from the results in ``results``."""
    if name not in FIGURES:
        raise FigureError(f"unknown figure {name!r} (scripts/figures.py FIGURES)")
    file, make = FIGURES[name]
    for f in FRESH.values() if file == ALL_FRESH else (file,):
        if f not in cache:
            try:
                cache[f] = json.loads((results / f).read_text())
            except (OSError, ValueError) as e:
                raise FigureError(f"figure {name}: cannot read {f} in {results}: {e}") from e
    if file == ALL_FRESH:
        cache.setdefault(file, [cache[f] for f in FRESH.values()])
    try:
        return make(cache[file])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise FigureError(f"figure {name}: cannot be made from {results / file} ({e!r})") from e


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, compare) every marked figure; the exit code as the module docstring says."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a figure differs")
    ap.add_argument("--root", type=Path, default=ROOT, help="where README.md and docs/ are")
    ap.add_argument("--results", type=Path, help="the results directory (default ROOT/benchmarks/results)")
    args = ap.parse_args(argv)
    results = args.results or args.root / "benchmarks" / "results"
    cache: dict[str, Any] = {}
    used: set[str] = set()
    changes: list[str] = []
    texts: dict[Path, str] = {}
    try:
        for doc in documents(args.root):
            path = args.root / doc

            def sub(m: re.Match[str], doc: str = doc) -> str:
                name, found = m.group(1), m.group(2)
                used.add(name)
                rendered = render(name, results, cache)
                if found != rendered:
                    changes.append(f"{doc}: figure {name}: found {found!r}, rendered {rendered!r}")
                return f"<!-- fig {name} -->{rendered}<!-- /fig -->"

            texts[path] = MARK.sub(sub, path.read_text())
        if unused := sorted(set(FIGURES) - used):
            raise FigureError(f"figures no document quotes: {', '.join(unused)}")
    except (FigureError, OSError) as e:
        print(f"figures: {e}", file=sys.stderr)
        return 2
    for line in changes:
        print(line, file=sys.stderr if args.check else sys.stdout)
    if args.check:
        return 1 if changes else 0
    for path, text in texts.items():
        if text != path.read_text():
            path.write_text(text)
    return 0

if __name__ == "__main__":
    sys.exit(main())

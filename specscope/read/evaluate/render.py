"""What ``specscope evaluate`` writes: JSON (:func:`to_dict`), the terminal summary (:func:`render_text`) and one
self-contained HTML page with its figures (:func:`render_html`); with ``--gate``, the decision first, then why and
what it was measured on."""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Callable
from typing import Any

from specscope.core.model import ClassCounts
from specscope.read.evaluate import gate_report
from specscope.read.evaluate.choose import RANKING_RULE, rank
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Schedule, ran_text
from specscope.read.figures import draw_png, html_page, html_table, img, na


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _cell_dict(c: Cell) -> dict[str, Any]:
    lo_hi = c.spread
    return {"speedup": _r(c.speedup), "min": _r(lo_hi[0]) if lo_hi else None, "max": _r(lo_hi[1]) if lo_hi else None,
            "rounds": [_r(x) for x in c.ratios], "plain_tok_s": [_r(x, 1) for x in c.plain],
            "speculative_tok_s": [_r(x, 1) for x in c.spec], "predicted": _r(c.predicted),
            "predicted_interval": None if c.interval is None else [_r(c.interval[0]), _r(c.interval[1])],
            "explained": _r(c.explained)}


def cross_k(c: Candidate) -> dict[str, Any] | None:
    """How far the live verdict can be trusted on this traffic: each cell predicted from the candidate's first K
    before it was measured, against its measurement. None where no such cell was measured."""
    cells = c.cross_k()
    if not cells:
        return None
    errors = [x.predicted / x.measured - 1.0 for x in cells]
    worst = max(range(len(cells)), key=lambda i: abs(errors[i]))
    return {"from_k": c.forecast_k, "cells": len(cells),
            "within_10pct": sum(abs(e) <= 0.10 for e in errors),
            "inside_interval": sum(x.interval[0] <= x.measured <= x.interval[1] for x in cells if x.interval),
            "with_interval": sum(x.interval is not None for x in cells),
            "median_abs_error": _r(statistics.median(abs(e) for e in errors)),
            "worst": {"k": cells[worst].k, "batch": cells[worst].batch_size, "error": _r(errors[worst])}}


def cross_k_text(c: Candidate) -> str | None:
    """:func:`cross_k` in a line."""
    x = cross_k(c)
    if x is None:
        return None
    worst = x["worst"]
    where = "the schedule" if worst["k"] == -1 else f"K={worst['k']}"
    return (f"predicted from K={x['from_k']}'s run before measuring (how far the live verdict can be trusted on this "
            f"traffic): {x['within_10pct']} of {x['cells']} cells within 10%, {x['inside_interval']} of "
            f"{x['with_interval']} inside the interval, median error {x['median_abs_error']:.0%}, worst "
            f"{worst['error']:+.0%} ({where} at batch {worst['batch']})")


def to_dict(ev: Evaluation) -> dict[str, Any]:
    """The evaluation as JSON-ready data (batch sizes and K as string keys); with ``--gate``, its ``gate`` object
    (:func:`specscope.read.evaluate.gate_report.to_dict`) in place of the ranking."""
    if ev.gate is not None:
        return {"specscope_evaluate": 1, "target": ev.target, "partial": ev.partial, "note": ev.note,
                "seconds": round(ev.seconds, 1), "settings": ev.settings, "prompts": ev.prompts,
                "gate": gate_report.to_dict(ev.gate)}
    sizes = ev.settings["batch_sizes"]
    ranked = rank(ev.candidates, sizes)
    cands = []
    for c, s in ranked:
        sched = c.schedule
        cands.append({
            "name": c.name, "method": c.method, "draft": c.draft, "status": c.status, "note": c.note,
            "score": _r(s), "tokenizer": c.tokenizer, "draft_kv_cost": c.draft_kv, "cross_k": cross_k(c),
            "by_k": {str(k): {
                "acceptance": _r(run.acceptance), "alpha": _r(run.alpha),
                "per_position": [_r(x) for x in run.per_position],
                "by_class": {name: {"requests": a.requests, "drafted": a.draft_tokens, "accepted": a.accepted,
                                    "acceptance": _r(a.acceptance_rate),
                                    "per_position": [_r(x) for x in a.per_position]}
                             for name, a in sorted(run.by_class.items())},
                "k0_price": {str(b): _r(x) for b, x in sorted(run.k0_price.items())},
                "batch": {str(b): _cell_dict(cell) for b, cell in sorted(run.cells.items())},
            } for k, run in sorted(c.runs.items())},
            "schedule": None if sched is None else {
                "best": {str(ch.batch_size): {"best_k": ch.best_k, "best_speedup": _r(ch.best_speedup),
                                              "schedule_k": ch.k, "expected": _r(ch.expected),
                                              "k0_price": _r(ch.k0_price)}
                         for ch in sched.choices},
                "ranges": [list(r) for r in sched.ranges],
                "speculative_config": sched.config,
                "verdict": _verdict(sched),
                "same_as_k": sched.same_as_k,
                "measured": {str(b): _cell_dict(cell) for b, cell in sorted(sched.cells.items())},
            },
        })
    return {"specscope_evaluate": 1, "target": ev.target, "partial": ev.partial, "note": ev.note,
            "seconds": round(ev.seconds, 1), "settings": ev.settings, "prompts": ev.prompts,
            "ranking_rule": RANKING_RULE, "ranking": [c.name for c, _ in ranked], "candidates": cands}


def _verdict(sched: Schedule) -> str:
    if sched.config is None:
        return "run without speculation: no K pays at any batch size measured (remove speculative_config)"
    one = sched.same_as_k
    what, there = ("this schedule", "its range there") if one is None else (f"K={one} at every batch size", f"K={one}")
    losing = [c for c in sched.choices if c.best_k == 0]
    if not losing:
        return f"speculate with {what}"
    unpriced = [str(c.batch_size) for c in losing if c.k0_price is None]
    return (f"speculate with {what}; at batch " + ", ".join(str(c.batch_size) for c in losing)
            + f" no K pays, and {there} is not plain speed (" + ", ".join(f"{c.expected:.2f}x" for c in losing)
            + (f"; K = 0 unpriced at batch {', '.join(unpriced)}: the best K measured kept" if unpriced else "")
            + "): if the engine runs there most, run without speculation instead")


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _cell_text(c: Cell | None) -> str:
    if c is None or c.speedup is None:
        return "n/a"
    lo, hi = c.spread or (c.speedup, c.speedup)
    spread = f" [{lo:.2f}-{hi:.2f}]" if len(c.ratios) > 1 else ""
    interval = f" {c.interval[0]:.2f}-{c.interval[1]:.2f}" if c.interval is not None else ""
    return f"{c.speedup:.2f}x{spread}" + (f" (predicted before {c.predicted:.2f}x{interval})"
                                          if c.predicted is not None else "")


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def render_text(ev: Evaluation) -> str:
    """The evaluation for a terminal."""
    if ev.gate is not None:
        return gate_report.render_text(ev, ev.gate)
    s, p = ev.settings, ev.prompts
    sizes = s["batch_sizes"]
    lines = [f"specscope evaluate: {ev.target}; K {', '.join(map(str, s['k']))}; batch sizes "
             f"{', '.join(map(str, sizes))}; {s['rounds']} round(s) of {s['window_s']:g} s windows"
             + (" — PARTIAL: " + (ev.note or "interrupted") if ev.partial else ""),
             f"prompts: {p.get('used', 0)} used; {p.get('skipped_long', 0)} skipped (prompt + max_tokens longer "
             f"than max_model_len {p.get('max_model_len', '?')}); classes "
             + ", ".join(f"{k} {v}" for k, v in p.get("classes", {}).items()) + "; " + ran_text(p),
             f"ranking: {RANKING_RULE}"]
    if s.get("data_parallel_size", 1) > 1:
        lines.append(f"data parallel size {s['data_parallel_size']}: vLLM drops a per-batch-size schedule there, so "
                     "each candidate's advice is one K, the best over the batch sizes")
    for n, (c, sc) in enumerate(rank(ev.candidates, sizes), 1):
        tok = f"; tokenizer {c.tokenizer['verdict']}" if c.tokenizer else ""
        lines.append(f"{n}. {c.name} ({c.method}) score {_x(sc)}{tok}; {c.status}"
                     + (f": {c.note}" if c.note else ""))
        if c.draft_kv:
            lines.append(f"   KV: {c.draft_kv['text']}")
        if (trust := cross_k_text(c)) is not None:
            lines.append(f"   {trust}")
        for k, run in sorted(c.runs.items()):
            lines.append(f"   K={k}: " + "  ".join(f"batch {b} {_cell_text(run.cells.get(b))}" for b in sizes))
            said = [f"by position {' '.join(_pct(x) for x in run.per_position)}"] if run.per_position else []
            if run.by_class:
                said.append("by class " + ", ".join(f"{name} {_pct(a.acceptance_rate)} ({a.requests} requests)"
                                                    for name, a in sorted(run.by_class.items())))
            lines.append(f"        acceptance {_pct(run.acceptance)}" + (f" ({'; '.join(said)})" if said else ""))
        sched = c.schedule
        if sched is None:
            continue
        lines.append("   best K: " + "; ".join(
            f"batch {ch.batch_size} " + (f"K={ch.best_k} {ch.best_speedup:.2f}x" if ch.best_k else
                                         "none pays (remove speculative_config)") for ch in sched.choices))
        lines.append(f"   {_verdict(sched)}")
        if sched.config is not None:
            lines.append("   speculative_config: " + json.dumps(sched.config))
            lines.append(("   schedule measured: " if sched.same_as_k is None else
                          f"   K={sched.same_as_k} at every batch size, measured: ") + "  ".join(
                f"batch {ch.batch_size} (K={sched.same_as_k or ch.k}) {_cell_text(sched.cells.get(ch.batch_size))}"
                for ch in sched.choices))
    return "\n".join(lines) + "\n"


def _speedup_bars(ev: Evaluation) -> Callable[[Any], None]:
    sizes = ev.settings["batch_sizes"]
    cands = [c for c, _ in rank(ev.candidates, sizes)]

    def draw(ax: Any) -> None:
        width = 0.8 / max(1, 2 * len(cands))
        for i, c in enumerate(cands):
            for j, kind in enumerate(("best K", "schedule")):
                xs, ys, lo, hi, labels = [], [], [], [], []
                for x, b in enumerate(sizes):
                    if kind == "best K":
                        best = c.best(b)
                        cell = c.runs[best[0]].cells[b] if best else None
                        label = f"K={best[0]}" if best else ""
                    else:
                        cell = c.schedule.cells.get(b) if c.schedule and c.schedule.config else None
                        label = ""
                    if cell is None or cell.speedup is None:
                        continue
                    mn, mx = cell.spread or (cell.speedup, cell.speedup)
                    xs.append(x + (2 * i + j + 0.5) * width - 0.4)
                    ys.append(cell.speedup)
                    lo.append(cell.speedup - mn)
                    hi.append(mx - cell.speedup)
                    labels.append(label)
                if not xs:
                    continue
                bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=f"C{i}",
                              alpha=1.0 if j == 0 else 0.45, hatch="" if j == 0 else "//",
                              label=f"{c.short}: {kind}")
                for bar, label in zip(bars, labels, strict=True):
                    if label:
                        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                                    va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(sizes)), [f"batch {b}" for b in sizes])
        ax.set_ylabel("measured speedup (median; bars: min-max)")
        ax.set_title("Measured speedup over no speculation")
        ax.legend(fontsize=7, ncol=2)

    return draw


def _class_bars(c: Candidate) -> Callable[[Any], None]:
    names = sorted({name for run in c.runs.values() for name in run.by_class})
    ks = sorted(k for k, run in c.runs.items() if run.by_class)

    def draw(ax: Any) -> None:
        width = 0.8 / max(1, len(ks))
        for j, k in enumerate(ks):
            rates = [(c.runs[k].by_class.get(n) or ClassCounts()).acceptance_rate or 0.0 for n in names]
            ax.bar([x + (j + 0.5) * width - 0.4 for x in range(len(names))], rates, width, label=f"K={k}")
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("acceptance (accepted / drafted)")
        ax.set_title(f"{c.short}: acceptance by traffic class")
        ax.legend(fontsize=8)

    return draw


def _predicted_vs_measured(ev: Evaluation) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        top = 1.0
        for i, (c, _) in enumerate(rank(ev.candidates, ev.settings["batch_sizes"])):
            pts = [(cell.speedup, cell.predicted) for run in c.runs.values() for cell in run.cells.values()
                   if cell.speedup is not None and cell.predicted is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, "o", color=f"C{i}", label=c.short)
                top = max(top, *xs, *ys)
        ax.plot([0, top * 1.05], [0, top * 1.05], "--", color="gray", linewidth=0.8)
        ax.set_xlabel("measured speedup")
        ax.set_ylabel("predicted before measuring")
        ax.set_title("Predicted from each candidate's first K, against measured")
        ax.legend(fontsize=8)

    return draw


def render_html(ev: Evaluation) -> str:
    """One self-contained page (plots as embedded PNGs)."""
    if ev.gate is not None:
        return gate_report.render_html(ev, ev.gate)
    s, p, sizes = ev.settings, ev.prompts, ev.settings["batch_sizes"]
    title = f"specscope evaluate: {ev.target}"
    out = [f"<h1>{html.escape(title)}</h1>"]
    if ev.partial:
        out.append(f"<p><strong>PARTIAL: {html.escape(ev.note or 'interrupted')}</strong>; what was measured "
                   "before it stopped.</p>")
    out.append(f"<p>K {', '.join(map(str, s['k']))}; batch sizes {', '.join(map(str, sizes))} held full; "
               f"{s['rounds']} round(s) of {s['window_s']:g} s windows, plain and speculative alternating; "
               f"{p.get('used', 0)} prompts ({p.get('skipped_long', 0)} longer than max_model_len "
               f"{p.get('max_model_len', '?')} skipped); classes "
               + html.escape(", ".join(f"{k} {v}" for k, v in p.get("classes", {}).items()) + "; " + ran_text(p))
               + f"; took {ev.seconds / 60:.1f} min</p>")
    ranked = rank(ev.candidates, sizes)
    out.append("<h2>Ranking</h2>" + f"<p>By {html.escape(RANKING_RULE)}.</p><div class='rank'>" + html_table(
        ["#", "candidate", "score", *(f"batch {b}: best K" for b in sizes), "verdict"],
        [(n, c.short, _x(sc), *(_best_text(c, b) for b in sizes),
          _verdict(c.schedule) if c.schedule else f"{c.status}{': ' + c.note if c.note else ''}")
         for n, (c, sc) in enumerate(ranked, 1)]) + "</div>")
    cells = [cell for c in ev.candidates for run in c.runs.values() for cell in run.cells.values()]
    if any(cell.speedup is not None for cell in cells):
        out.append(img(draw_png(_speedup_bars(ev), height=3.8), "measured speedup by batch size"))
    if any(cell.speedup is not None and cell.predicted is not None for cell in cells):
        out.append(img(draw_png(_predicted_vs_measured(ev), width=5.0, height=4.0), "predicted against measured"))
    for c, sc in ranked:
        out.append(f"<h2>{html.escape(c.name)} ({html.escape(c.method)}): {_x(sc)}</h2>")
        facts = [f"status: {c.status}" + (f" ({c.note})" if c.note else "")]
        if c.tokenizer:
            why = [*c.tokenizer.get("reasons", []), *c.tokenizer.get("warnings", [])]
            facts.append(f"tokenizer: {c.tokenizer['verdict']}" + "".join(f"; {x}" for x in why))
        facts.append("KV capacity: " + (c.draft_kv["text"] if c.draft_kv else "no draft model, or not known"))
        if (trust := cross_k_text(c)) is not None:
            facts.append(trust)
        out.append("<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in facts) + "</ul>")
        if not c.runs:
            continue
        out.append(html_table(["K", "acceptance", "alpha", "by position",
                                *(f"batch {b}: measured [min-max] (predicted before, its interval)" for b in sizes)],
                               [(k, _pct(run.acceptance), _x(run.alpha).rstrip("x"),
                                 " ".join(_pct(x) for x in run.per_position),
                                 *(_cell_text(run.cells.get(b)) for b in sizes)) for k, run in sorted(c.runs.items())]))
        if any(run.by_class for run in c.runs.values()):
            out.append(img(draw_png(_class_bars(c), height=2.8), f"{c.name}: acceptance by class"))
            out.append(html_table(["K", "class", "requests", "drafted", "accepted", "acceptance", "by position"],
                                   [(k, name, a.requests, a.draft_tokens, a.accepted, _pct(a.acceptance_rate),
                                     " ".join(_pct(x) for x in a.per_position))
                                    for k, run in sorted(c.runs.items()) for name, a in sorted(run.by_class.items())]))
        sched = c.schedule
        if sched is not None:
            out.append("<h3>Schedule</h3>" + html_table(
                ["batch", "best K (0: remove speculative_config)", "its speedup", "K in vLLM's schedule",
                 "expected", "schedule measured [min-max]"],
                [(ch.batch_size, ch.best_k, _x(ch.best_speedup), ch.k, _x(ch.expected),
                  _cell_text(sched.cells.get(ch.batch_size)) if sched.config else "not run")
                 for ch in sched.choices]))
            out.append(f"<p>{html.escape(_verdict(sched))}</p>")
            if sched.config is not None:
                out.append("<pre style='white-space:pre-wrap'>" + html.escape(json.dumps({"speculative_config": {
                    **{k: v for k, v in c.config(1).items() if k != "num_speculative_tokens"}, **sched.config}}))
                    + "</pre>")
        elif c.status == "measured":
            out.append(na("no schedule: nothing measured"))
    return html_page(title, "".join(out), ".rank td:last-child{text-align:left}")


def _best_text(c: Candidate, b: int) -> str:
    ch = next((x for x in c.schedule.choices if x.batch_size == b), None) if c.schedule else None
    if ch is None:
        return "n/a"
    return f"K={ch.best_k} {ch.best_speedup:.2f}x" if ch.best_k else "none pays"

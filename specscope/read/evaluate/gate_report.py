"""The promotion gate's JSON (:func:`to_dict`, read back by :func:`from_dict`; the schema: docs/evaluate.md, "The
promotion gate"), and its terminal summary and HTML page, the decision first (:func:`render_text`,
:func:`render_html`, which :mod:`specscope.read.evaluate.render` hands an evaluation with a gate to)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from specscope.core.model import ClassCounts
from specscope.read.evaluate import gate as gating
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Gate, GateArm, ran_text
from specscope.read.evaluate.stats import CONFIDENCE, Estimate
from specscope.read.figures import draw_png, html_page, html_table, img

#: The version of the gate's JSON (``specscope_gate`` in it).
SCHEMA = 1


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _est(e: Estimate | None) -> dict[str, Any] | None:
    return None if e is None else {"value": _r(e.value), "low": _r(e.low), "high": _r(e.high), "rounds": e.rounds}


def _arm(a: GateArm) -> dict[str, Any]:
    c = a.candidate
    return {
        "name": c.name, "method": c.method, "draft": c.draft, "status": c.status, "note": c.note,
        "tokenizer": c.tokenizer,
        "acceptance": {name: {"requests": n.requests, "spec_steps": n.spec_steps, "drafted": n.draft_tokens,
                              "accepted": n.accepted, "accepted_by_position": list(n.accepted_by_position),
                              "acceptance": _r(n.acceptance_rate),
                              "interval": (None if (iv := a.acceptance_interval.get(name)) is None
                                           else [_r(iv[0]), _r(iv[1])])}
                       for name, n in sorted(a.acceptance.items())},
        "measured": {str(b): {name: {"plain_tok_s": list(cell.plain), "speculative_tok_s": list(cell.spec)}
                              for name, cell in sorted(by_class.items())}
                     for b, by_class in sorted(a.cells.items())},
    }


def to_dict(gate: Gate, d: gating.Decision | None = None) -> dict[str, Any]:
    """The gate as JSON-ready data: the decision, its reasons and figures, and every measurement it came from (the
    schema: docs/evaluate.md, "The promotion gate")."""
    d = d or gating.decide(gate)
    return {
        "specscope_gate": SCHEMA, "decision": d.decision, "exit_code": d.exit_code, "reasons": list(d.reasons),
        "headline": gating.headline(gate, d), "k": gate.k, "batch_sizes": list(gate.batch_sizes), "margin": gate.margin,
        "confidence": gate.confidence, "class_confidence": _r(d.class_confidence, 6),
        "weak_class": gate.weak, "weak_basis": gate.weak_basis, "shares": {c: _r(s, 6) for c, s in
                                                                           sorted(gate.shares.items())},
        "shares_source": gate.shares_source, "coverage": _r(gate.coverage),
        "rule": gating.RULE, "interval_method": gating.INTERVAL_METHOD,
        "candidate": _arm(gate.candidate), "incumbent": _arm(gate.incumbent),
        "by_batch": {str(r.batch_size): {
            "decision": r.decision, "reasons": list(r.reasons), "rounds_to_decide": r.rounds_to_decide,
            "weighted": {"incumbent": _est(r.incumbent), "candidate": _est(r.candidate), "ratio": _est(r.ratio)},
            "classes": {c.name: {"share": _r(c.share), "time_weight": _r(c.weight), "incumbent": _est(c.incumbent),
                                 "candidate": _est(c.candidate), "ratio": _est(c.ratio),
                                 "ratio_bonferroni": _est(c.strict), "regresses": c.regresses,
                                 "rounds_to_decide": c.rounds_to_decide}
                        for c in r.classes},
        } for r in d.batches},
    }


class SchemaError(ValueError):
    """A document that is not a gate's JSON."""


def _arm_from(doc: dict[str, Any]) -> GateArm:
    c = Candidate(doc["name"], doc["method"], doc.get("draft"), status=doc.get("status", "measured"),
                  note=doc.get("note"), tokenizer=doc.get("tokenizer"))
    cells = {int(b): {name: Cell(list(m["plain_tok_s"]), list(m["speculative_tok_s"])) for name, m in by.items()}
             for b, by in doc.get("measured", {}).items()}
    acc = {name: ClassCounts(a["requests"], a["spec_steps"], a["drafted"], a["accepted"],
                             tuple(a.get("accepted_by_position", ())))
           for name, a in doc.get("acceptance", {}).items()}
    ivs = {name: (a["interval"][0], a["interval"][1]) for name, a in doc.get("acceptance", {}).items()
           if a.get("interval")}
    return GateArm(c, cells, acc, ivs)


def from_dict(doc: dict[str, Any]) -> Gate:
    """The :class:`Gate` a :func:`to_dict` document was made from (its decision is ``gate.decide``'s again)."""
    if not isinstance(doc, dict) or doc.get("specscope_gate") != SCHEMA:
        raise SchemaError(f"not a specscope gate document (version {SCHEMA})")
    try:
        return Gate(int(doc["k"]), [int(b) for b in doc["batch_sizes"]], _arm_from(doc["candidate"]),
                    _arm_from(doc["incumbent"]), {c: float(s) for c, s in doc["shares"].items()},
                    doc.get("shares_source", "prompts file"), doc.get("coverage"), float(doc["margin"]),
                    doc.get("weak_class"), doc.get("weak_basis", ""), float(doc.get("confidence", CONFIDENCE)))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SchemaError(f"a gate document with a missing or malformed field: {exc}") from None


# -- the terminal and the page
def _e(e: Estimate | None) -> str:
    return "n/a" if e is None else e.text()


def _acc(arm: GateArm, name: str) -> str:
    n = arm.acceptance.get(name)
    if n is None or n.acceptance_rate is None:
        return "n/a"
    iv = arm.acceptance_interval.get(name)
    return f"{n.acceptance_rate:.0%}" + (f" [{iv[0]:.0%}-{iv[1]:.0%}]" if iv else "")


def _class_label(g: Gate, c: gating.ClassResult) -> str:
    return c.name + (" (weak)" if c.name == g.weak else "")


def _lose(c: gating.ClassResult) -> str:
    return {True: "loses beyond the margin", False: "within the margin", None: "not yet known"}[c.regresses]


def _gate_facts(ev: Evaluation, g: Gate, d: gating.Decision) -> list[str]:
    """What the decision rests on, a line each."""
    s, p = ev.settings, ev.prompts
    return [
        f"{g.candidate.candidate.name} (candidate) against {g.incumbent.candidate.name} (incumbent), "
        f"{g.candidate.candidate.method} at K={g.k}, batch {', '.join(map(str, g.batch_sizes))} held full; "
        f"{s.get('rounds', '?')} round(s) of {s.get('window_s', 0):g} s windows per class and draft, plain and "
        f"speculative on the same prompts, both drafts on the same prompts in the same round",
        "shares: " + ", ".join(f"{c} {x:.0%}" for c, x in sorted(g.shares.items())) + f" ({g.shares_source}"
        + (f"; the file's classes are {g.coverage:.0%} of the live traffic" if g.coverage is not None else "") + ")",
        f"weak class: {g.weak or 'not known'}" + (f" ({g.weak_basis})" if g.weak_basis else ""),
        f"margin: a class may lose {g.margin:.0%} of its speedup under the incumbent; intervals at "
        f"{g.confidence:.0%}" + (f", each class's at {d.class_confidence:.2%} (Bonferroni)"
                                 if d.class_confidence is not None else ""),
        f"rule: {gating.RULE}",
        f"interval: {gating.INTERVAL_METHOD}",
        *(f"{role}: {a.candidate.status}" + (f" ({a.candidate.note})" if a.candidate.note else "")
          + (f"; tokenizer {a.candidate.tokenizer['verdict']}" if a.candidate.tokenizer else "")
          for role, a in (("candidate", g.candidate), ("incumbent", g.incumbent))),
        f"prompts: {p.get('used', 0)} used; {p.get('skipped_long', 0)} skipped (prompt + max_tokens longer than "
        f"max_model_len {p.get('max_model_len', '?')}); classes "
        + ", ".join(f"{k} {v}" for k, v in p.get("classes", {}).items()) + "; " + ran_text(p),
    ]


def render_text(ev: Evaluation, g: Gate) -> str:
    """The gate for a terminal: the headline first, then each batch size's figures, then what it rests on."""
    d = gating.decide(g)
    lines = [gating.headline(g, d) + (" — PARTIAL: " + (ev.note or "interrupted") if ev.partial else "")]
    lines += [f"  - {x}" for x in d.reasons[1:]]
    for r in d.batches:
        lines.append(f"batch {r.batch_size}: {r.decision}; traffic speedup over plain decoding: incumbent "
                     f"{_e(r.incumbent)}, candidate {_e(r.candidate)}; candidate / incumbent {_e(r.ratio)}"
                     + (f" ({r.ratio.rounds} rounds)" if r.ratio else ""))
        for c in r.classes:
            lines.append(f"  {_class_label(g, c)}, {c.share:.0%} of the traffic: acceptance "
                         f"{_acc(g.incumbent, c.name)} -> {_acc(g.candidate, c.name)}; speedup {_e(c.incumbent)} "
                         f"-> {_e(c.candidate)}: {_e(c.ratio)} the incumbent's, {_lose(c)}")
    lines += _gate_facts(ev, g, d)
    return "\n".join(lines) + "\n"


def _gate_bars(g: Gate, r: gating.BatchResult) -> Callable[[Any], None]:
    rows = [(name, e) for name, e in [("traffic", r.ratio), *((_class_label(g, c), c.ratio) for c in r.classes)]
            if e is not None]

    def draw(ax: Any) -> None:
        xs = list(range(len(rows)))
        ys = [e.value for _, e in rows]
        lo = [e.value - (e.low if e.low is not None else e.value) for _, e in rows]
        hi = [(e.high if e.high is not None else e.value) - e.value for _, e in rows]
        ax.bar(xs, ys, 0.6, yerr=[lo, hi], capsize=4, color=["C0"] + ["C1"] * (len(rows) - 1))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.0 - g.margin, color="C3", linestyle="--", linewidth=0.8, label=f"1 - margin ({g.margin:.0%})")
        ax.set_xticks(xs, [name for name, _ in rows], fontsize=8)
        ax.set_ylabel("candidate / incumbent speedup")
        ax.set_title(f"batch {r.batch_size}: the candidate's speedup over the incumbent's (bars: intervals)")
        ax.legend(fontsize=8)

    return draw


def render_html(ev: Evaluation, g: Gate) -> str:
    """One self-contained page: the decision and its reasons first, each batch size's table and plot, then what it
    rests on."""
    d = gating.decide(g)
    title = f"specscope evaluate --gate: {ev.target}"
    name = {gating.PROMOTE: "PROMOTE", gating.HOLD: "HOLD", gating.REJECT: "REJECT"}.get(d.decision, "NO DECISION")
    out = [f"<h1>{html.escape(title)}</h1>",
           f"<div class='decision {d.decision}'><h2>Decision: {name} (exit {d.exit_code})</h2><p>"
           + html.escape(f"{g.candidate.candidate.short} over {g.incumbent.candidate.short} at K={g.k}") + "</p><ul>"
           + "".join(f"<li>{html.escape(x)}</li>" for x in d.reasons) + "</ul></div>"]
    if ev.partial:
        out.append(f"<p><strong>PARTIAL: {html.escape(ev.note or 'interrupted')}</strong>; decided on what was "
                   "measured before it stopped.</p>")
    for r in d.batches:
        out.append(f"<h2>Batch {r.batch_size}: {html.escape(r.decision)}</h2>")
        rows: list[tuple[Any, ...]] = [
            ("traffic (weighted)", "100%", "", "", _e(r.incumbent), _e(r.candidate), _e(r.ratio),
             "interval above 1" if r.ratio and r.ratio.low and r.ratio.low > 1 else
             "interval below 1" if r.ratio and r.ratio.high and r.ratio.high < 1 else "not yet known")]
        rows += [(_class_label(g, c), f"{c.share:.0%}", _acc(g.incumbent, c.name), _acc(g.candidate, c.name),
                  _e(c.incumbent), _e(c.candidate), _e(c.ratio), _lose(c)) for c in r.classes]
        out.append(html_table(["", "share", "acceptance: incumbent", "candidate", "speedup: incumbent", "candidate",
                               "candidate / incumbent", "against the margin"], rows))
        if r.ratio is not None or any(c.ratio is not None for c in r.classes):
            out.append(img(draw_png(_gate_bars(g, r), height=3.0), f"batch {r.batch_size}: candidate / incumbent"))
    out.append("<h2>What it rests on</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>"
                                                        for x in _gate_facts(ev, g, d)) + "</ul>")
    style = (".decision{border:2px solid #888;padding:0 1em;margin:1em 0}.decision.promote{border-color:#2a2}"
             ".decision.reject{border-color:#c22}.decision.hold{border-color:#c90}")
    return html_page(title, "".join(out), style)

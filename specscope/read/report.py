"""``specscope report``: one self-contained HTML page with plots, from a live endpoint, a recording or the truth
benchmark's results.

For an engine (live or recorded): acceptance over time against the weak-draft line, acceptance by draft position,
acceptance by position in the output (vLLM's ``detailed`` per-request metrics), the expected speedup for every K
at each batch size measured, acceptance by traffic class, and the K table with vLLM's ready-to-paste schedule.
For the benchmark's results: predicted against measured speedup by K and batch size, and the recommended K against
the best one measured.
Plots are PNGs inside the page (matplotlib, the ``report`` extra); nothing is fetched when the page is opened.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specscope.core import acceptance as acc
from specscope.core import codec
from specscope.core.model import RequestRecord, Snapshot, StepProfile, TrafficClass
from specscope.export.summary import percent, summary
from specscope.read.figures import draw_png, html_page, html_table, img, na
from specscope.verdict import by_batch_size, class_speedup, estimate, k_table, recommended_config, with_baseline

#: The weak-draft line drawn on the acceptance plot (the alert rule's default threshold).
WEAK_DRAFT = 0.3


class ReportError(ValueError):
    """Input the report cannot be made from (one line; exit code 2)."""


class SourceDown(ReportError):
    """The live endpoint did not answer (exit code 1, as ``top --once``)."""


@dataclass
class EngineReport:
    """One engine: its acceptance over time and its last snapshot."""

    name: str
    snapshot: Snapshot
    #: (seconds since the first snapshot, acceptance over the window ending then)
    acceptance: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Report:
    """What a page shows: engines, or the truth benchmark's results."""

    title: str
    source: str
    engines: list[EngineReport] = field(default_factory=list)
    truth: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- inputs
def load(source: str, *, window_s: float = 30.0, duration_s: float = 30.0, interval_s: float = 1.0,
         baseline: StepProfile | None = None, headers: dict[str, str] | None = None) -> Report:
    """A report from a URL (polled for ``duration_s``), a recording (``top --record``) or ``truth.json``."""
    if source.startswith(("http://", "https://")):
        rep = _from_endpoint(source, window_s, duration_s, interval_s, headers or {})
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ReportError(f"cannot read {source}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ReportError(f"{source} is not a specscope recording or benchmark result (not text)") from None
        rep = _from_text(source, text, window_s)
    if baseline is not None:
        for e in rep.engines:
            e.snapshot = with_baseline(e.snapshot, baseline)
            if e.snapshot.baseline_problem:
                raise ReportError(f"{e.name}: baseline refused: {e.snapshot.baseline_problem}")
    return rep


def _from_text(source: str, text: str, window_s: float) -> Report:
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("benchmark") == "truth":
        return Report("speculative decoding: predicted against measured speedup", source, truth=doc)
    snaps: dict[str, list[Snapshot]] = {}
    for line in text.splitlines():
        try:
            d = json.loads(line)
            snaps.setdefault(str(d["target"]), []).append(codec.from_dict(d["snapshot"]))
        except (ValueError, KeyError, TypeError):
            continue
    if not snaps:
        raise ReportError(f"{source} is not a specscope recording (specscope top --record) or benchmark result")
    return Report(f"speculative decoding report: {Path(source).name}", source,
                  [_engine(name, series, window_s) for name, series in snaps.items()])


def _from_endpoint(url: str, window_s: float, duration_s: float, interval_s: float,
                   headers: dict[str, str]) -> Report:
    from specscope.read.scrape import EndpointSource, NotAnEndpoint, SourceError

    src = EndpointSource(url, headers=headers)
    series: list[Snapshot] = []
    deadline = time.monotonic() + duration_s
    while True:
        try:
            series.append(src.fetch())
        except NotAnEndpoint as exc:
            if not series:  # another kind of server (vLLM's root): bad input, not a server down
                raise ReportError(str(exc)) from None
        except SourceError as exc:
            if not series:
                raise SourceDown(str(exc)) from None
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    return Report(f"speculative decoding report: {url}", url, [_engine(url, series, window_s)])


#: Request records a report keeps from a series (as the hub and ``specscope top --replay`` do).
MAX_REQUESTS = 1000


def _engine(name: str, series: list[Snapshot], window_s: float) -> EngineReport:
    """Acceptance over a sliding window, from successive lifetime counts; the last snapshot with the series'
    requests (a recording's lines each hold only the requests new since the line before)."""
    kept: dict[tuple[str, int], RequestRecord] = {}
    for s in series:
        kept.update(((r.request_id, r.final_seq), r) for r in s.requests)
    last = replace(series[-1], requests=tuple(list(kept.values())[-MAX_REQUESTS:]))
    start = series[0].time
    points: list[tuple[float, float]] = []
    j = 0
    for s in series:
        while series[j].time < s.time - window_s:
            j += 1
        a, b = s.lifetime.spec, series[j].lifetime.spec
        if a is None or b is None or s is series[j]:
            continue
        drafted = a.draft_tokens - b.draft_tokens
        if drafted > 0:
            points.append((s.time - start, (a.accepted - b.accepted) / drafted))
    return EngineReport(name, last, points)


# ----------------------------------------------------------------------------- plots
def _acceptance_over_time(e: EngineReport) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        xs, ys = zip(*e.acceptance, strict=True)
        ax.plot(xs, ys, color="#1f77b4", label="acceptance (accepted / drafted)")
        ax.axhline(WEAK_DRAFT, color="#d62728", linestyle="--", label=f"weak draft ({WEAK_DRAFT:.0%})")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("seconds")
        ax.set_ylabel("acceptance")
        ax.set_title("Acceptance over time")
        ax.legend(loc="lower right", fontsize=8)

    return draw


def _per_position(snap: Snapshot) -> Callable[[Any], None]:
    spec = snap.lifetime.spec

    def draw(ax: Any) -> None:
        assert spec is not None
        rates, cond = spec.per_position, spec.conditional_per_position
        xs = range(len(rates))
        ax.bar(xs, rates, color="#1f77b4", label="drafts accepted up to this position")
        ax.plot(xs, [c if c is not None else float("nan") for c in cond], "o-", color="#ff7f0e",
                label="given the earlier positions")
        ax.set_xticks(list(xs))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"Acceptance by draft position (alpha {spec.alpha or 0:.2f})")
        ax.legend(loc="upper right", fontsize=8)

    return draw


def _by_output_position(snap: Snapshot) -> Callable[[Any], None]:
    pos = snap.acceptance_by_output_position

    def draw(ax: Any) -> None:
        assert pos is not None
        edges = (0, *pos.bounds)
        labels = [f"{lo}-{hi - 1}" for lo, hi in zip(edges, pos.bounds, strict=False)] + [f"{pos.bounds[-1]}+"]
        keep = [i for i, d in enumerate(pos.draft_tokens) if d]
        ax.bar(range(len(keep)), [pos.rates[i] or 0.0 for i in keep], color="#2ca02c")
        for x, i in enumerate(keep):
            ax.annotate(f"{pos.draft_tokens[i]:,}", (x, pos.rates[i] or 0.0), ha="center", va="bottom", fontsize=7)
        ax.axhline(WEAK_DRAFT, color="#d62728", linestyle="--")
        ax.set_xticks(range(len(keep)), [labels[i] for i in keep], rotation=30, fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("output position of the drafting step (tokens generated so far)")
        ax.set_ylabel("acceptance")
        ax.set_title("Acceptance by position in the output (labels: draft tokens)")

    return draw


def _speedup_by_k(snap: Snapshot) -> Callable[[Any], None]:
    estimates = by_batch_size(snap) or [e for e in (estimate(snap),) if e is not None]

    def draw(ax: Any) -> None:
        for est in estimates:
            line = ax.plot(range(len(est.by_k)), est.by_k, "o-", ms=3,
                           label=f"{f'batch {est.batch_size}' if est.batch_size else 'no step times'} "
                                 f"(c {est.c:.2f}, {est.c_basis})")
            ax.plot([est.k], [est.expected_speedup], "s", ms=9, color=line[0].get_color(), mfc="none")
            if est.high:  # the interval at every K: how sure the verdict is
                ax.fill_between(range(len(est.high)), est.low, est.high, color=line[0].get_color(), alpha=0.15,
                                linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(0, acc.K_MAX + 1, 2))
        ax.set_xlabel("K (0 = speculation off); square: the running K (observed); band: the 90% interval")
        ax.set_ylabel("expected speedup")
        ax.set_title("Expected speedup by K")
        ax.legend(fontsize=8)

    return draw


def _by_class(shown: list[TrafficClass]) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        rates = [c.window.acceptance_rate or 0.0 for c in shown]
        ax.barh(range(len(shown)), rates, color=["#d62728" if r < WEAK_DRAFT else "#1f77b4" for r in rates])
        ax.axvline(WEAK_DRAFT, color="#d62728", linestyle="--", label=f"weak draft ({WEAK_DRAFT:.0%})")
        ax.set_yticks(range(len(shown)), [f"{c.name} ({c.window.requests} req)" for c in shown], fontsize=8)
        ax.invert_yaxis()  # worst on top, where the bar is shortest: room for the legend
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("acceptance over the window (accepted / drafted)")
        ax.set_title("Acceptance by traffic class, worst first")
        ax.legend(loc="upper right", fontsize=8)

    return draw


def _class_table(snap: Snapshot) -> str:
    total = sum(c.window.requests for c in snap.classes)
    est = estimate(snap)
    rows = [(c.name, c.kind, c.window.requests, percent(c.window.requests / total if total else None),
             percent(c.window.acceptance_rate),
             "n/a" if c.window.mean_acceptance_length is None else f"{c.window.mean_acceptance_length:.2f}",
             " ".join(f"{100 * r:.0f}%" for r in c.window.per_position) or "n/a",
             percent(c.lifetime.acceptance_rate),
             "n/a" if (x := class_speedup(snap, c, est) if est else None) is None else f"{x:.2f}x")
            for c in sorted(snap.classes, key=lambda c: (c.window.acceptance_rate is None,
                                                         c.window.acceptance_rate or 0.0))]
    folded = (f"<p>{snap.folded_classes} more class names were counted as other.</p>" if snap.folded_classes
              else "")
    return html_table(["class", "kind", "requests", "share", "acceptance", "mean length", "by position",
                        "lifetime acceptance", "expected speedup"], rows) + folded


def _class_section(name: str, snap: Snapshot, figures: dict[str, bytes]) -> str:
    """Acceptance by traffic class: a bar per drafting class against the weak-draft line, then the table."""
    out = ["<h3>Acceptance by traffic class</h3>"]
    if not snap.classes:
        return out[0] + na("n/a: no finished requests with a traffic class yet (classes come from baggage "
                           "traffic_class, SPECSCOPE_CLASS_HEADER, the LoRA adapter, specscope_class= or the "
                           "prompt-length bucket)")
    shown = sorted((c for c in snap.classes if c.window.acceptance_rate is not None),
                   key=lambda c: c.window.acceptance_rate or 0.0)
    if shown:
        png = draw_png(_by_class(shown), height=max(2.4, 1.2 + 0.3 * len(shown)))
        figures[f"{_slug(name)}-classes"] = png
        out.append(img(png, "Acceptance by traffic class"))
    else:
        out.append(na("Acceptance by traffic class: no class drafted in the window"))
    return "".join(out) + _class_table(snap)


def _truth_pair(name: str, pair: dict[str, Any]) -> Callable[[Any], None]:
    cells = {int(k): {int(b): c for b, c in row.items()} for k, row in pair["cells"].items()}
    batches = sorted(next(iter(cells.values())))

    def draw(ax: Any) -> None:
        ks = sorted(cells)
        for b in batches:
            measured = [cells[k][b]["measured"] for k in ks]
            predicted = [cells[k][b]["predicted"] for k in ks]
            line = ax.plot(ks, measured, "o-", label=f"batch {b} measured")
            ax.plot(ks, predicted, "x--", color=line[0].get_color(), label=f"batch {b} predicted")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(ks)
        ax.set_xlabel("K")
        ax.set_ylabel("speedup over no speculation")
        ax.set_title(f"{name}: {pair['target']} + {pair['draft']}")
        ax.legend(fontsize=7, ncol=2)

    return draw


# ----------------------------------------------------------------------------- page
def _engine_section(e: EngineReport, figures: dict[str, bytes]) -> str:
    snap = e.snapshot
    out = [f"<h2>{html.escape(e.name)}</h2>", f"<pre>{html.escape(summary(snap))}</pre>"]
    if snap.lifetime.spec is None:
        return "".join([*out, na("no speculation on this engine")])
    plots: list[tuple[str, str, Callable[[Any], None] | None, str]] = [
        ("acceptance", "Acceptance over time", _acceptance_over_time(e) if e.acceptance else None,
         "acceptance over time needs a recording or a live endpoint polled for a while (--duration)"),
        ("positions", "Acceptance by draft position", _per_position(snap) if snap.lifetime.spec.drafts else None,
         "no drafts yet"),
        ("output", "Acceptance by output position",
         _by_output_position(snap) if snap.acceptance_by_output_position else None,
         "needs vLLM's detailed per-request metrics (--per-request-spec-decode-metrics detailed; specscope.LLM "
         "turns them on)"),
        ("speedup", "Expected speedup by K", _speedup_by_k(snap) if estimate(snap) else None,
         "no estimate yet: needs drafts and a cost ratio c"),
    ]
    for key, title, draw, missing in plots:
        if draw is None:
            out.append(na(f"{title}: {missing}"))
            continue
        png = draw_png(draw)
        figures[f"{_slug(e.name)}-{key}"] = png
        out.append(img(png, title))
    out.append(_class_section(e.name, snap, figures))
    table = k_table(snap)
    if table:
        out.append("<h3>K table</h3>")
        out.append(html_table(["batch", "best K", "expected speedup", "running K", "its speedup", "K=0 in schedule"],
                               [(c.batch_size, c.k, f"{c.speedup:.2f}x", c.running_k, f"{c.running_speedup:.2f}x",
                                 f"{c.k0_speedup:.2f}x") for c in table]))
        config = recommended_config(snap)
        out.append("<p>Turn speculation off: remove speculative_config (a restart). No K pays at any batch size "
                   "measured, and a K=0 range in vLLM's schedule still runs the draft.</p>" if config is None else
                   "<p>vLLM schedule (speculative_config):</p><pre>"
                   + html.escape(json.dumps(config)) + "</pre>")
    else:
        out.append(na("K table: needs a baseline (specscope calibrate; --baseline) and 20 decode steps at a batch "
                      "size"))
    return "".join(out)


def _truth_section(doc: dict[str, Any], figures: dict[str, bytes]) -> str:
    s = doc["summary"]
    out = [f"<p>{html.escape(doc.get('workload', ''))}</p>",
           f"<p>Goal: {html.escape(doc.get('goal', ''))}</p>",
           html_table(["cells", "within 10%", "largest error", "verdicts right (outside 0.95-1.05)"],
                       [(s["cells"], s["cells_within_10pct"], percent(s["max_abs_error"]),
                         f"{s['verdicts_right']} of {s['verdict_cells']}")])]
    for name, pair in doc["pairs"].items():
        png = draw_png(_truth_pair(name, pair), height=3.6)
        figures[f"truth-{_slug(name)}"] = png
        out.append(f"<h2>{html.escape(name)}</h2>{img(png, name)}")
        rows = []
        for k, row in sorted(pair["cells"].items(), key=lambda kv: int(kv[0])):
            for b, c in sorted(row.items(), key=lambda kv: int(kv[0])):
                pred = c["predicted"]
                rows.append((k, b, f"{c['measured']:.2f}x", "n/a" if pred is None else f"{pred:.2f}x",
                             "n/a" if pred is None else f"{100 * (pred / c['measured'] - 1):+.0f}%"))
        out.append(html_table(["K", "batch", "measured", "predicted", "error"], rows))
    recs = s.get("recommended_k") or []
    if recs:
        out.append("<h2>Recommended K against the best K measured</h2>")
        out.append(html_table(["pair", "batch", "recommended", "best measured", "throughput / best"],
                               [(r["pair"], r["batch"], r["recommended"], r["best_measured"],
                                 f"{r['throughput_vs_best']:.3f}") for r in recs]))
    return "".join(out)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")[:40] or "engine"


def render(rep: Report) -> tuple[str, dict[str, bytes]]:
    """The page, and its figures by name (the same PNGs the page holds)."""
    figures: dict[str, bytes] = {}
    body = (_truth_section(rep.truth, figures) if rep.truth is not None
            else "".join(_engine_section(e, figures) for e in rep.engines))
    return html_page(rep.title, f"<h1>{html.escape(rep.title)}</h1><p>source: {html.escape(rep.source)}; made "
                                f"{time.strftime('%Y-%m-%d %H:%M:%S')}</p>{body}"), figures

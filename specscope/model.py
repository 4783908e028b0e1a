"""The telemetry model: immutable snapshot types every consumer reads.

Collectors feed :class:`specscope.hub.Hub`; the hub hands out :class:`Snapshot` objects built from the types
below. Derived values (acceptance rate, α, fragmentation, rates per second) are properties computed here from
counts, through :mod:`specscope.acceptance`, so there is one definition of each. Fields that a source cannot
provide are ``None`` ("unavailable"), never zero: an engine without speculation has ``spec is None``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, cast

from specscope import acceptance as acc

#: Upper bounds of the per-request acceptance-rate histogram (the last bucket is +Inf).
ACCEPTANCE_RATE_BOUNDS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Upper bounds of the per-request mean-acceptance-length histogram (tokens per step).
ACCEPTANCE_LENGTH_BOUNDS: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
#: OpenTelemetry GenAI semantic conventions' advised bucket boundaries, in seconds.
REQUEST_DURATION_BOUNDS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BOUNDS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BOUNDS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """Speculative-decoding counts over some interval (lifetime or a window)."""

    num_spec_tokens: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    draft_tokens_per_pos: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted."""
        return acc.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts (bonus token included)."""
        return acc.mean_acceptance_length(self.accepted, self.drafts)

    @property
    def per_position(self) -> tuple[float, ...]:
        """Unconditional acceptance rate of each draft position."""
        return acc.per_position_rates(self.accepted_per_pos, self.drafts)

    @property
    def conditional_per_position(self) -> tuple[float | None, ...]:
        """Acceptance rate of each position given the earlier ones were accepted."""
        return acc.conditional_rates(self.accepted_per_pos, self.drafts)

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability α (pooled maximum-likelihood estimate)."""
        return acc.alpha(self.accepted_per_pos, self.drafts, self.draft_tokens_per_pos)

    @property
    def alpha_position0(self) -> float | None:
        """α estimated from position 0 alone."""
        return acc.alpha_from_position0(self.accepted_per_pos, self.drafts)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative-free bucket counts: ``counts[i]`` observations ≤ ``bounds[i]``, the last one above all bounds."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class Totals:
    """Engine counts over an interval: the lifetime or the sliding window."""

    seconds: float
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec: SpecCounts | None = None

    def per_second(self, count: int) -> float | None:
        """A count of this interval as a rate."""
        return count / self.seconds if self.seconds > 0 else None

    @property
    def generation_tokens_per_s(self) -> float | None:
        """Output tokens per second."""
        return self.per_second(self.generation_tokens)

    @property
    def drafted_tokens_per_s(self) -> float | None:
        """Draft tokens proposed per second."""
        return self.per_second(self.spec.draft_tokens) if self.spec else None

    @property
    def accepted_tokens_per_s(self) -> float | None:
        """Draft tokens accepted per second."""
        return self.per_second(self.spec.accepted) if self.spec else None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prefix-cache hits / queries, in tokens."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request. Engine timing and speculative numbers may come from different sources."""

    request_id: str
    seq: int
    finished_at: float
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    queued_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    num_spec_tokens: int | None = None
    spec_steps: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_histogram: tuple[int, ...] | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted for this request."""
        if self.accepted_tokens is None or self.draft_tokens is None:
            return None
        return acc.acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens gained per speculative step of this request."""
        if self.accepted_tokens is None or not self.spec_steps:
            return None
        return acc.mean_acceptance_length(self.accepted_tokens, self.spec_steps)


@dataclass(frozen=True, slots=True)
class KVCache:
    """Paged KV-cache state. See docs/kv-cache.md for the definitions."""

    block_size: int | None = None
    num_blocks: int | None = None
    block_usage: float | None = None
    tokens_held: int | None = None

    @property
    def capacity_tokens(self) -> int | None:
        """Token slots in usable blocks (vLLM reserves one null block)."""
        if self.block_size is None or not self.num_blocks:
            return None
        return (self.num_blocks - 1) * self.block_size

    @property
    def blocks_used(self) -> int | None:
        """Blocks in use, from the engine's usage fraction."""
        if self.block_usage is None or not self.num_blocks:
            return None
        return round(self.block_usage * (self.num_blocks - 1))

    @property
    def token_usage(self) -> float | None:
        """Estimated token slots held by live requests / all token slots."""
        cap = self.capacity_tokens
        if self.tokens_held is None or not cap:
            return None
        return min(1.0, self.tokens_held / cap)

    @property
    def fragmentation(self) -> float | None:
        """1 − token slots held / block slots allocated; None while nothing is allocated."""
        tu = self.token_usage
        if tu is None or not self.block_usage:
            return None
        return max(0.0, 1.0 - tu / self.block_usage)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """Memory of one GPU, from NVML."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int

    @property
    def used_fraction(self) -> float:
        """used / total."""
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """GPU memory held by one process on one device; role is ``self`` or ``worker``."""

    pid: int
    device_index: int
    used_bytes: int | None
    role: str


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """torch's CUDA caching allocator in this process, for one device."""

    device_index: int
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """GPU memory as far as it can be read; ``status`` says why when it cannot."""

    status: str
    devices: tuple[GpuDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    allocator: tuple[AllocatorStats, ...] = ()
    allocator_status: str = "not collected"

    @property
    def available(self) -> bool:
        """True when NVML answered."""
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What engine and models the numbers come from."""

    engine: str = "vllm"
    engine_version: str | None = None
    model: str | None = None
    draft_model: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None
    block_size: int | None = None
    num_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class CostRatio:
    """c = draft step time / target step time, where the number comes from, and the models' sizes if known."""

    value: float
    source: str
    target_params: int | None = None
    draft_params: int | None = None

    @property
    def draft_weight_share(self) -> float | None:
        """The draft's share of the two models' weights (of their GPU memory, before the KV cache)."""
        if not self.target_params or self.draft_params is None:
            return None
        return self.draft_params / (self.target_params + self.draft_params)


@dataclass(frozen=True, slots=True)
class StepTime:
    """Mean wall time of the engine's decode-only steps at one batch size."""

    batch_size: int
    steps: int
    mean_s: float


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Decode-step time by batch size: measured live, or a saved baseline of the target without speculation."""

    times: tuple[StepTime, ...] = ()
    source: str = "live"

    def at(self, batch_size: int, min_steps: int = 3) -> float | None:
        """Step time at ``batch_size``: measured, or interpolated between the nearest measured sizes; else None."""
        pts = sorted((t.batch_size, t.mean_s) for t in self.times if t.steps >= min_steps)
        for (b0, t0), (b1, t1) in itertools.pairwise(pts):
            if b0 < batch_size < b1:
                return t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)
        return next((t for b, t in pts if b == batch_size), None)


@dataclass(frozen=True, slots=True)
class TokenizerStatus:
    """Verdict of the start-up tokenizer check (see :mod:`specscope.tokenizer_check`)."""

    verdict: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Health:
    """specscope's own health: failures are counted here, never raised into the engine."""

    errors: tuple[tuple[str, int], ...] = ()
    dropped_records: int = 0
    last_error: str | None = None

    @property
    def error_count(self) -> int:
        """All errors counted so far."""
        return sum(n for _, n in self.errors)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything specscope knows at one instant; cheap to make, safe to share between threads."""

    time: float
    started_at: float
    engine: EngineInfo
    lifetime: Totals
    window: Totals
    window_seconds: float
    running: int | None
    waiting: int | None
    kv: KVCache
    gpu: GpuMemory
    requests: tuple[RequestRecord, ...]
    request_acceptance_rate: Histogram | None
    request_acceptance_length: Histogram | None
    request_duration: Histogram | None = None
    time_to_first_token: Histogram | None = None
    time_per_output_token: Histogram | None = None
    tokenizer: TokenizerStatus | None = None
    cost_ratio: CostRatio | None = None
    #: Decode-step times of this engine; the same target's times without speculation; the last decode batch.
    step_times: StepProfile = field(default_factory=StepProfile)
    baseline: StepProfile | None = None
    decode_batch: int | None = None
    health: Health = field(default_factory=Health)
    #: What the source cannot provide (e.g. ``requests`` from a /metrics page): shown as unavailable, not zero.
    unavailable: tuple[str, ...] = ()
    #: Numbers an engine reports only as gauges, by name (e.g. SGLang's ``acceptance_rate``).
    reported: tuple[tuple[str, float], ...] = ()

    @property
    def uptime_s(self) -> float:
        """Seconds since the hub started."""
        return self.time - self.started_at

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: fields plus the derived values consumers need."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Snapshot:
        """The inverse of :meth:`to_dict` (derived values are recomputed); ValueError on a malformed dict."""
        try:
            return cast(Snapshot, _from_dict(cls, d))
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a specscope snapshot: {exc}") from None


_DERIVED: dict[type, tuple[str, ...]] = {
    SpecCounts: (
        "acceptance_rate",
        "mean_acceptance_length",
        "per_position",
        "conditional_per_position",
        "alpha",
        "alpha_position0",
    ),
    Totals: ("generation_tokens_per_s", "drafted_tokens_per_s", "accepted_tokens_per_s", "prefix_cache_hit_rate"),
    RequestRecord: ("acceptance_rate", "mean_acceptance_length"),
    KVCache: ("capacity_tokens", "blocks_used", "token_usage", "fragmentation"),
    GpuDevice: ("used_fraction",),
    GpuMemory: ("available",),
    CostRatio: ("draft_weight_share",),
    Health: ("error_count",),
    Histogram: ("count",),
    Snapshot: ("uptime_s",),
}


def _from_dict(cls: type, d: Any) -> Any:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _value(hints[k], v) for k, v in d.items() if k in names})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _value(tp: Any, v: Any) -> Any:
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _value(inner[0], v) if len(inner) == 1 else v
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], x) for x in v)
        return tuple(_value(a, x) for a, x in zip(args, v, strict=True))
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise TypeError(f"{getattr(tp, '__name__', tp)} must be an object, got {type(v).__name__}")
        return _from_dict(tp, v)  # type: ignore[arg-type]
    if tp is float and isinstance(v, int | float):
        return float(v)
    if tp in (int, float, str, bool) and not isinstance(v, tp):
        raise TypeError(f"expected {tp.__name__}, got {v!r}")
    return v


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: _to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in _DERIVED.get(type(obj), ()):
            out[name] = _to_dict(getattr(obj, name))
        return out
    if isinstance(obj, tuple | list):
        return [_to_dict(x) for x in obj]
    return obj

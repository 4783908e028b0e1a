"""The telemetry model: immutable snapshot types every consumer reads.

Over 400 lines on purpose: every type of the snapshot in one room, so that the wire format and every reader
see the whole model in one place (each class a plain frozen dataclass).

Collectors feed :class:`specscope.state.hub.Hub`; the hub hands out :class:`Snapshot` objects built from the types
below. Derived values (acceptance rate, α, fragmentation, rates per second) are properties computed here from
counts, through :mod:`specscope.core.acceptance`, so there is one definition of each. Fields that a source cannot
provide are ``None`` ("unavailable"), never zero: an engine without speculation has ``spec is None``.
The types do not know their wire format: :mod:`specscope.core.codec` reads them.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from specscope.core import acceptance as acc
from specscope.core import classes

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

    num_spec_tokens: int = field(metadata={"combine": "keep"})
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    draft_tokens_per_pos: tuple[int, ...] = ()
    #: Drafts that ended at a rejected token, counted step by step; None where the source cannot tell.
    rejections: int | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted."""
        return acc.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def drafted_per_step(self) -> float | None:
        """Draft tokens per verify step: K where the engine drafts the configured K, fewer where it manages K
        itself (adaptive verification) or a request nears its length limit; None without drafts."""
        return self.draft_tokens / self.drafts if self.drafts else None

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
        return acc.alpha(self.accepted_per_pos, self.drafts, self.draft_tokens_per_pos, self.rejections)

    @property
    def alpha_past_drafted(self) -> float | None:
        """α for the positions past the drafted ones: α times how the extension held on the last drafted position
        (:func:`~specscope.core.acceptance.extension_check`)."""
        a = self.alpha
        return None if a is None else a * acc.extension_check(self.accepted_per_pos, self.drafts,
                                                               self.draft_tokens_per_pos)

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
class OperationLatency:
    """The latency histograms of the requests of one GenAI operation (``chat``, ``text_completion``)."""

    operation: str
    duration: Histogram
    time_to_first_token: Histogram
    time_per_output_token: Histogram


@dataclass(frozen=True, slots=True)
class StepTime:
    """The engine's steps at one batch size: pure decode steps, and steps carrying prefill.

    ``batch_size`` is the requests a step ran. ``tokens`` are those generated by the decode steps, so
    ``tokens_per_request_step`` is what a request gained per decode step (1 without speculation). Steps carrying
    prefill (a new request's prompt, often beside requests decoding) took ``prefill_s`` in all, generated
    ``prefill_tokens`` and ended the prefill of ``first_tokens`` requests.
    """

    batch_size: int = field(metadata={"combine": "key"})
    steps: int
    mean_s: float = field(metadata={"combine": "mean", "weight": "steps"})
    tokens: int = 0
    prefill_steps: int = 0
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    first_tokens: int = 0
    #: Tokens a request attended over in the decode steps (its prompt and output so far), averaged over them; 0.0
    #: where not recorded.
    context: float = field(default=0.0, metadata={"combine": "mean", "weight": "steps"})
    #: A baseline's seconds per decode step per token of context a request attends over, measured at two contexts
    #: (:func:`specscope.engine.measure.measure_step_times`); 0.0 where not measured.
    context_slope: float = field(default=0.0, metadata={"combine": "mean", "weight": "steps"})
    #: The relative spread of ``mean_s`` between its readings (standard deviation / mean): a baseline's calibration
    #: rounds, the live steps' seconds (about what their context and prompt tokens explain); 0.0 where unknown.
    spread: float = field(default=0.0, metadata={"combine": "mean", "weight": "steps"})
    #: How many readings ``spread`` is over: how sure ``mean_s`` is (their standard error); 0 where unknown.
    readings: int = field(default=0, metadata={"combine": "keep"})
    #: The target's forward passes timed in the process that runs the model (:mod:`specscope.engine.forward_timer`)
    #: among this batch size's decode steps: how many, their mean seconds and mean tokens each ran (b a plain step,
    #: b·(K+1) a speculative one); 0 where not timed (on CUDA, or without the plugin).
    forwards: int = 0
    forward_s: float = field(default=0.0, metadata={"combine": "mean", "weight": "forwards"})
    forward_tokens: float = field(default=0.0, metadata={"combine": "mean", "weight": "forwards"})

    @property
    def tokens_per_request_step(self) -> float | None:
        """Tokens a request gained per decode step at this batch size; None when not recorded."""
        return self.tokens / (self.steps * self.batch_size) if self.tokens and self.steps else None


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """What an engine's step time depends on, besides the batch: a baseline is valid only for the same setup."""

    model: str | None = None
    architecture: str | None = None
    dtype: str | None = None
    device: str | None = None
    engine_version: str | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    enforce_eager: bool | None = None
    #: vLLM's model runner, "v1" or "v2" (0.33's V2 skips the draft pass on steps where every request is on its
    #: last token, so its speculative steps time differently).
    model_runner: str | None = None

    def differences(self, other: EngineSetup) -> list[str]:
        """What differs from ``other``, in words; fields unknown on either side are not compared.

        The model is compared by its architecture (layers, widths, vocabulary, parameter count), which is what a
        step's time depends on, so one model named by hub id and by directory is the same.
        """
        out = []
        for f in dataclasses.fields(self):
            if f.name == "model":
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine is not None and theirs is not None and mine != theirs:
                out.append(f"{f.name.replace('_', ' ')} {mine} vs {theirs}")
        return out


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Step times by batch size: an interval of a live engine, or a saved baseline of the target without
    speculation (with the setup it was measured on)."""

    times: tuple[StepTime, ...] = ()
    source: str = "live"
    setup: EngineSetup | None = None
    #: The target's forwards of every shape (decode, verify and short prompts) as the sums a least-squares fit of
    #: their time over requests and tokens needs (:func:`specscope.core.counts.forward_moments`); () where none were
    #: timed.
    forward_moments: tuple[float, ...] = ()

    def get(self, batch_size: int, min_steps: int = 3) -> StepTime | None:
        """The measurement at exactly ``batch_size`` when it has ``min_steps`` decode steps."""
        return next((t for t in self.times if t.batch_size == batch_size and t.steps >= min_steps), None)

    def at(self, batch_size: int, min_steps: int = 3, context: float | None = None) -> float | None:
        """Step time at ``batch_size``: measured, or interpolated between the nearest measured sizes; else None.
        With ``context`` (tokens a request attends over), each measured size's time is first moved to that context
        along its ``context_slope`` (where measured)."""
        pts = sorted((t.batch_size, _at_context(t, context)) for t in self.times if t.steps >= min_steps)
        for (b0, t0), (b1, t1) in itertools.pairwise(pts):
            if b0 < batch_size < b1:
                return t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)
        return next((t for b, t in pts if b == batch_size), None)

    def stepped(self) -> StepProfile:
        """Without the batch sizes that have forwards but no steps: forwards whose steps left the interval, or that
        another API-server process got (``Hub.local_snapshot(forwards_alone=True)``)."""
        kept = tuple(t for t in self.times if t.steps or t.prefill_steps)
        return self if len(kept) == len(self.times) else replace(self, times=kept)

    def busiest(self) -> int | None:
        """The batch size the engine spent the most decode time at (its operating batch); None without decode steps.
        A draining batch's last steps, or a request prefilled alone before its batch joined, do not move it."""
        best = max(self.times, key=lambda t: t.steps * t.mean_s, default=None)
        return best.batch_size if best is not None and best.steps else None


def _at_context(t: StepTime, context: float | None) -> float:
    """``t.mean_s`` moved along ``t.context_slope`` from ``t.context`` to ``context`` (never below a quarter of it:
    a step costs more than its attention)."""
    if not context or not t.context or not t.context_slope:
        return t.mean_s
    return max(0.25 * t.mean_s, t.mean_s + t.context_slope * (context - t.context))


@dataclass(frozen=True, slots=True)
class Totals:
    """Engine counts over an interval: the lifetime or the sliding window."""

    seconds: float = field(metadata={"combine": "span"})
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec: SpecCounts | None = None
    #: Step times by batch size over this interval (measured in the engine core).
    step_times: StepProfile = field(default_factory=StepProfile)
    #: Requests whose prefill ended in this interval (their first token was produced).
    prefills: int = 0

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
    #: The order in which records became final (all their parts in, or released after a wait); 0 while pending.
    #: Readers that fetch only what is new ask for records with a larger ``final_seq`` than they have seen.
    final_seq: int = 0
    #: The data-parallel engine that served it (vLLM's ``engine`` label), where known.
    engine: int | None = None
    #: ``chat`` or ``text_completion`` (GenAI's operation name), where the front end said which.
    operation: str | None = None
    #: The W3C trace context the request came with (``traceparent``, ``tracestate``) or was made in; its span
    #: continues it.
    trace_context: tuple[tuple[str, str], ...] | None = None
    #: vLLM's own ``llm_request`` span (a ``traceparent``), when vLLM traces: the request's span links to it.
    vllm_span: str | None = None
    #: The class the request was sent with (baggage ``traffic_class``, the operator's header, the served LoRA
    #: model, or ``specscope_class`` offline; :mod:`specscope.core.classes`); None: only its prompt-length bucket.
    traffic_class: str | None = None

    @property
    def class_name(self) -> str | None:
        """The request's traffic class: its own, else its prompt-length bucket (None where neither is known)."""
        return self.traffic_class or classes.prompt_bucket(self.prompt_tokens)

    @property
    def operation_name(self) -> str:
        """GenAI's ``gen_ai.operation.name``: the recorded one, else told by vLLM's server request ids (chat
        completions are ``chatcmpl-...``), else ``text_completion``."""
        if self.operation:
            return self.operation
        return "chat" if self.request_id.startswith("chatcmpl-") else "text_completion"

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
    #: Why ``tokens_held`` (and so token usage and fragmentation) is not estimated, when it is not.
    not_estimable: str | None = None

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
        """Estimated token slots held by live requests / all token slots. Not clamped: above 1, or above the block
        usage, the estimate over-counts (see docs/kv-cache.md), and that shows."""
        cap = self.capacity_tokens
        if self.tokens_held is None or not cap:
            return None
        return self.tokens_held / cap

    @property
    def fragmentation(self) -> float | None:
        """1 − token slots held / block slots allocated; None while nothing is allocated. Negative where the token
        estimate over-counts (not clamped to 0, which would read as a perfectly packed cache)."""
        tu = self.token_usage
        if tu is None or not self.block_usage:
            return None
        return 1.0 - tu / self.block_usage


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
    """What serves the numbers (``server``: vllm, sglang) and which models; the same for every engine of a
    data-parallel server."""

    server: str = "vllm"
    engine_version: str | None = None
    model: str | None = None
    draft_model: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    #: Dynamic K: vLLM's ``num_speculative_tokens_per_batch_size`` as (first batch, last batch, K) ranges.
    k_schedule: tuple[tuple[int, int, int], ...] = ()
    setup: EngineSetup | None = None
    #: The draft's cost in KV capacity, from the loaded configs and the KV cache's dtype.
    draft_memory: DraftMemory | None = None
    #: Why :attr:`draft_memory` could not be sized or is an upper bound (a KV cache dtype of unknown size, a
    #: quantized draft LM head); None where it is exact or there is no draft.
    draft_memory_note: str | None = None
    #: vLLM's ``rejection_sample_method`` where set (0.33: ``fly`` is lossy, see
    #: :func:`specscope.verdict.vllm_policy.lossy_verification`).
    rejection_sample_method: str | None = None
    #: vLLM's ``data_parallel_size``: above 1, vLLM drops ``num_speculative_tokens_per_batch_size`` and drafts
    #: ``num_speculative_tokens`` at every batch size.
    data_parallel_size: int | None = None
    #: vLLM's ``enable_adaptive_verification``: the engine sizes each request's verification from the draft's
    #: confidence, up to ``num_speculative_tokens``.
    adaptive_verification: bool = False

    def k_at(self, batch_size: int) -> int | None:
        """The K this engine drafts at ``batch_size`` (the schedule's where one is set)."""
        k = self.num_speculative_tokens
        if k is None or not self.k_schedule:
            return k
        chosen = self.k_schedule[0][2]
        for start, _end, sk in self.k_schedule:
            if start <= batch_size:
                chosen = sk
        return min(k, chosen)


@dataclass(frozen=True, slots=True)
class CostRatio:
    """c = draft step time / target step time, where the number comes from, and the models' sizes if known."""

    value: float
    source: str
    target_params: int | None = None
    draft_params: int | None = None
    #: Measured against a plain step priced from the target's forward now (the machine's speed at this moment), so
    #: no floor for a baseline timed while the machine ran slower applies.
    anchored: bool = False

    @property
    def draft_weight_share(self) -> float | None:
        """The draft's share of the two models' weights (of their GPU memory, before the KV cache)."""
        if not self.target_params or self.draft_params is None:
            return None
        return self.draft_params / (self.target_params + self.draft_params)


@dataclass(frozen=True, slots=True)
class DraftMemory:
    """What the draft takes from the memory the target's KV cache would otherwise have: its weights, and its own
    attention layers' share of every KV block (vLLM gives target and draft layers the same blocks)."""

    draft_weight_bytes: int
    target_kv_bytes_per_token: int
    draft_kv_bytes_per_token: int = 0

    def blocks_lost(self, num_blocks: int, block_size: int) -> float:
        """KV blocks the target would have without the draft, minus the blocks it has: the same memory holds
        ``num_blocks × (T + D) / T`` target-only blocks, plus the draft's weights in target-only blocks."""
        t, d = self.target_kv_bytes_per_token, self.draft_kv_bytes_per_token
        if t <= 0 or block_size <= 0:
            return 0.0
        return num_blocks * d / t + self.draft_weight_bytes / (t * block_size)

    def capacity_share(self, num_blocks: int, block_size: int) -> float:
        """The share of the target's would-be KV capacity that the draft takes."""
        lost = self.blocks_lost(num_blocks, block_size)
        return lost / (num_blocks + lost) if num_blocks + lost > 0 else 0.0


#: The tokenizer check's verdicts, from best to worst (:mod:`specscope.core.tokenizer_check`).
TOKENIZER_VERDICTS = ("identical", "compatible", "warning", "mismatch")


@dataclass(frozen=True, slots=True)
class TokenizerStatus:
    """Verdict of the start-up tokenizer check (see :mod:`specscope.core.tokenizer_check`): identical, compatible,
    warning or mismatch, with the reasons, and the vocabulary overlap (a ceiling on acceptance)."""

    verdict: str
    reasons: tuple[str, ...] = ()
    overlap: float | None = None


@dataclass(frozen=True, slots=True)
class CaptureStatus:
    """What the opt-in capture of traffic as training data (:mod:`specscope.engine.capture`) is doing: counts only,
    never
    the captured text or where it is written."""

    #: The classes captured: ``weak`` (those under the weak-draft line, named in ``weak_now``) or their names.
    classes: str
    rows: int = 0
    bytes: int = 0
    #: Rows removed at the size cap (the oldest part files go first), and rows not written: the writer fell behind,
    #: the disk refused them, a row could not be made, or what was held for its request was pushed out at its bound.
    dropped_at_cap: int = 0
    dropped_behind: int = 0
    #: The classes ``weak`` selects now.
    weak_now: tuple[str, ...] = ()
    #: Why capture is off or paused (lossy verification, a full disk), where it is: the kind of failure, never a path.
    stopped: str | None = None


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
class EngineView:
    """One engine of a data-parallel server (vLLM's ``engine`` label): its own counts, gauges and KV cache."""

    index: int
    lifetime: Totals
    window: Totals
    running: int | None = None
    waiting: int | None = None
    kv: KVCache = field(default_factory=KVCache)
    decode_batch: int | None = None
    #: When the engine last reported its gauges (running, waiting, KV usage).
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class ClassCounts:
    """Speculative counts of one traffic class's finished requests (summed from their records)."""

    requests: int = 0
    spec_steps: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    #: Accepted tokens at each draft position (from the requests' acceptance histograms).
    accepted_by_position: tuple[int, ...] = ()

    def __add__(self, other: ClassCounts) -> ClassCounts:
        """Both classes' counts summed (the shorter per-position row padded with zeros)."""
        a, b = self.accepted_by_position, other.accepted_by_position
        n = max(len(a), len(b))
        return ClassCounts(self.requests + other.requests, self.spec_steps + other.spec_steps,
                           self.draft_tokens + other.draft_tokens, self.accepted + other.accepted,
                           tuple(x + y for x, y in zip(a + (0,) * (n - len(a)), b + (0,) * (n - len(b)), strict=True)))

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted; None before anything was drafted."""
        return acc.acceptance_rate(self.accepted, self.draft_tokens) if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a request of this class gains per speculative step (1 + accepted / steps)."""
        return acc.mean_acceptance_length(self.accepted, self.spec_steps) if self.spec_steps else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """Acceptance at each draft position: accepted there / speculative steps."""
        if not self.spec_steps:
            return ()
        return tuple(a / self.spec_steps for a in self.accepted_by_position)

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability α (maximum likelihood): accepted / (accepted + rejections), a step
        that accepted its whole draft having no rejection; None without positions (K = len(positions))."""
        if not self.spec_steps or not self.accepted_by_position:
            return None
        trials = self.accepted + self.spec_steps - self.accepted_by_position[-1]
        return self.accepted / trials if trials else None


@dataclass(frozen=True, slots=True)
class TrafficClass:
    """Acceptance of one traffic class (:mod:`specscope.core.classes`), over the window and the engine's life."""

    name: str
    window: ClassCounts
    lifetime: ClassCounts

    @property
    def kind(self) -> str:
        """``prompt length`` (a built-in bucket), ``model`` (a served LoRA adapter) or ``class`` (sent with it)."""
        if self.name in classes.PROMPT_BUCKETS:
            return "prompt length"
        return "model" if self.name.startswith("model:") else "class"


@dataclass(frozen=True, slots=True)
class Attribution:
    """Speculative counts summed over the finished requests' records, to set against the engines' counters: what
    is left is in flight, or was aborted (vLLM keeps no per-request numbers for an aborted request)."""

    requests: int = 0
    spec_steps: int = 0
    draft_tokens: int = 0
    accepted: int = 0


#: Output-position bins of :class:`PositionAcceptance`: [0, 16), [16, 32), ... [4096, inf).
OUTPUT_POSITION_BOUNDS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True, slots=True)
class PositionAcceptance:
    """Draft tokens proposed and accepted by the output position of the step that drafted them."""

    bounds: tuple[int, ...]
    draft_tokens: tuple[int, ...]
    accepted: tuple[int, ...]

    @property
    def rates(self) -> tuple[float | None, ...]:
        """Acceptance rate of each bin (None where nothing was drafted)."""
        return tuple(acc.acceptance_rate(a, d) for a, d in zip(self.accepted, self.draft_tokens, strict=True))


@dataclass(frozen=True, slots=True, weakref_slot=True)
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
    #: The same target's step times without speculation; why it is not used, if it is not; the operating batch (the
    #: window's busiest decode batch size, else the last decode step's), at which the verdict is given.
    baseline: StepProfile | None = None
    baseline_problem: str | None = None
    decode_batch: int | None = None
    #: Acceptance by where in the output a draft was made (needs vLLM's ``detailed`` per-request metrics).
    acceptance_by_output_position: PositionAcceptance | None = None
    #: Each engine of a data-parallel server; the fields above are their sums (KV usage: block-weighted).
    engines: tuple[EngineView, ...] = ()
    #: Speculative counts of the finished requests' records (None where there are no records).
    attributed: Attribution | None = None
    #: API-server processes whose numbers this snapshot merges (``vllm serve --api-server-count``), and how many
    #: the server runs: fewer merged than run (sharing failed, or not yet heard from) is a part of the server's
    #: numbers, not their totals.
    processes: int = 1
    server_processes: int = 1
    health: Health = field(default_factory=Health)
    #: What the source cannot provide (e.g. ``requests`` from a /metrics page): shown as unavailable, not zero.
    unavailable: tuple[str, ...] = ()
    #: Numbers an engine reports only as gauges, by name (e.g. SGLang's ``acceptance_rate``).
    reported: tuple[tuple[str, float], ...] = ()
    #: The three latency histograms above, split by GenAI operation (where the requests' records say which).
    latency_by_operation: tuple[OperationLatency, ...] = ()
    #: Acceptance by traffic class, most requests first; class names past the hub's limit are counted as
    #: :data:`specscope.core.classes.OTHER`, and how many distinct names were folded so is ``folded_classes``.
    classes: tuple[TrafficClass, ...] = ()
    folded_classes: int = 0
    #: The opt-in capture of traffic as training data, where it is on (counts only).
    capture: CaptureStatus | None = None

    def known(self, what: str, value: Any) -> Any:
        """``value``, or None where the source cannot provide ``what`` (it is in :attr:`unavailable`)."""
        return None if what in self.unavailable else value

    @property
    def uptime_s(self) -> float:
        """Seconds since the hub started."""
        return self.time - self.started_at

    @property
    def unattributed_draft_tokens(self) -> int | None:
        """Draft tokens the engines counted that no finished request's record holds: in flight, or aborted."""
        spec, att = self.lifetime.spec, self.attributed
        return None if spec is None or att is None else spec.draft_tokens - att.draft_tokens

    def for_engine(self, index: int, requests: bool = True) -> Snapshot:
        """This snapshot as seen by one engine: its counts, gauges, KV cache and (with ``requests``) requests."""
        view = next((e for e in self.engines if e.index == index), None)
        if view is None:
            raise KeyError(f"no engine {index} in this snapshot")
        return replace(self, lifetime=view.lifetime, window=view.window, running=view.running, waiting=view.waiting,
                       kv=view.kv, decode_batch=view.decode_batch, engines=(view,), attributed=None,
                       requests=tuple(r for r in self.requests if r.engine in (index, None)) if requests else ())

"""The metric catalogue: every metric specscope exports, defined once.

Over 400 lines on purpose: every metric in one list, so that a name, its unit and its help are defined once
and read in one place.

Each :class:`Metric` has its OpenTelemetry name, instrument kind, unit (UCUM), description, attribute keys and
a reader that takes its values from a :class:`~specscope.core.model.Snapshot`. The OpenTelemetry instruments, the
Prometheus collector, the alert rules and the dashboard labels are all generated from :data:`METRICS`; the
Prometheus name is derived from the OpenTelemetry one by OpenTelemetry's own translation rules
(:func:`prometheus_name`). Attributes are bounded: server, engine, model, draft, method, position, state,
traffic_class (``SPECSCOPE_MAX_CLASSES`` names, prompt-length buckets included, then ``other``) — never a request
id or any text. ``engine`` means what it means in vLLM's own metrics, the data-parallel engine index:
metrics of an engine's steps (speculative counts, windowed rates, the verdict, KV cache, queue) have one series
per engine; those of the server (the tokenizer check, per-request histograms, GPU, health) have none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from specscope.core import model
from specscope.core.memory import draft_kv_cost
from specscope.core.model import TOKENIZER_VERDICTS, EngineInfo, Histogram, RequestRecord, Snapshot, TrafficClass
from specscope.verdict import estimate, traffic_speedup

Kind = Literal["counter", "gauge", "updowncounter", "histogram"]
Attrs = dict[str, str]
#: One value of a metric: its attributes and its number (or bucket counts, for a histogram).
Sample = tuple[Attrs, float | Histogram]

#: Attributes that identify where the numbers come from; on every specscope metric of the server.
SERVER_ATTRS = ("server", "model", "draft_model", "method")
#: ... and on every metric of one engine's steps: vLLM's data-parallel engine index too.
ENGINE_ATTRS = (*SERVER_ATTRS, "engine")
CLASS_ATTRS = (*SERVER_ATTRS, "traffic_class")



Reader = Callable[[Snapshot, Attrs], Iterator[Sample]]


@dataclass(frozen=True)
class Metric:
    """One exported metric; ``reader`` yields its samples from a snapshot (one engine's, for a per-engine one)."""

    name: str
    kind: Kind
    unit: str
    description: str
    reader: Reader
    attributes: tuple[str, ...] = ENGINE_ATTRS
    #: Histograms only: bucket upper bounds, and the value one finished request contributes.
    buckets: tuple[float, ...] = ()
    per_request: Callable[[RequestRecord], float | None] | None = None

    @property
    def per_engine(self) -> bool:
        """One series per data-parallel engine (the ``engine`` attribute)."""
        return "engine" in self.attributes

    def read(self, snap: Snapshot) -> Iterator[Sample]:
        """The metric's samples: for each engine of ``snap``, or for the server."""
        server = server_attrs(snap)
        if not self.per_engine:
            yield from self.reader(snap, server)
            return
        for index, view in engine_views(snap):
            yield from self.reader(view, {**server, "engine": index})

    @property
    def prometheus_name(self) -> str:
        """The name Prometheus sees (OpenTelemetry's translation: dots to underscores, unit, ``_total``)."""
        return prometheus_name(self.name, self.unit, self.kind)


_UNIT_SUFFIX = {"s": "seconds", "By": "bytes", "1": "ratio"}


def prometheus_name(name: str, unit: str, kind: Kind) -> str:
    """OpenTelemetry → Prometheus metric name: ``a.b`` + unit ``s`` → ``a_b_seconds``; counters end ``_total``.

    Units in braces (``{token}``) are annotations and add nothing; ``1`` adds ``_ratio`` to gauges only.
    """
    out = name.replace(".", "_")
    suffix = _UNIT_SUFFIX.get(unit, "" if unit.startswith("{") else unit)
    if suffix == "ratio" and kind != "gauge":
        suffix = ""
    if suffix and not out.endswith(f"_{suffix}"):
        out = f"{out}_{suffix}"
    if kind == "counter":
        out = f"{out}_total"
    return out


def server_attrs_of(e: EngineInfo) -> Attrs:
    """The bounded attributes naming the server and models (empty string where unknown)."""
    return {"server": e.server, "model": e.model or "", "draft_model": e.draft_model or "", "method": e.method or ""}


def server_attrs(snap: Snapshot) -> Attrs:
    """:func:`server_attrs_of` the snapshot's engine description."""
    return server_attrs_of(snap.engine)


def engine_views(snap: Snapshot) -> Iterator[tuple[str, Snapshot]]:
    """``(engine index, the snapshot as that engine sees it)`` for each engine (none before its first step)."""
    for view in snap.engines:
        yield str(view.index), snap.for_engine(view.index, requests=False)


# ----------------------------------------------------------------------------- readers
def _spec_value(interval: str, field: str) -> Callable[[Snapshot], Any]:
    """Read ``field`` of the lifetime or window speculative counts; None without speculation."""

    def get(snap: Snapshot) -> Any:
        spec = getattr(snap, interval).spec
        return snap.known("spec_counts", getattr(spec, field)) if spec is not None else None

    return get


def _speedup(snap: Snapshot, field: str) -> float | None:
    est = estimate(snap)
    return None if est is None else float(getattr(est, field))


def _interval_end(snap: Snapshot, end: int) -> float | None:
    est = estimate(snap)
    iv = est.interval if est is not None else None
    return None if iv is None else iv[end]


def _traffic(snap: Snapshot, part: int) -> float | None:
    """The traffic speedup (``part`` 0), its interval's bottom (1) or top (2)."""
    t = traffic_speedup(snap)
    if t is None:
        return None
    if part == 0:
        return t.speedup
    return None if t.interval is None else t.interval[part - 1]


def _one(value: Callable[[Snapshot], float | int | None]) -> Reader:
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        v = value(snap)
        if v is not None:
            yield attrs, float(v)

    return read


def _per_position(values: Callable[[Snapshot], tuple[float | int, ...] | None]) -> Reader:
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        for i, v in enumerate(values(snap) or ()):
            yield {**attrs, "position": str(i)}, float(v)

    return read


def _per_class(value: Callable[[TrafficClass], float | int | None]) -> Reader:
    """One sample per traffic class (bounded: the hub folds names past its limit into ``other``)."""
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        for c in snap.classes:
            v = value(c)
            if v is not None:
                yield {**attrs, "traffic_class": c.name}, float(v)

    return read


def _states(values: Callable[[Snapshot], dict[str, float | int | None]]) -> Reader:
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        for state, v in values(snap).items():
            if v is not None:
                yield {**attrs, "state": state}, float(v)

    return read


def _hist(value: Callable[[Snapshot], Histogram | None]) -> Reader:
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        h = value(snap)
        if h is not None:
            yield attrs, h

    return read


def _genai_hist(field: str) -> Reader:
    """A GenAI latency histogram, one per operation where the records said which (else all as completions)."""

    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        if snap.latency_by_operation:
            for op in snap.latency_by_operation:
                yield genai_attrs_of(snap.engine, op.operation), getattr(op, field)
            return
        h = getattr(snap, "request_duration" if field == "duration" else field)
        if h is not None:
            yield genai_attrs_of(snap.engine), h

    return read


def genai_attrs_of(e: EngineInfo, operation: str = "text_completion") -> Attrs:
    """Required attributes of the GenAI server metrics (and of request spans)."""
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": e.server,
        "gen_ai.request.model": e.model or "",
    }


GENAI_ATTRS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")


def _gpu_devices(field: str) -> Reader:
    def read(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
        for d in snap.gpu.devices:
            yield {"hw.id": str(d.index), "hw.name": d.name, "hw.type": "gpu"}, float(getattr(d, field))

    return read


def _gpu_processes(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
    totals: dict[tuple[int, str], float] = {}
    for p in snap.gpu.processes:
        if p.used_bytes is not None:
            key = (p.device_index, p.role)
            totals[key] = totals.get(key, 0.0) + p.used_bytes
    for (device, role), used in sorted(totals.items()):
        yield {**attrs, "hw.id": str(device), "process.role": role}, used


def _allocator(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
    for a in snap.gpu.allocator:
        for state, v in (("allocated", a.allocated_bytes), ("reserved", a.reserved_bytes),
                         ("inactive_split", a.inactive_split_bytes)):
            yield {**attrs, "hw.id": str(a.device_index), "state": state}, float(v)


def _errors(snap: Snapshot, attrs: Attrs) -> Iterator[Sample]:
    for where, n in snap.health.errors:
        # Listener names carry a qualified function name; the label keeps only the kind of source.
        yield {"source": "listener" if where.startswith("listener") else where}, float(n)


METRICS: tuple[Metric, ...] = (
    # --- speculative decoding (specscope namespace: OpenTelemetry has no conventions for it)
    Metric("specscope.spec_decode.drafts", "counter", "{draft}",
           "Speculative steps verified by the target model.",
           _one(_spec_value("lifetime", "drafts"))),
    Metric("specscope.spec_decode.draft_tokens", "counter", "{token}",
           "Tokens proposed by the draft.",
           _one(_spec_value("lifetime", "draft_tokens"))),
    Metric("specscope.spec_decode.accepted_tokens", "counter", "{token}",
           "Draft tokens accepted by the target model.",
           _one(_spec_value("lifetime", "accepted"))),
    Metric("specscope.spec_decode.accepted_tokens_per_position", "counter", "{token}",
           "Drafts whose first position+1 tokens were all accepted.",
           _per_position(_spec_value("lifetime", "accepted_per_pos")),
           (*ENGINE_ATTRS, "position")),
    Metric("specscope.spec_decode.acceptance_rate", "gauge", "1",
           "Accepted / drafted tokens over the sliding window.",
           _one(_spec_value("window", "acceptance_rate"))),
    Metric("specscope.spec_decode.alpha", "gauge", "1",
           "Per-token acceptance probability alpha over the sliding window (maximum likelihood).",
           _one(_spec_value("window", "alpha"))),
    Metric("specscope.spec_decode.mean_acceptance_length", "gauge", "{token}",
           "Tokens gained per verify step over the sliding window, bonus token included.",
           _one(_spec_value("window", "mean_acceptance_length"))),
    Metric("specscope.spec_decode.position_acceptance_rate", "gauge", "1",
           "Acceptance rate of each draft position over the sliding window.",
           _per_position(_spec_value("window", "per_position")),
           (*ENGINE_ATTRS, "position")),
    Metric("specscope.request.acceptance_rate", "histogram", "1",
           "Acceptance rate of each finished request.",
           _hist(lambda s: s.request_acceptance_rate), SERVER_ATTRS,
           buckets=model.ACCEPTANCE_RATE_BOUNDS, per_request=lambda r: r.acceptance_rate),
    Metric("specscope.request.acceptance_length", "histogram", "{token}",
           "Mean acceptance length of each finished request.",
           _hist(lambda s: s.request_acceptance_length), SERVER_ATTRS,
           buckets=model.ACCEPTANCE_LENGTH_BOUNDS, per_request=lambda r: r.mean_acceptance_length),
    Metric("specscope.tokenizer.verdict", "gauge", "{state}",
           "The start-up tokenizer check's verdict as a state set: 1 on the verdict (identical, compatible, "
           "warning: tokens or special tokens only one side has; mismatch: shared tokens under other ids), 0 on "
           "the others.",
           _states(lambda s: {v: float(s.tokenizer.verdict == v) for v in TOKENIZER_VERDICTS}
                   if s.tokenizer else {}),
           (*SERVER_ATTRS, "state")),
    Metric("specscope.tokenizer.overlap", "gauge", "1",
           "Share of the target's vocabulary the draft holds under the same ids: a ceiling on acceptance.",
           _one(lambda s: s.tokenizer.overlap if s.tokenizer else None), SERVER_ATTRS),
    Metric("specscope.spec_decode.expected_speedup", "gauge", "1",
           "Expected speedup over no speculation (Leviathan et al.) from the window's alpha, K and cost ratio c.",
           _one(lambda s: _speedup(s, "expected_speedup"))),
    Metric("specscope.spec_decode.expected_speedup_low", "gauge", "1",
           "Bottom of the expected speedup's 90% interval (requests' acceptance resampled, the step times' spread "
           "where c is measured); absent where too few requests carry speculative numbers and c is not measured.",
           _one(lambda s: _interval_end(s, 0))),
    Metric("specscope.spec_decode.expected_speedup_high", "gauge", "1",
           "Top of the expected speedup's 90% interval; under 1, speculation loses with confidence; absent where "
           "too few requests carry speculative numbers and c is not measured.",
           _one(lambda s: _interval_end(s, 1))),
    Metric("specscope.spec_decode.traffic_speedup", "gauge", "1",
           "Speedup of the window's traffic as the engine ran it: each batch size's expected speedup weighted by the "
           "step time spent there; absent without a baseline.",
           _one(lambda s: _traffic(s, 0))),
    Metric("specscope.spec_decode.traffic_speedup_low", "gauge", "1",
           "Bottom of the traffic speedup's interval (the batch sizes' 90% intervals weighted alike).",
           _one(lambda s: _traffic(s, 1))),
    Metric("specscope.spec_decode.traffic_speedup_high", "gauge", "1",
           "Top of the traffic speedup's interval; under 1, this traffic runs slower with speculation.",
           _one(lambda s: _traffic(s, 2))),
    Metric("specscope.spec_decode.recommended_k", "gauge", "{token}",
           "The number of speculative tokens to run: the one that maximises the expected speedup, or the running "
           "one where that is within the noise; 0: remove speculative_config (a K = 0 range in vLLM's schedule "
           "still runs the draft).",
           _one(lambda s: _speedup(s, "advised_k"))),
    # --- traffic classes (specscope.core.classes): the server's finished requests by class
    Metric("specscope.class.requests", "counter", "{request}",
           "Finished requests of each traffic class (baggage traffic_class, the operator's header, the LoRA "
           "adapter, or the prompt-length bucket).",
           _per_class(lambda c: c.lifetime.requests), CLASS_ATTRS),
    Metric("specscope.class.draft_tokens", "counter", "{token}",
           "Draft tokens proposed for each traffic class's finished requests.",
           _per_class(lambda c: c.lifetime.draft_tokens), CLASS_ATTRS),
    Metric("specscope.class.accepted_tokens", "counter", "{token}",
           "Draft tokens accepted for each traffic class's finished requests.",
           _per_class(lambda c: c.lifetime.accepted), CLASS_ATTRS),
    Metric("specscope.class.acceptance_rate", "gauge", "1",
           "Accepted / drafted of each traffic class's requests finished in the window (absent before it drafts).",
           _per_class(lambda c: c.window.acceptance_rate), CLASS_ATTRS),
    # --- KV cache
    Metric("specscope.kv_cache.block_usage", "gauge", "1",
           "KV-cache blocks in use / usable blocks (vLLM's kv_cache_usage).",
           _one(lambda s: s.kv.block_usage)),
    Metric("specscope.kv_cache.token_usage", "gauge", "1",
           "Estimated token slots holding live requests' KV / all token slots.",
           _one(lambda s: s.kv.token_usage)),
    Metric("specscope.kv_cache.fragmentation", "gauge", "1",
           "1 - token slots held / block slots allocated.",
           _one(lambda s: s.kv.fragmentation)),
    Metric("specscope.kv_cache.blocks", "updowncounter", "{block}",
           "KV-cache blocks, used and total.",
           _states(lambda s: {"used": s.kv.blocks_used, "total": s.kv.num_blocks}),
           (*ENGINE_ATTRS, "state")),
    Metric("specscope.kv_cache.draft_blocks", "gauge", "{block}",
           "KV-cache blocks the target would have without the draft: its weights and its own KV layers.",
           _one(lambda s: cost.blocks if (cost := draft_kv_cost(s)) else None)),
    Metric("specscope.kv_cache.draft_share", "gauge", "1",
           "Share of the target's would-be KV capacity that the draft's weights and KV layers take.",
           _one(lambda s: cost.share if (cost := draft_kv_cost(s)) else None)),
    Metric("specscope.engine.preemptions", "counter", "{preemption}",
           "Requests preempted (KV blocks taken back, to be recomputed).",
           _one(lambda s: s.known("preemptions", s.lifetime.preemptions))),
    Metric("specscope.prefix_cache.hit_rate", "gauge", "1",
           "Prefix-cache hits / queries (tokens) over the sliding window.",
           _one(lambda s: s.known("prefix_cache", s.window.prefix_cache_hit_rate))),
    Metric("specscope.engine.requests", "updowncounter", "{request}",
           "Requests running and waiting in the engine.",
           _states(lambda s: {"running": s.running, "waiting": s.waiting}),
           (*ENGINE_ATTRS, "state")),
    # --- GPU (OpenTelemetry hardware semantic conventions where they exist)
    Metric("hw.gpu.memory.usage", "updowncounter", "By", "GPU memory used.",
           _gpu_devices("used_bytes"), ("hw.id", "hw.name", "hw.type")),
    Metric("hw.gpu.memory.limit", "updowncounter", "By", "Size of the GPU memory.",
           _gpu_devices("total_bytes"), ("hw.id", "hw.name", "hw.type")),
    Metric("specscope.gpu.process.memory.usage", "updowncounter", "By",
           "GPU memory held by this process and the engine's worker processes.",
           _gpu_processes, (*SERVER_ATTRS, "hw.id", "process.role")),
    Metric("specscope.gpu.allocator.memory", "updowncounter", "By",
           "torch CUDA caching allocator in this process: allocated, reserved, inactive split.",
           _allocator, (*SERVER_ATTRS, "hw.id", "state")),
    Metric("specscope.gpu.draft_weight_share", "gauge", "1",
           "The draft's share of the two models' weights (estimated from parameter counts).",
           _one(lambda s: s.cost_ratio.draft_weight_share if s.cost_ratio else None), SERVER_ATTRS),
    # --- requests (OpenTelemetry GenAI semantic conventions)
    Metric("gen_ai.server.request.duration", "histogram", "s",
           "Generative AI server request duration such as time-to-last byte or last output token.",
           _genai_hist("duration"), GENAI_ATTRS,
           buckets=model.REQUEST_DURATION_BOUNDS, per_request=lambda r: r.e2e_s),
    Metric("gen_ai.server.time_to_first_token", "histogram", "s",
           "Time to generate first token for successful responses.",
           _genai_hist("time_to_first_token"), GENAI_ATTRS,
           buckets=model.TTFT_BOUNDS, per_request=lambda r: r.ttft_s),
    Metric("gen_ai.server.time_per_output_token", "histogram", "s",
           "Time per output token generated after the first token for successful responses.",
           _genai_hist("time_per_output_token"), GENAI_ATTRS,
           buckets=model.TPOT_BOUNDS, per_request=lambda r: r.tpot_s or None),
    Metric("specscope.tokens", "counter", "{token}", "Prompt (input) and generated (output) tokens.",
           _states(lambda s: {"input": s.known("prompt_tokens", s.lifetime.prompt_tokens),
                              "output": s.known("generation_tokens", s.lifetime.generation_tokens)}),
           (*ENGINE_ATTRS, "state")),
    Metric("specscope.requests", "counter", "{request}", "Finished requests.",
           _one(lambda s: s.known("request_count", s.lifetime.requests))),
    # --- specscope's own health
    Metric("specscope.errors", "counter", "{error}", "Failures of specscope's own code (never raised).",
           _errors, ("source",)),
    Metric("specscope.dropped_records", "counter", "{record}",
           "Finished-request records dropped because consumers fell behind.",
           lambda s, attrs: iter([({}, float(s.health.dropped_records))]), ()),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
BY_PROMETHEUS_NAME: dict[str, Metric] = {m.prometheus_name: m for m in METRICS}


def exported_name(name: str) -> str:
    """The Prometheus name of the catalogue metric ``name`` (what rules, dashboards and readers query)."""
    return BY_NAME[name].prometheus_name


def markdown_table() -> str:
    """The catalogue as the Markdown table in docs/metrics.md (a test keeps the two equal)."""
    rows = ["| OpenTelemetry name | Prometheus name | kind | unit | attributes | description |",
            "|---|---|---|---|---|---|"]
    for m in METRICS:
        attrs = ", ".join(f"`{a}`" for a in m.attributes) or "-"
        rows.append(f"| `{m.name}` | `{m.prometheus_name}` | {m.kind} | `{m.unit}` | {attrs} | {m.description} |")
    return "\n".join(rows) + "\n"

"""vLLM's stats read into specscope's model: engine steps, finished requests, per-request speculative metrics.

Just over 400 lines: every read of vLLM's unstable stats objects, in one room on purpose.

With :mod:`specscope.engine.vllm_config` (vLLM's configuration), the only place that reads vLLM's objects. vLLM
documents ``SchedulerStats``, ``IterationStats`` and the per-request metrics as unstable interfaces. Every attribute
specscope reads from them is read here, with ``getattr`` defaults, and turned into specscope's own types. Nothing
here imports vLLM, so the module is cheap to import and tolerant of renamed fields: a field that disappears reads
as absent, never as an exception in the engine's path.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

from specscope.core.acceptance import rejections_per_step
from specscope.core.counts import StepBatch
from specscope.engine.vllm_hook import ATTRIBUTE as HOOK_ATTRIBUTE

#: The vLLM releases whose stats objects specscope was checked against (0.30 to 0.33 share the spec-decode
#: metrics and their fields; 0.32 is tested here). Outside it, one warning at start; fields that went missing
#: cost only themselves (see :func:`read_steps`).
SUPPORTED_VLLM = ">=0.30,<0.34"

_MISSING = object()


def _get(obj: Any, name: str, default: Any, missing: list[str] | None) -> Any:
    """``obj.name``, or ``default`` with ``Type.name`` added to ``missing`` when vLLM no longer has it."""
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        if missing is not None:
            missing.append(f"{type(obj).__name__}.{name}")
        return default
    return value


class _Fields:
    """Several fields of one vLLM stats object, read in one C call; when one is gone (vLLM renamed it), each is read
    on its own with its default, and the gone ones are named: drift costs that number, not the step."""

    __slots__ = ("_absent", "_defaults", "_getter", "_names")

    def __init__(self, absent: tuple[Any, ...] | None = None, **defaults: Any) -> None:
        self._names = tuple(defaults)
        self._defaults = tuple(defaults.values())
        #: What an object that is None reads as (default: the defaults).
        self._absent = self._defaults if absent is None else absent
        self._getter = attrgetter(*self._names)

    def read(self, obj: Any, missing: list[str] | None) -> Any:
        try:
            return self._getter(obj)
        except AttributeError:
            return tuple(_get(obj, n, d, missing) for n, d in zip(self._names, self._defaults, strict=True))

    def columns(self, objs: Sequence[Any], missing: list[str] | None) -> list[Sequence[Any]]:
        """The fields of several objects, one sequence per field; an object that is None reads as ``absent``."""
        try:
            rows = list(map(self._getter, objs))
        except AttributeError:
            rows = [self._absent if o is None else self.read(o, missing) for o in objs]
        return list(zip(*rows, strict=True)) if rows else [()] * len(self._names)


_SCHEDULER = _Fields(num_running_reqs=None, num_waiting_reqs=None, kv_cache_usage=None, prefix_cache_stats=None,
                     spec_decoding_stats=None)
_PREFIX_CACHE = _Fields(queries=0, hits=0)
#: A step's speculative counts are read whole or not at all: acceptance is accepted / drafted, so a step missing one
#: of its counts (vLLM renamed it) counts no drafts (:func:`_whole_spec`), rather than drafts with nothing accepted.
_NO_SPEC = (None, 0, 0, 0, (), ())
_SPEC = _Fields(absent=_NO_SPEC, num_spec_tokens=None, num_drafts=None, num_draft_tokens=None, num_accepted_tokens=None,
                num_accepted_tokens_per_pos=None, num_draft_tokens_per_pos=())
_ITERATION = _Fields(num_prompt_tokens=0, num_generation_tokens=0, num_preempted_reqs=0, finished_requests=(),
                     inter_token_latencies_iter=None, time_to_first_tokens_iter=None)
_FINISHED_TOKENS = _Fields(num_prompt_tokens=0, num_generation_tokens=0)


#: The snapshot's numbers (names in ``Snapshot.unavailable``) that a field vLLM renamed takes away.
_UNAVAILABLE = {
    **dict.fromkeys(("SpecDecodingStats.num_drafts", "SpecDecodingStats.num_draft_tokens",
                     "SpecDecodingStats.num_accepted_tokens", "SpecDecodingStats.num_accepted_tokens_per_pos"),
                    "spec_counts"),
    "IterationStats.num_prompt_tokens": "prompt_tokens",
    "IterationStats.num_generation_tokens": "generation_tokens",
    "IterationStats.num_preempted_reqs": "preemptions",
    "PrefixCacheStats.queries": "prefix_cache",
    "PrefixCacheStats.hits": "prefix_cache",
}


def unavailable(missing: Sequence[str]) -> set[str]:
    """The snapshot's numbers that the missing fields (``Type.field``) leave unknown; a gauge read as None needs
    no name."""
    return {_UNAVAILABLE[m] for m in missing if m in _UNAVAILABLE}


def version_warning(version: str | None) -> str | None:
    """Why this vLLM is not one specscope was checked against; None when it is (or cannot be told)."""
    if not version:
        return None
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        base = Version(Version(version).base_version)
    except InvalidVersion:
        return None
    if base in SpecifierSet(SUPPORTED_VLLM):
        return None
    return (f"vLLM {version} is outside the releases specscope was checked against ({SUPPORTED_VLLM}); "
            "numbers whose fields vLLM renamed will be missing (counted in the snapshot's health)")


def read_steps(times: Sequence[float], scheduler_stats: Sequence[Any], iteration_stats: Sequence[Any],
               missing: list[str] | None = None, split: SplitSteps | None = None) -> StepBatch:
    """Consecutive engine steps' numbers, as vLLM's own Prometheus logger counts them, plus their timing, column by
    column (each step's stats objects, or None, at the same index as its time).

    A step is *pure decode* when no request finished its prefill in it and every request it ran produced tokens
    after a previous step's (equal inter-token intervals, all measured in the engine core): then that interval is
    the step's duration. A request in a chunked prefill produces nothing, so such steps are never pure decode.
    Every field has a default: one that vLLM renamed is named in ``missing`` and costs only itself.

    ``split``: this process is one of several API-server processes, and holds only its own requests' numbers of
    each step (vLLM hands the step's scheduler stats to one of them). The requests it cannot see may be another
    process's or in prefill; the engine-wide counts tell them apart (:class:`SplitSteps`, which carries what it
    learnt to the engine's next steps).
    """
    running, waiting, kv_usage, pcs, sds = _SCHEDULER.columns(scheduler_stats, missing)
    if scheduler_stats and getattr(scheduler_stats[0], "num_skipped_waiting_reqs", None) is not None:
        # Newer releases: vLLM's Prometheus logger counts the skipped ones as waiting.
        waiting = [w if w is None else w + getattr(s, "num_skipped_waiting_reqs", 0)
                   for w, s in zip(waiting, scheduler_stats, strict=True)]
    pc_queries, pc_hits = _PREFIX_CACHE.columns(pcs, missing)
    k, drafts, draft_tokens, accepted, per_pos, dt_per_pos = _whole_spec(*_SPEC.columns(sds, missing))
    rejected = rejections_per_step(drafts, per_pos, dt_per_pos)
    prompt, generated, preempted, finished, itl, ttft = _ITERATION.columns(iteration_stats, missing)
    n_finished = list(map(len, finished))
    finished_tokens = [sum(sum(_FINISHED_TOKENS.read(r, missing)) for r in f) if f else 0 for f in finished]
    # Each step's batch, whether it carried prefill, and a pure decode step's duration.
    timing = [_timing(*step) for step in zip(running, n_finished, itl, ttft, strict=True)]
    if split is not None:
        timing = split.read(timing, running, n_finished, itl, k, drafts, pc_queries, pc_hits)
    batch, decode_s, prefill, first_tokens, first_token_s, seen = (zip(*timing, strict=True) if timing
                                                                   else [()] * 6)
    return StepBatch(
        times=times, running=running, waiting=waiting, kv_usage=kv_usage, preemptions=preempted,
        prefix_cache_queries=pc_queries, prefix_cache_hits=pc_hits, prompt_tokens=prompt, generation_tokens=generated,
        finished=n_finished, finished_tokens=finished_tokens, num_spec_tokens=k, drafts=drafts,
        draft_tokens=draft_tokens, accepted=accepted, accepted_per_pos=per_pos, draft_tokens_per_pos=dt_per_pos,
        rejections=rejected, batch=batch, decode_s=decode_s, prefill=prefill, first_tokens=first_tokens,
        first_token_s=first_token_s, seen=seen)


def _whole_spec(*columns: Sequence[Any]) -> list[Sequence[Any]]:
    """The speculative columns, with every step that lacks one of its counts (vLLM renamed it) counting no drafts."""
    _, drafts, draft_tokens, accepted, per_pos, _ = columns
    if None not in drafts and None not in draft_tokens and None not in accepted and None not in per_pos:
        return list(columns)
    whole = [None not in row for row in zip(drafts, draft_tokens, accepted, per_pos, strict=True)]
    return [[v if ok else default for v, ok in zip(column, whole, strict=True)]
            for column, default in zip(columns, _NO_SPEC, strict=True)]


_Timing = tuple[int | None, float | None, bool, int, float | None, int | None]
_UNTIMED: _Timing = (None, None, False, 0, None, None)


def _timing(running: int | None, finished: int, itl: Sequence[float] | None,
            ttft: Sequence[float] | None) -> _Timing:
    """``(batch, decode_s, prefill, first_tokens, first_token_s, seen)`` of one step (see :func:`read_steps`);
    ``seen`` is None: the process saw all of the step's requests."""
    if running is None or itl is None or ttft is None:
        return _UNTIMED
    batch = running + finished
    if ttft:
        return batch, None, True, len(ttft), min(ttft), None
    if len(itl) < batch:
        return batch, None, True, 0, None, None
    return batch, _interval(itl), False, 0, None, None


def _interval(itl: Sequence[float]) -> float | None:
    """The step's duration, when its requests' inter-token intervals are one (each decoded after the last step)."""
    if itl:
        lo, hi = min(itl), max(itl)
        if hi - lo <= 1e-6 * (hi if hi > 1.0 else 1.0):
            return lo
    return None


class SplitSteps:
    """Reads one engine's steps in a process that holds only its own requests' part of each (one of several
    API-server processes, ``read_steps(split=...)``), step after step.

    A step ran the requests running after it, those it finished (this process sees only its own finishes) and the
    other processes' that finished in it. Those that verified drafts (counted engine-wide) decoded. When they are at
    least the requests this process can account for, no request was admitted (no prefix-cache lookup) nor ended its
    prefill here, and no admitted prompt can still be running a later chunk, every request of the step decoded: a
    pure decode step of ``drafts`` requests, timed by the interval of the ``seen`` ones this process holds.

    A later chunk is invisible otherwise: its request is running, verified nothing and produced nothing, just as a
    request another process finished here. So the prompt tokens a step's admissions left uncached (the most of
    any step: a request still waiting is looked up again) are carried from step to step, less what each step
    could prefill beside its decode tokens (the scheduler's token budget, or its long-prefill threshold where
    smaller); while some are left, no step is taken for pure decode. vLLM gives a step's stats to the owner of its
    oldest running request, so the process that saw an admission mostly gets the next steps' too; steps whose stats
    another process got prefill nothing here (the estimate errs long)."""

    def __init__(self, token_budget: int, chunk_limit: int = 0) -> None:
        #: The most prompt tokens a step prefills with no decode beside it (a budget not known: no prompt is
        #: carried to the next step).
        self.chunk = (min(token_budget, chunk_limit) if chunk_limit > 0 else token_budget) if token_budget > 0 \
            else sys.maxsize
        #: Prompt tokens admitted and possibly not yet prefilled.
        self.prefill_left = 0

    def read(self, timing: list[_Timing], running: Sequence[int | None], finished: Sequence[int],
             itl: Sequence[Sequence[float] | None], k: Sequence[int | None], drafts: Sequence[int],
             queries: Sequence[int], hits: Sequence[int]) -> list[_Timing]:
        """The steps' timing as :func:`read_steps` read it whole, with the split steps read from the engine-wide
        counts."""
        left, out = self.prefill_left, []
        for t, run, fin, intervals, n_spec, drafted, q, h in zip(timing, running, finished, itl, k, drafts, queries,
                                                                  hits, strict=True):
            chunked, left = left > 0, max(left, q - h)
            if run is None:  # another process got this step's stats
                out.append(t)
                continue
            left = max(0, left - max(1, self.chunk - drafted * (1 + (n_spec or 0))))
            first_tokens = t[3]  # requests of this process whose prefill ended here
            if first_tokens or not intervals or q or chunked or drafted < run + fin or drafted <= len(intervals):
                out.append(t)
            else:
                out.append((drafted, _interval(intervals), False, 0, None, len(intervals)))
        self.prefill_left = left
        return out


class Finished(NamedTuple):
    """One request that finished in a step: its record fields, and its per-step draft counts when detailed."""

    request_id: str
    fields: dict[str, Any]
    per_step: tuple[Sequence[int], Sequence[int]] | None = None
    #: Whether the speculative numbers came with it (through the output-processor hook).
    complete: bool = False
    #: Its prompt and completion, where a capture runs (:mod:`specscope.engine.capture`).
    payload: Any = None


def finished_requests(iteration_stats: Any) -> list[Finished]:
    """Each request that finished in this step.

    With the output-processor hook (:mod:`specscope.engine.vllm_hook`) a record is complete: speculative
    numbers, the front end's time to first token, and, for one of ``n > 1`` samples, an id of its own
    (``<request id>#<index>``). Without it ``ttft_s`` is the engine-side time to first token (queued + prefill)
    and the speculative numbers come from another source.
    """
    if iteration_stats is None:
        return []
    out = []
    for f in getattr(iteration_stats, "finished_requests", ()):
        rid, reason, *values = _FINISHED.read(f, None)
        if rid is None:
            continue
        fields = dict(zip(_RECORD_FIELDS, values, strict=True))
        fields["finish_reason"] = _reason(reason)
        queued, prefill = fields["queued_s"], fields["prefill_s"]
        fields["ttft_s"] = None if queued is None or prefill is None else queued + prefill
        extra = getattr(f, HOOK_ATTRIBUTE, None)
        if extra is None:
            out.append(Finished(str(rid), fields))
            continue
        if extra.ttft_s:
            fields["ttft_s"] = extra.ttft_s
        if extra.carrier:
            fields["trace_context"] = tuple(sorted(extra.carrier.items()))
        if extra.vllm_span:
            fields["vllm_span"] = extra.vllm_span
        if extra.traffic_class:
            fields["traffic_class"] = extra.traffic_class
        per_step = None
        if extra.spec_metrics is not None:
            spec, per_step = _spec(extra.spec_metrics)
            fields.update(spec)
        out.append(Finished(str(rid) if extra.child is None else f"{rid}#{extra.child}", fields, per_step, True,
                            extra.payload))
    return out


_REASONS: dict[Any, str] = {}


def _reason(reason: Any) -> str | None:
    """vLLM's finish reason as a lower-case name (``length``, ``stop``, ``abort``); the few are remembered."""
    if reason is None:
        return None
    name = _REASONS.get(reason)
    if name is None:
        name = str(reason).lower()
        if len(_REASONS) < 64:
            _REASONS[reason] = name
    return name


#: RequestRecord fields read from vLLM's ``FinishedRequestStats``, by the stats' field names.
_RECORD_FIELDS = ("prompt_tokens", "generation_tokens", "cached_tokens", "preemptions", "e2e_s", "tpot_s",
                  "queued_s", "prefill_s", "decode_s")
_FINISHED = _Fields(request_id=None, finish_reason=None, num_prompt_tokens=None, num_generation_tokens=None,
                    num_cached_tokens=None, num_preemptions=None, e2e_latency=None, mean_time_per_output_token=None,
                    queued_time=None, prefill_time=None, decode_time=None)
#: vLLM's per-request speculative metrics object, read directly (its ``to_dict`` payload where a field is gone).
_REQUEST_SPEC = _Fields(num_spec_tokens=None, histogram=None, num_draft_tokens=None, per_step_accepted=None,
                        per_step_drafted=None)
#: Every field this module reads of vLLM's stats objects, by class: those of the readers above (fields read only
#: where a newer vLLM has them, ``SchedulerStats.num_skipped_waiting_reqs``, are not needed). Checked against each
#: supported release's contract (``tests/engine/test_vllm_contract.py``).
NEEDED_FIELDS: dict[str, tuple[str, ...]] = {
    "SchedulerStats": _SCHEDULER._names,
    "PrefixCacheStats": _PREFIX_CACHE._names,
    "SpecDecodingStats": _SPEC._names,
    "IterationStats": _ITERATION._names,
    "FinishedRequestStats": tuple(dict.fromkeys(_FINISHED._names + _FINISHED_TOKENS._names)),
    "RequestSpecDecodeMetrics": _REQUEST_SPEC._names,
}


def _spec(metrics: Any) -> tuple[dict[str, Any], tuple[Sequence[int], Sequence[int]] | None]:
    """RequestRecord fields and ``(per_step_accepted, per_step_drafted)`` (None at vLLM's ``summary`` level) of
    vLLM's per-request speculative metrics object, or of the response's JSON payload of them."""
    if not isinstance(metrics, Mapping):
        k, hist, drafted, per_step_accepted, per_step_drafted = _REQUEST_SPEC.read(metrics, None)
        if None in (k, hist, drafted, per_step_accepted, per_step_drafted):
            metrics = metrics.to_dict()  # vLLM renamed a field: its documented payload
        else:  # vLLM's own counts, as its payload sums them
            fields = {"num_spec_tokens": k, "spec_steps": sum(hist), "draft_tokens": drafted,
                      "accepted_tokens": sum(map(operator.mul, range(len(hist)), hist)),
                      "acceptance_histogram": tuple(hist)}
            return fields, (per_step_accepted, per_step_drafted) if per_step_accepted and per_step_drafted else None
    fields = {
        "num_spec_tokens": int(metrics["num_spec_tokens"]),
        "spec_steps": int(metrics["num_spec_steps"]),
        "draft_tokens": int(metrics["num_draft_tokens"]),
        "accepted_tokens": int(metrics["num_accepted_draft_tokens"]),
        "acceptance_histogram": tuple(map(int, metrics["acceptance_histogram"])),
    }
    accepted, drafted = metrics.get("per_step_accepted"), metrics.get("per_step_drafted")
    return fields, (list(map(int, accepted)), list(map(int, drafted))) if accepted and drafted else None


def spec_fields(metrics: Any) -> dict[str, Any]:
    """RequestRecord fields from per-request speculative metrics: vLLM's object or the response's JSON dict."""
    return {} if metrics is None else _spec(metrics)[0]


def per_step_counts(metrics: Any) -> tuple[Sequence[int], Sequence[int]] | None:
    """``(per_step_accepted, per_step_drafted)`` of vLLM's ``detailed`` per-request metrics; None at ``summary``."""
    return None if metrics is None else _spec(metrics)[1]


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

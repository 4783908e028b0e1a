"""Alert rules, defined once: evaluated in-process on the snapshot, and rendered as Prometheus alerting rules.

Over 400 lines on purpose: every rule in one list, each with its in-process condition and both PromQL forms
side by side, so that the three never drift.

Each :class:`Rule` carries its threshold-dependent in-process value and condition, the PromQL over specscope's
catalogue names, and (where vLLM's own counters suffice) the PromQL over raw ``vllm:*`` metrics for users who
only scrape an unmodified vLLM. Thresholds come from :class:`Thresholds`, which a file or flags can change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from specscope.core.memory import allocator_waste, draft_kv_cost
from specscope.core.model import Snapshot
from specscope.export.alerts.recording import ENGINE, SPECSCOPE, VLLM, Source, class_series, duration
from specscope.export.catalogue import exported_name as _p
from specscope.export.summary import percent
from specscope.verdict import MIN_STEPS, estimate, explain

#: The runbook, relative to specscope's repository (docs/runbook.md has a section per rule).
RUNBOOK = "docs/runbook.md"


class RuleConfigError(ValueError):
    """Bad rule configuration (one line, fit for the user)."""


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules use; change them with a JSON/YAML file or flags."""

    weak_draft_acceptance: float = 0.3
    weak_draft_min_draft_tokens: int = 200
    weak_draft_for_s: float = 60.0
    fragmentation: float = 0.5
    #: Fragmentation matters only when blocks run short: below this block usage it is not a finding.
    fragmentation_min_block_usage: float = 0.7
    fragmentation_for_s: float = 300.0
    #: Mean acceptance length at or below this while drafting is a collapse (≈ nothing accepted).
    collapse_length: float = 1.05
    collapse_for_s: float = 60.0
    #: An engine whose windowed acceptance is this far below its server's engines' mean diverges.
    divergence: float = 0.15
    divergence_for_s: float = 300.0
    kv_usage: float = 0.9
    kv_pressure_for_s: float = 120.0
    #: The draft's share of the would-be KV capacity worth an alert when blocks run short (above ``kv_usage``).
    draft_kv_share: float = 0.1
    #: torch's allocator (in this process) holding this share of its reserved memory unallocated, at least
    #: ``allocator_min_idle_bytes`` of it, on a GPU more than ``kv_usage`` full: fragmentation that costs memory.
    allocator_fragmentation: float = 0.3
    allocator_min_idle_bytes: float = float(1 << 30)
    allocator_for_s: float = 300.0
    keep_firing_for_s: float = 60.0
    window_s: float = 60.0

    def check(self) -> Thresholds:
        """Raise :class:`RuleConfigError` on values that make no sense."""
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
                raise RuleConfigError(f"threshold {f.name} must be a non-negative number, got {v!r}")
        for name in ("weak_draft_acceptance", "fragmentation", "fragmentation_min_block_usage", "kv_usage",
                     "draft_kv_share", "divergence", "allocator_fragmentation"):
            if getattr(self, name) > 1:
                raise RuleConfigError(f"threshold {name} is a fraction between 0 and 1, got {getattr(self, name)}")
        if self.window_s <= 0:
            raise RuleConfigError("threshold window_s must be positive")
        return self

    def updated(self, values: dict[str, Any]) -> Thresholds:
        """A copy with ``values`` applied (unknown names are an error)."""
        known = {f.name: f.type for f in fields(self)}
        for key in values:
            if key not in known:
                raise RuleConfigError(f"unknown threshold {key!r}; known: {', '.join(sorted(known))}")
        return replace(self, **values).check()


def load_thresholds(path: str | Path, base: Thresholds | None = None) -> Thresholds:
    """Thresholds from a JSON or YAML file of ``name: value`` pairs."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise RuleConfigError(f"cannot read {p}: {exc.strerror}") from None
    try:
        if p.suffix in (".yml", ".yaml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise RuleConfigError(f"{p} is not valid {'YAML' if p.suffix in ('.yml', '.yaml') else 'JSON'}: "
                              f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise RuleConfigError(f"{p} must hold a mapping of threshold names to numbers")
    return (base or Thresholds()).updated(data)


@dataclass(frozen=True)
class Rule:
    """One alert: in-process value and condition, PromQL for Prometheus, and the words for people."""

    name: str
    severity: str
    summary: str
    description: str
    value: Callable[[Snapshot], float | None]
    firing: Callable[[Snapshot, Thresholds], bool]
    promql: Callable[[Thresholds], str]
    for_s: Callable[[Thresholds], float]
    advice: str
    threshold: Callable[[Thresholds], float] | None = None
    vllm_promql: Callable[[Thresholds], str] | None = None
    #: Evaluated on each data-parallel engine (its steps, its KV cache); False: once, for the server.
    per_engine: bool = True
    #: Evaluated on each traffic class: the snapshot it sees has that class first in ``classes``.
    per_class: bool = False

    @property
    def runbook_url(self) -> str:
        """Where the runbook explains what to do."""
        return f"{RUNBOOK}#{self.name.lower()}"


def _drafting(s: Snapshot, t: Thresholds) -> bool:
    w = s.window.spec
    return w is not None and w.draft_tokens >= t.weak_draft_min_draft_tokens


def _collapsed(s: Snapshot, t: Thresholds) -> bool:
    w = s.window.spec
    return (_drafting(s, t) and w is not None and w.mean_acceptance_length is not None
            and w.mean_acceptance_length <= t.collapse_length)


def _server_weak(s: Snapshot, t: Thresholds) -> bool:
    """The server's steps in the window drafted enough and accept below the weak-draft threshold: what
    SpecscopeWeakDraft (or, at its worst, SpecscopeAcceptanceCollapse) fires on."""
    w = s.window.spec
    return _drafting(s, t) and w is not None and w.acceptance_rate is not None \
        and w.acceptance_rate < t.weak_draft_acceptance


def _weak_draft(s: Snapshot, t: Thresholds) -> bool:
    return _server_weak(s, t) and not _collapsed(s, t)


def divergent_engine(s: Snapshot, t: Thresholds) -> tuple[int, float, float] | None:
    """``(engine, its acceptance, the engines' mean)`` for the engine furthest below the mean of its server's
    drafting engines, when at least two draft and it is more than ``t.divergence`` below; else None."""
    rates = [(e.index, e.window.spec.acceptance_rate) for e in s.engines
             if e.window.spec is not None and e.window.spec.draft_tokens >= t.weak_draft_min_draft_tokens
             and e.window.spec.acceptance_rate is not None]
    if len(rates) < 2:
        return None
    mean = sum(r for _, r in rates) / len(rates)
    index, low = min(rates, key=lambda x: x[1])
    return (index, low, mean) if low < mean - t.divergence else None


def _divergence(s: Snapshot) -> float | None:
    """The mean acceptance of the server's drafting engines minus the lowest one's (at default thresholds)."""
    found = divergent_engine(s, Thresholds(divergence=0.0))
    return None if found is None else found[2] - found[1]


def _verdict(s: Snapshot, verdict: str) -> float | None:
    """1 when the tokenizer check's verdict is ``verdict``, 0 otherwise; None before the check."""
    return None if s.tokenizer is None else float(s.tokenizer.verdict == verdict)


def _tokenizer_rule(verdict: str, name: str, severity: str, *, summary: str, description: str,
                    advice: str) -> Rule:
    """A rule on one verdict of the start-up tokenizer check: fires at once while it holds, for the server."""
    return Rule(
        name=name, severity=severity, summary=summary, description=description,
        value=lambda s: _verdict(s, verdict),
        firing=lambda s, t: _verdict(s, verdict) == 1.0,
        promql=lambda t: f'{_p("specscope.tokenizer.verdict")}{{state="{verdict}"}} == 1',
        for_s=lambda t: 0.0,
        advice=advice,
        per_engine=False,
    )


def _weak_class(s: Snapshot, t: Thresholds) -> bool:
    """The snapshot's first class drafted enough in the window and accepts below the weak-draft threshold, while
    the server as a whole does not (the aggregate hides it). Judged on the server's steps, as SpecscopeWeakDraft
    judges it, not on the classes' sum (their requests' records, which differ from the steps at the window's
    edges): at an aggregate near the threshold the two could disagree, and neither alert fire."""
    w = s.classes[0].window if s.classes else None
    if (w is None or w.draft_tokens < t.weak_draft_min_draft_tokens or w.acceptance_rate is None
            or w.acceptance_rate >= t.weak_draft_acceptance):
        return False
    return not _server_weak(s, t)


def class_context(s: Snapshot) -> tuple[float | None, float | None]:
    """``(share of the window's requests, acceptance of the other classes)`` for the snapshot's first class."""
    if not s.classes:
        return None, None
    first, rest = s.classes[0].window, [c.window for c in s.classes[1:]]
    total = first.requests + sum(c.requests for c in rest)
    drafted = sum(c.draft_tokens for c in rest)
    return (first.requests / total if total else None,
            sum(c.accepted for c in rest) / drafted if drafted else None)


def _weak_class_promql(t: Thresholds) -> str:
    """A class weak while its server's engines together are not (their steps' counters, as
    SpecscopeWeakDraft reads them, summed over the server's engines)."""
    def server(what: str) -> str:
        return f"sum without(engine) ({_rec(SPECSCOPE, what, t)})"

    drafted = class_series("draft_tokens", t.window_s)
    return (f"{class_series('acceptance_rate', t.window_s)} < {t.weak_draft_acceptance} and "
            f"{drafted} * {t.window_s:g} >= {t.weak_draft_min_draft_tokens} unless ignoring(traffic_class) "
            f"({server('accepted_tokens')} / {server('draft_tokens')} < {t.weak_draft_acceptance} and "
            f"{server('draft_tokens')} * {t.window_s:g} >= {t.weak_draft_min_draft_tokens})")


def _not_paying(s: Snapshot, t: Thresholds) -> bool:
    """Surely slower than plain decoding at the operating batch: judged on the window's drafts, or, where the
    schedule gives that batch size K = 0 (no drafts there: the draft's pass alone), on the window's steps there."""
    est = estimate(s)
    if est is None or not est.surely_loses:
        return False
    if est.k == 0:
        return est.batch_size is not None and s.window.step_times.get(est.batch_size, MIN_STEPS) is not None
    w = s.window.spec
    return w is not None and w.draft_tokens >= t.weak_draft_min_draft_tokens


def _window(t: Thresholds) -> str:
    return duration(t.window_s)


def _rec(source: Source, what: str, t: Thresholds, level: str = ENGINE) -> str:
    """A recorded series (deploy/prometheus' recording rules) over the thresholds' window."""
    return source.series(what, t.window_s, level)


def _drafting_promql(source: Source, t: Thresholds) -> str:
    """The engine drafted at least the minimum number of tokens over the window."""
    return f"{_rec(source, 'draft_tokens', t)} * {t.window_s:g} >= {t.weak_draft_min_draft_tokens}"


def _decoding_promql(t: Thresholds) -> str:
    """The engine generated tokens over the window (with no drafts: a K = 0 range of vLLM's schedule)."""
    return (f'sum without(state) (rate({_p("specscope.tokens")}{{state="output"}}[{_window(t)}])) > 0')


def _weak_promql(source: Source, t: Thresholds) -> str:
    return (f"{_rec(source, 'acceptance_rate', t)} < {t.weak_draft_acceptance} and "
            f"{_rec(source, 'mean_acceptance_length', t)} > {t.collapse_length} and {_drafting_promql(source, t)}")


def _collapse_promql(source: Source, t: Thresholds) -> str:
    return f"{_rec(source, 'mean_acceptance_length', t)} <= {t.collapse_length} and {_drafting_promql(source, t)}"


def _allocator_promql(t: Thresholds) -> str:
    """Idle share of torch's reserved memory per GPU, on GPUs (same exporter, same ``hw_id``) above ``kv_usage``."""
    m = _p("specscope.gpu.allocator.memory")
    idle = f'({m}{{state="reserved"}} - ignoring(state) {m}{{state="allocated"}})'
    used = f'{_p("hw.gpu.memory.usage")} / {_p("hw.gpu.memory.limit")}'
    return (f'{idle} / ignoring(state) {m}{{state="reserved"}} > {t.allocator_fragmentation} and '
            f"{idle} >= {t.allocator_min_idle_bytes:.0f} and on(job, instance, hw_id) ({used} > {t.kv_usage})")


def _diverging_promql(source: Source, t: Thresholds) -> str:
    """A drafting engine whose acceptance is more than the threshold below its model's fleet acceptance (all
    engines serving the same model and draft), in fleets of two or more drafting engines."""
    same = ", ".join(source.model_labels)
    rate, drafting = _rec(source, "acceptance_rate", t), _drafting_promql(source, t)
    fleet = _rec(source, "acceptance_rate", t, source.model_level)
    return (f"{rate} < on({same}) group_left() ({fleet} - {t.divergence}) and on({same}) "
            f"(count by ({same}) ({drafting}) >= 2) and {drafting}")


RULES: tuple[Rule, ...] = (
    Rule(
        name="SpecscopeWeakDraft",
        severity="warning",
        summary="The draft model's acceptance rate is below {threshold}: speculation is wasted work",
        description="Accepted/drafted was {value} over the window (alpha {alpha}, mean acceptance length "
                    "{mean_length} tokens/step, per position {per_position}). Below {threshold}, verification "
                    "throws most draft tokens away.",
        value=lambda s: s.window.spec.acceptance_rate if s.window.spec else None,
        firing=_weak_draft,
        promql=lambda t: _weak_promql(SPECSCOPE, t),
        vllm_promql=lambda t: _weak_promql(VLLM, t),
        for_s=lambda t: t.weak_draft_for_s,
        advice="Use a draft better matched to the target, lower K, or turn speculation off.",
        threshold=lambda t: t.weak_draft_acceptance,
    ),
    Rule(
        name="SpecscopeWeakDraftForClass",
        severity="warning",
        summary="Traffic class {traffic_class} accepts under {threshold} of its draft tokens",
        description="Requests of class {traffic_class} ({class_share} of the window's requests) accepted {value} "
                    "of their draft tokens (mean acceptance length {class_length}), against {rest_rate} for the "
                    "other classes: the engine-wide acceptance hides it.",
        value=lambda s: s.classes[0].window.acceptance_rate if s.classes else None,
        firing=_weak_class,
        promql=_weak_class_promql,
        for_s=lambda t: t.weak_draft_for_s,
        advice="Use a draft trained for this traffic (for code, a code draft), or route this class to an engine "
               "without speculation.",
        threshold=lambda t: t.weak_draft_acceptance,
        per_engine=False,
        per_class=True,
    ),
    Rule(
        name="SpecscopeAcceptanceCollapse",
        severity="critical",
        summary="Speculation has collapsed: about 1 token per step while the draft keeps drafting",
        description="Mean acceptance length is {mean_length} tokens/step (at most {collapse}) over the window "
                    "while drafts continue (acceptance {value}, per position {per_position}): every step pays "
                    "for K draft tokens and keeps only the target's own. Likely causes: a draft or tokenizer "
                    "swapped or mis-loaded, a sampling setting the draft does not follow, a corrupted draft "
                    "checkpoint.",
        value=lambda s: s.window.spec.acceptance_rate if s.window.spec else None,
        firing=_collapsed,
        promql=lambda t: _collapse_promql(SPECSCOPE, t),
        vllm_promql=lambda t: _collapse_promql(VLLM, t),
        for_s=lambda t: t.collapse_for_s,
        advice="Turn speculation off (num_speculative_tokens 0 or no speculative_config) until the draft is "
               "fixed; check the draft path and `specscope check-tokenizers TARGET DRAFT`.",
        threshold=lambda t: t.collapse_length,
    ),
    Rule(
        name="SpecscopeSpeculationNotPaying",
        severity="warning",
        summary="Speculation is expected to be slower than plain decoding",
        description="Expected speedup is {value}, surely under 1 (the top of its interval, where one could be "
                    "drawn from the window's requests; Leviathan et al.: alpha, K and the draft/target cost ratio c; "
                    "{speedup_detail}).",
        value=lambda s: est.expected_speedup if (est := estimate(s)) else None,
        firing=_not_paying,
        promql=lambda t: (
            f"({_p('specscope.spec_decode.expected_speedup_high')} < 1 or "
            f"({_p('specscope.spec_decode.expected_speedup')} < 1 unless "
            f"{_p('specscope.spec_decode.expected_speedup_high')})) and ({_drafting_promql(SPECSCOPE, t)} or "
            f"({_decoding_promql(t)} unless {_rec(SPECSCOPE, 'draft_tokens', t)} > 0))"),
        for_s=lambda t: t.weak_draft_for_s,
        advice="Use the recommended K, a cheaper or better draft, or turn speculation off.",
    ),
    Rule(
        name="SpecscopeEngineDiverging",
        severity="warning",
        summary="One engine's acceptance is far below its peers'",
        description="Engine {engine} accepts {engine_rate} of its draft tokens over the window, the server's "
                    "drafting engines {peer_rate} on average (more than {threshold} apart). The same draft on the "
                    "same model should accept alike: one engine sees other traffic (sticky routing of one "
                    "tenant or language) or runs another draft, checkpoint or configuration.",
        value=_divergence,
        firing=lambda s, t: divergent_engine(s, t) is not None,
        promql=lambda t: _diverging_promql(SPECSCOPE, t),
        vllm_promql=lambda t: _diverging_promql(VLLM, t),
        for_s=lambda t: t.divergence_for_s,
        advice="Compare the engine's requests (`specscope top`, Enter on its row) with its peers'; check its "
               "load balancer routing and its launch flags.",
        threshold=lambda t: t.divergence,
        per_engine=False,
    ),
    _tokenizer_rule(
        "mismatch", "SpecscopeTokenizerMismatch", "critical",
        summary="The draft's tokenizer does not match the target's",
        description="The start-up check found that tokens both vocabularies hold have other ids in the draft, or "
                    "probe texts encode differently: the draft proposes ids that mean other tokens, and "
                    "acceptance collapses or is silently low (vLLM compares only the configured vocabulary "
                    "size). Evidence: {tokenizer}; vocabulary overlap {overlap}.",
        advice="Use a draft trained with the target's tokenizer; `specscope check-tokenizers TARGET DRAFT` shows "
               "the tokens that differ.",
    ),
    _tokenizer_rule(
        "warning", "SpecscopeTokenizerWarning", "warning",
        summary="The draft's tokenizer differs from the target's, shared tokens keep their ids",
        description="The start-up check found tokens only one side has (added tokens, a vocabulary extended at "
                    "the end), or other special tokens or chat template; every shared token keeps its id. "
                    "Evidence: {tokenizer}; vocabulary overlap {overlap}: the draft can never propose the rest.",
        advice="Harmless when the target's extra tokens are rare in your traffic (tool calls, chat markers); "
               "otherwise give the draft the target's tokenizer. `specscope check-tokenizers` lists them.",
    ),
    Rule(
        name="SpecscopeKVCacheFragmentation",
        severity="warning",
        summary="KV-cache blocks are mostly empty while blocks run short: fragmentation above {threshold}",
        description="Fragmentation (1 - token slots held / block slots allocated) is {value}: block usage "
                    "{block_usage}, token usage {token_usage}. Many short requests in large blocks, or a large K "
                    "reserving look-ahead slots.",
        value=lambda s: s.kv.fragmentation,
        firing=lambda s, t: (s.kv.fragmentation is not None and s.kv.fragmentation > t.fragmentation
                             and s.kv.block_usage is not None
                             and s.kv.block_usage > t.fragmentation_min_block_usage),
        promql=lambda t: (f"{_p('specscope.kv_cache.fragmentation')} > {t.fragmentation} and "
                          f"{_p('specscope.kv_cache.block_usage')} > {t.fragmentation_min_block_usage}"),
        for_s=lambda t: t.fragmentation_for_s,
        advice="Consider a smaller block size or K, or batching requests of similar length.",
        threshold=lambda t: t.fragmentation,
    ),
    Rule(
        name="SpecscopeKVCachePressure",
        severity="critical",
        summary="KV cache above {threshold} full with preemptions rising",
        description="Block usage is {value} and requests are being preempted (their KV dropped and recomputed): "
                    "latency rises.",
        value=lambda s: s.kv.block_usage,
        firing=lambda s, t: (s.kv.block_usage is not None and s.kv.block_usage > t.kv_usage
                             and s.window.preemptions > 0),
        promql=lambda t: (f"{_p('specscope.kv_cache.block_usage')} > {t.kv_usage} and "
                          f"increase({_p('specscope.engine.preemptions')}[{_window(t)}]) > 0"),
        vllm_promql=lambda t: (f"vllm:kv_cache_usage_perc > {t.kv_usage} and "
                               f"increase(vllm:num_preemptions_total[{_window(t)}]) > 0"),
        for_s=lambda t: t.kv_pressure_for_s,
        advice="Lower max_num_seqs or K, shorten max_model_len, or give the KV cache more memory.",
        threshold=lambda t: t.kv_usage,
    ),
    Rule(
        name="SpecscopeDraftCrowdsKVCache",
        severity="warning",
        summary="The draft takes {threshold} or more of the KV capacity while blocks run short",
        description="The draft's weights and its own KV layers take {value} of the KV capacity the target would "
                    "have without it: {draft_kv}. Block usage is {block_usage}: requests wait or are preempted "
                    "that the capacity would have held.",
        value=lambda s: cost.share if (cost := draft_kv_cost(s)) else None,
        firing=lambda s, t: ((cost := draft_kv_cost(s)) is not None and cost.share >= t.draft_kv_share
                             and s.kv.block_usage is not None and s.kv.block_usage > t.kv_usage),
        promql=lambda t: (f"{_p('specscope.kv_cache.draft_share')} >= {t.draft_kv_share} and "
                          f"{_p('specscope.kv_cache.block_usage')} > {t.kv_usage}"),
        for_s=lambda t: t.kv_pressure_for_s,
        advice="A smaller draft (fewer layers, an EAGLE head or n-gram), a lower K, or more memory for the KV "
               "cache; weigh the speedup the draft brings at this batch size against the sequences it costs.",
        threshold=lambda t: t.draft_kv_share,
    ),
    Rule(
        name="SpecscopeAllocatorFragmentation",
        severity="warning",
        summary="torch holds {threshold} or more of its reserved GPU memory unallocated on a full GPU",
        description="{allocator}. The caching allocator keeps freed blocks and split fragments for its own reuse; "
                    "on a nearly full GPU that memory is lost to everything else (another model, a second "
                    "process, the next larger allocation, which then fails with out-of-memory).",
        value=lambda s: w.share if (w := allocator_waste(s)) else None,
        firing=lambda s, t: ((w := allocator_waste(s)) is not None and w.share > t.allocator_fragmentation
                             and w.idle_bytes >= t.allocator_min_idle_bytes
                             and w.device_used is not None and w.device_used > t.kv_usage),
        promql=_allocator_promql,
        for_s=lambda t: t.allocator_for_s,
        advice="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fewer split fragments), call "
               "torch.cuda.empty_cache() between phases that allocate differently, or leave the GPU more headroom "
               "(a lower gpu_memory_utilization for the engine sharing it).",
        threshold=lambda t: t.allocator_fragmentation,
        per_engine=False,
    ),
)

BY_RULE: dict[str, Rule] = {r.name: r for r in RULES}


def describe(rule: Rule, snap: Snapshot, t: Thresholds) -> tuple[str, str]:
    """(summary, description) with the live numbers filled in."""
    w = snap.window.spec
    share, rest = class_context(snap)

    threshold = rule.threshold(t) if rule.threshold else None
    raw = rule.value(snap)
    values = {
        "value": f"{raw:.2f}x" if rule.name == "SpecscopeSpeculationNotPaying" and raw is not None else percent(raw),
        "threshold": f"{threshold:.2f}" if rule.name == "SpecscopeAcceptanceCollapse" else percent(threshold),
        "alpha": percent(w.alpha if w else None),
        "mean_length": "n/a" if not w or w.mean_acceptance_length is None else f"{w.mean_acceptance_length:.2f}",
        "per_position": ", ".join(percent(r) for r in w.per_position) if w else "n/a",
        "block_usage": percent(snap.kv.block_usage),
        "token_usage": percent(snap.kv.token_usage),
        "speedup_detail": explain(est) if (est := estimate(snap)) else "no estimate",
        "draft_kv": cost.explain() if (cost := draft_kv_cost(snap)) else "n/a",
        "allocator": waste.explain() if (waste := allocator_waste(snap)) else "n/a",
        "tokenizer": "; ".join(snap.tokenizer.reasons) if snap.tokenizer and snap.tokenizer.reasons else "n/a",
        "overlap": percent(snap.tokenizer.overlap if snap.tokenizer else None),
        "collapse": f"{t.collapse_length:.2f}",
        "engine": str(div[0]) if (div := divergent_engine(snap, replace(t, divergence=0.0))) else "n/a",
        "engine_rate": percent(div[1] if div else None),
        "peer_rate": percent(div[2] if div else None),
        "traffic_class": snap.classes[0].name if snap.classes else "n/a",
        "class_share": percent(share),
        "rest_rate": percent(rest),
        "class_length": "n/a" if not snap.classes or (length := snap.classes[0].window.mean_acceptance_length) is None
        else f"{length:.2f}",
    }
    return rule.summary.format(**values), f"{rule.description.format(**values)} {rule.advice}"


def static_summary(rule: Rule, t: Thresholds) -> str:
    """The summary with the threshold filled in and no live value (for Prometheus' annotations)."""
    threshold = rule.threshold(t) if rule.threshold else None
    return (rule.summary.replace("{threshold}", "n/a" if threshold is None else f"{threshold:.0%}")
            .replace("{traffic_class}", "{{ $labels.traffic_class }}"))

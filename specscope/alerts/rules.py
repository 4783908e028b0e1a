"""Alert rules, defined once: evaluated in-process on the snapshot, and rendered as Prometheus alerting rules.

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

from specscope.catalogue import BY_NAME
from specscope.model import Snapshot
from specscope.summary import percent

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
    fragmentation_for_s: float = 300.0
    kv_usage: float = 0.9
    kv_pressure_for_s: float = 120.0
    gpu_memory: float = 0.95
    gpu_memory_for_s: float = 120.0
    keep_firing_for_s: float = 60.0
    window_s: float = 60.0

    def check(self) -> Thresholds:
        """Raise :class:`RuleConfigError` on values that make no sense."""
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
                raise RuleConfigError(f"threshold {f.name} must be a non-negative number, got {v!r}")
        for name in ("weak_draft_acceptance", "fragmentation", "kv_usage", "gpu_memory"):
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


def _p(name: str) -> str:
    return BY_NAME[name].prometheus_name


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

    @property
    def runbook_url(self) -> str:
        """Where the runbook explains what to do."""
        return f"{RUNBOOK}#{self.name.lower()}"


def _weak_draft(s: Snapshot, t: Thresholds) -> bool:
    w = s.window.spec
    return (w is not None and w.draft_tokens >= t.weak_draft_min_draft_tokens and w.acceptance_rate is not None
            and w.acceptance_rate < t.weak_draft_acceptance)


def _estimate(s: Snapshot) -> Any:
    from specscope.diagnostics import estimate

    return estimate(s)


def _not_paying(s: Snapshot, t: Thresholds) -> bool:
    w = s.window.spec
    if w is None or w.draft_tokens < t.weak_draft_min_draft_tokens:
        return False
    est = _estimate(s)
    return est is not None and not est.pays


def _window(t: Thresholds) -> str:
    return f"{int(t.window_s)}s"


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
        promql=lambda t: (
            f"{_p('specscope.spec_decode.acceptance_rate')} < {t.weak_draft_acceptance} and "
            f"increase({_p('specscope.spec_decode.draft_tokens')}[{_window(t)}]) >= {t.weak_draft_min_draft_tokens}"),
        vllm_promql=lambda t: (
            f"(rate(vllm:spec_decode_num_accepted_tokens_total[{_window(t)}]) / "
            f"rate(vllm:spec_decode_num_draft_tokens_total[{_window(t)}])) < {t.weak_draft_acceptance} and "
            f"increase(vllm:spec_decode_num_draft_tokens_total[{_window(t)}]) >= {t.weak_draft_min_draft_tokens}"),
        for_s=lambda t: t.weak_draft_for_s,
        advice="Use a draft better matched to the target, lower K, or turn speculation off.",
        threshold=lambda t: t.weak_draft_acceptance,
    ),
    Rule(
        name="SpecscopeSpeculationNotPaying",
        severity="warning",
        summary="Speculation is expected to be slower than plain decoding",
        description="Expected speedup is {value} (Leviathan et al.: alpha, K and the draft/target cost ratio c; "
                    "{speedup_detail}).",
        value=lambda s: est.expected_speedup if (est := _estimate(s)) else None,
        firing=_not_paying,
        promql=lambda t: (
            f"{_p('specscope.spec_decode.expected_speedup')} < 1 and "
            f"increase({_p('specscope.spec_decode.draft_tokens')}[{_window(t)}]) >= {t.weak_draft_min_draft_tokens}"),
        for_s=lambda t: t.weak_draft_for_s,
        advice="Use the recommended K, a cheaper or better draft, or turn speculation off.",
    ),
    Rule(
        name="SpecscopeTokenizerMismatch",
        severity="critical",
        summary="The draft's tokenizer does not match the target's",
        description="The start-up check found that the draft maps tokens to other ids than the target: it "
                    "proposes ids that mean other tokens. vLLM checks only the vocabulary size. Run "
                    "`specscope check-tokenizers TARGET DRAFT` for the details.",
        value=lambda s: (1.0 if s.tokenizer.verdict == "mismatch" else 0.0) if s.tokenizer else None,
        firing=lambda s, t: s.tokenizer is not None and s.tokenizer.verdict == "mismatch",
        promql=lambda t: f'{_p("specscope.tokenizer.mismatch")}{{state="mismatch"}} == 1',
        for_s=lambda t: 0.0,
        advice="Use a draft trained with the target's tokenizer; check with specscope check-tokenizers.",
    ),
    Rule(
        name="SpecscopeKVCacheFragmentation",
        severity="warning",
        summary="KV-cache blocks are mostly empty: fragmentation above {threshold}",
        description="Fragmentation (1 - token slots held / block slots allocated) is {value}: block usage "
                    "{block_usage}, token usage {token_usage}. Many short requests in large blocks, or a large K "
                    "reserving look-ahead slots.",
        value=lambda s: s.kv.fragmentation,
        firing=lambda s, t: s.kv.fragmentation is not None and s.kv.fragmentation > t.fragmentation,
        promql=lambda t: f"{_p('specscope.kv_cache.fragmentation')} > {t.fragmentation}",
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
        name="SpecscopeGPUMemoryHigh",
        severity="warning",
        summary="GPU memory above {threshold}",
        description="A GPU is {value} full. Target and draft share it with the KV cache (the draft holds "
                    "{draft_share} of the models' weights); allocation failures or preemptions follow.",
        value=lambda s: max((d.used_fraction for d in s.gpu.devices), default=None),
        firing=lambda s, t: any(d.used_fraction > t.gpu_memory for d in s.gpu.devices),
        promql=lambda t: f"{_p('hw.gpu.memory.usage')} / {_p('hw.gpu.memory.limit')} > {t.gpu_memory}",
        for_s=lambda t: t.gpu_memory_for_s,
        advice="Lower gpu_memory_utilization, use a smaller draft, or move the draft off this GPU.",
        threshold=lambda t: t.gpu_memory,
    ),
)

BY_RULE: dict[str, Rule] = {r.name: r for r in RULES}


def describe(rule: Rule, snap: Snapshot, t: Thresholds) -> tuple[str, str]:
    """(summary, description) with the live numbers filled in."""
    w = snap.window.spec

    threshold = rule.threshold(t) if rule.threshold else None
    raw = rule.value(snap)
    values = {
        "value": f"{raw:.2f}x" if rule.name == "SpecscopeSpeculationNotPaying" and raw is not None else percent(raw),
        "threshold": percent(threshold),
        "alpha": percent(w.alpha if w else None),
        "mean_length": "n/a" if not w or w.mean_acceptance_length is None else f"{w.mean_acceptance_length:.2f}",
        "per_position": ", ".join(percent(r) for r in w.per_position) if w else "n/a",
        "block_usage": percent(snap.kv.block_usage),
        "token_usage": percent(snap.kv.token_usage),
        "speedup_detail": est.explain() if (est := _estimate(snap)) else "no estimate",
        "draft_share": percent(snap.cost_ratio.draft_weight_share if snap.cost_ratio else None),
    }
    return rule.summary.format(**values), f"{rule.description.format(**values)} {rule.advice}"


def static_summary(rule: Rule, t: Thresholds) -> str:
    """The summary with the threshold filled in and no live value (for Prometheus' annotations)."""
    threshold = rule.threshold(t) if rule.threshold else None
    return rule.summary.replace("{threshold}", "n/a" if threshold is None else f"{threshold:.0%}")

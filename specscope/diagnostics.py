"""Does speculation pay? Expected speedup from the live α, K and the draft/target cost ratio c.

Leviathan et al. 2023: speedup = (1 − α^(K+1)) / ((1 − α)(K·c + 1)), with c = draft step time / target step
time. c is **measured** when a baseline is given: the same target's decode-step times without speculation, by
batch size (``specscope calibrate``, or any specscope-instrumented engine's ``step_times``). Then, at batch b,
a speculative step of T_spec(b) against a plain one of T_plain(b) gives the effective c(b) = (T_spec/T_plain − 1)/K:
everything a speculative step costs beyond a plain one (K draft passes, verifying K+1 tokens per request,
rejection sampling), per draft token. That makes the estimate depend on batch size, as real speedups do.
Without a baseline, c is estimated from the two models' parameter counts (decoding is memory-bound on GPUs, so
step time follows the bytes of weights read), and the estimate says so. n-gram lookup has no model: c ≈ 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope import acceptance as acc
from specscope.model import CostRatio, Snapshot, StepProfile, StepTime

#: Decode steps a batch size needs before its mean step time is used.
MIN_STEPS = 3


@dataclass(frozen=True)
class SpeedupEstimate:
    """Expected speedup over no speculation, and the K that would maximise it."""

    alpha: float
    k: int
    cost_ratio: float
    cost_ratio_source: str
    expected_tokens_per_step: float
    expected_speedup: float
    best_k: int
    best_speedup: float
    batch_size: int | None = None

    @property
    def pays(self) -> bool:
        """True when speculation is expected to be faster than plain decoding."""
        return self.expected_speedup >= 1.0

    def explain(self) -> str:
        """One paragraph a person can act on."""
        verdict = "pays" if self.pays else "does NOT pay"
        advice = (f"K={self.best_k} would give {self.best_speedup:.2f}x" if self.best_speedup >= 1.0
                  else "no K makes it pay with this draft: alpha is not above c")
        at = f" and batch {self.batch_size}" if self.batch_size else ""
        return (f"speculation {verdict}: expected speedup {self.expected_speedup:.2f}x at K={self.k}{at} "
                f"(alpha {self.alpha:.2f}, c {self.cost_ratio:.2f}, {self.cost_ratio_source}); {advice}")


def parameter_count(model_dir: str | Path) -> int | None:
    """Approximate parameters of a decoder-only transformer from its config.json; None when unreadable."""
    try:
        cfg: dict[str, Any] = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    try:
        hidden, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(cfg.get("num_attention_heads") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * hidden * inter  # gate, up, down
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp) + embeddings


def cost_ratio_from_models(target: str | Path, draft: str | Path | None, method: str | None) -> CostRatio | None:
    """c estimated from parameter counts (or ≈0 for n-gram lookup); None when the configs cannot be read."""
    if method == "ngram":
        return CostRatio(0.0, "n-gram lookup runs no model")
    if draft is None:
        return None
    pt, pd = parameter_count(target), parameter_count(draft)
    if not pt or not pd:
        return None
    return CostRatio(pd / pt, f"estimated from parameter counts ({pd:,} draft / {pt:,} target)", pt, pd)


def measured_cost(snap: Snapshot, batch_size: int) -> CostRatio | None:
    """The effective c at ``batch_size`` from live step times against the baseline; None without both."""
    k = snap.engine.num_speculative_tokens
    if snap.baseline is None or not k:
        return None
    t_spec, t_plain = snap.step_times.at(batch_size, MIN_STEPS), snap.baseline.at(batch_size, MIN_STEPS)
    if t_spec is None or not t_plain:
        return None
    sizes = snap.cost_ratio
    return CostRatio(
        max(0.0, (t_spec / t_plain - 1.0) / k),
        f"measured at batch {batch_size}: {1e3 * t_spec:.1f} ms per speculative step, "
        f"{1e3 * t_plain:.1f} ms without speculation ({snap.baseline.source})",
        sizes.target_params if sizes else None,
        sizes.draft_params if sizes else None,
    )


def estimate(snap: Snapshot, cost: CostRatio | None = None, batch_size: int | None = None) -> SpeedupEstimate | None:
    """The estimate from the window's α (the lifetime's while the window is empty); None without the inputs.

    c is, in order: ``cost`` if given, measured at ``batch_size`` (default: the last decode step's batch) when
    a baseline is set, else the snapshot's estimate from parameter counts.
    """
    k = snap.engine.num_speculative_tokens
    spec = snap.window.spec if snap.window.spec and snap.window.spec.drafts else snap.lifetime.spec
    if not k or spec is None or spec.alpha is None:
        return None
    batch = batch_size or snap.decode_batch
    measured = measured_cost(snap, batch) if cost is None and batch else None
    cost = cost or measured or snap.cost_ratio
    if cost is None:
        return None
    a = spec.alpha
    best_k, best = acc.best_k(a, cost.value)
    return SpeedupEstimate(
        alpha=a, k=k, cost_ratio=cost.value, cost_ratio_source=cost.source,
        expected_tokens_per_step=acc.expected_tokens_per_step(a, k),
        expected_speedup=acc.expected_speedup(a, k, cost.value), best_k=best_k, best_speedup=best,
        batch_size=batch if measured is not None else None,
    )


def by_batch_size(snap: Snapshot) -> list[SpeedupEstimate]:
    """The measured estimate at every batch size this engine has run (needs a baseline)."""
    out = []
    for t in snap.step_times.times:
        if t.steps < MIN_STEPS:
            continue
        est = estimate(snap, batch_size=t.batch_size)
        if est is not None and est.batch_size is not None:
            out.append(est)
    return out


def by_batch_line(estimates: list[SpeedupEstimate]) -> str | None:
    """"by batch size 1: 1.14x  8: 0.92x; pays at batch 1, not at 8" for a report; None without estimates."""
    if not estimates:
        return None
    cells = "  ".join(f"{e.batch_size}: {e.expected_speedup:.2f}x" for e in estimates)
    paying = ", ".join(str(e.batch_size) for e in estimates if e.pays)
    losing = ", ".join(str(e.batch_size) for e in estimates if not e.pays)
    if not losing:
        verdict = "pays at every batch size measured"
    elif not paying:
        verdict = "pays at no batch size measured"
    else:
        verdict = f"pays at batch {paying}, not at {losing}"
    return f"by batch size {cells}; {verdict}"


def save_profile(profile: StepProfile, path: str | Path, model: str | None = None) -> None:
    """Write step times as a baseline file (JSON) for :func:`load_profile`."""
    doc = {"model": model, "step_times": [{"batch_size": t.batch_size, "steps": t.steps, "mean_s": t.mean_s}
                                          for t in profile.times]}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def load_profile(path: str | Path) -> StepProfile:
    """Read a baseline file; ValueError with one line saying what is wrong."""
    try:
        doc = json.loads(Path(path).read_text())
        times = tuple(StepTime(int(t["batch_size"]), int(t["steps"]), float(t["mean_s"])) for t in doc["step_times"])
    except OSError as exc:
        raise ValueError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a specscope baseline (step_times by batch size): {exc}") from None
    if not times or any(t.batch_size < 1 or t.steps < 1 or t.mean_s <= 0 for t in times):
        raise ValueError(f"{path} is not a usable baseline: it needs positive batch sizes, steps and times")
    name = doc.get("model")
    return StepProfile(times, f"baseline {Path(path).name}" + (f" of {name}" if name else ""))

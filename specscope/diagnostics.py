"""Does speculation pay? Expected speedup from the live α, K and the draft/target cost ratio c.

Leviathan et al. 2023: speedup = (1 − α^(K+1)) / ((1 − α)(K·c + 1)), with c = draft step time / target step
time. specscope estimates c from the two models' parameter counts (decoding is memory-bound on GPUs, so step
time follows the bytes of weights read) and says so; a measured c can be given instead. n-gram lookup has no
model: c ≈ 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope import acceptance as acc
from specscope.model import CostRatio, Snapshot


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

    @property
    def pays(self) -> bool:
        """True when speculation is expected to be faster than plain decoding."""
        return self.expected_speedup >= 1.0

    def explain(self) -> str:
        """One paragraph a person can act on."""
        verdict = "pays" if self.pays else "does NOT pay"
        advice = (f"K={self.best_k} would give {self.best_speedup:.2f}x" if self.best_speedup >= 1.0
                  else "no K makes it pay with this draft: alpha is not above c")
        return (f"speculation {verdict}: expected speedup {self.expected_speedup:.2f}x at K={self.k} "
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


def estimate(snap: Snapshot, cost: CostRatio | None = None) -> SpeedupEstimate | None:
    """The estimate from the window's α (the lifetime's while the window is empty); None without the inputs."""
    cost = cost or snap.cost_ratio
    k = snap.engine.num_speculative_tokens
    spec = snap.window.spec if snap.window.spec and snap.window.spec.drafts else snap.lifetime.spec
    if cost is None or not k or spec is None or spec.alpha is None:
        return None
    a = spec.alpha
    best_k, best = acc.best_k(a, cost.value)
    return SpeedupEstimate(
        alpha=a, k=k, cost_ratio=cost.value, cost_ratio_source=cost.source,
        expected_tokens_per_step=acc.expected_tokens_per_step(a, k),
        expected_speedup=acc.expected_speedup(a, k, cost.value), best_k=best_k, best_speedup=best,
    )

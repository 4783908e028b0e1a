"""Speedup diagnostics: parameter counts against the real weights, the estimate against the closed form."""

from __future__ import annotations

from pathlib import Path

import pytest

from specscope import acceptance as acc
from specscope.alerts.evaluate import Evaluator
from specscope.alerts.rules import BY_RULE, Thresholds
from specscope.diagnostics import cost_ratio_from_models, estimate, parameter_count
from specscope.hub import Hub, StepStats
from specscope.model import CostRatio, EngineInfo


def weights(path: Path) -> int:
    from safetensors.torch import load_file

    tensors = load_file(path / "model.safetensors")
    # Norm weights are tiny and left out of the estimate; everything else must match exactly.
    return sum(t.numel() for name, t in tensors.items() if "norm" not in name)


@pytest.mark.parametrize("name", ["target", "independent", "other-vocab"])
def test_parameter_count_matches_the_weights(tiny: dict[str, Path], name: str) -> None:
    assert parameter_count(tiny[name]) == weights(tiny[name])


def test_cost_ratio(tiny: dict[str, Path], tmp_path: Path) -> None:
    c = cost_ratio_from_models(tiny["target"], tiny["independent"], "draft_model")
    assert c is not None and c.value == pytest.approx(weights(tiny["independent"]) / weights(tiny["target"]))
    assert "parameter counts" in c.source
    t, d = weights(tiny["target"]), weights(tiny["independent"])
    assert c.draft_weight_share == pytest.approx(d / (t + d))
    assert cost_ratio_from_models(tiny["target"], None, "ngram") == CostRatio(0.0, "n-gram lookup runs no model")
    assert cost_ratio_from_models(tiny["target"], tmp_path, "draft_model") is None  # no config.json


def hub_with(alpha_draft: list[int], c: float, k: int = 4) -> Hub:
    hub = Hub()
    hub.set_engine(EngineInfo(num_speculative_tokens=k, method="draft_model"))
    hub.set_cost_ratio(CostRatio(c, "given"))
    per_pos = [sum(1 for a in alpha_draft if a > i) for i in range(k)]
    hub.record_step(StepStats(num_spec_tokens=k, drafts=len(alpha_draft), draft_tokens=k * len(alpha_draft),
                              accepted=sum(alpha_draft), accepted_per_pos=per_pos,
                              draft_tokens_per_pos=[len(alpha_draft)] * k))
    return hub


def test_estimate_follows_leviathan_and_recommends_k() -> None:
    hub = hub_with([4] * 80 + [1] * 20 + [0] * 20, c=0.05)  # a good, cheap draft
    est = estimate(hub.snapshot())
    assert est is not None
    a = hub.snapshot().window.spec.alpha
    assert est.alpha == a and est.expected_speedup == pytest.approx(acc.expected_speedup(a, 4, 0.05))
    assert est.pays and (est.best_k, est.best_speedup) == acc.best_k(a, 0.05)
    assert "pays" in est.explain() and "parameter" not in est.explain()
    weak = estimate(hub_with([0] * 90 + [1] * 30, c=0.5).snapshot())
    assert weak is not None and not weak.pays and weak.best_speedup < 1
    assert "no K makes it pay" in weak.explain()
    assert estimate(Hub().snapshot()) is None  # no speculation, no estimate


def test_not_paying_rule() -> None:
    rule = BY_RULE["SpecscopeSpeculationNotPaying"]
    t = Thresholds(weak_draft_for_s=0)
    bad = hub_with([0] * 90 + [1] * 30, c=0.5)
    (alert,) = Evaluator(bad, rules=[rule], thresholds=t).evaluate()
    assert alert.state == "firing" and "does NOT pay" in alert.description
    assert Evaluator(hub_with([4] * 120, c=0.05), rules=[rule], thresholds=t).evaluate() == []

"""Speedup diagnostics: parameter counts against the real weights, the estimate against the closed form."""

from __future__ import annotations

from pathlib import Path

import pytest

from specscope import acceptance as acc
from specscope.alerts.evaluate import Evaluator
from specscope.alerts.rules import BY_RULE, Thresholds
from specscope.diagnostics import (
    by_batch_line,
    by_batch_size,
    cost_ratio_from_models,
    estimate,
    load_profile,
    parameter_count,
    save_profile,
)
from specscope.hub import Hub, StepStats
from specscope.model import CostRatio, EngineInfo, StepProfile, StepTime


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


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def steps(hub: Hub, clock: Clock, batch: int, dt: float, n: int, k: int | None = None) -> None:
    """n decode-only steps of ``batch`` requests, ``dt`` seconds apart (speculative with K=k); the last finishes
    them all, and the engine goes idle for a minute."""
    for i in range(n):
        clock.t += dt
        spec = {} if k is None else {"num_spec_tokens": k, "drafts": batch, "draft_tokens": k * batch,
                                     "accepted": k * batch, "accepted_per_pos": [batch] * k,
                                     "draft_tokens_per_pos": [batch] * k}
        last = i == n - 1
        hub.record_step(StepStats(running=0 if last else batch, waiting=0, generation_tokens=batch,
                                  finished=batch if last else 0, **spec))
    clock.t += 60


def test_hub_times_decode_steps_by_batch_size() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.record_step(StepStats(running=2, waiting=0, prompt_tokens=30, generation_tokens=2))  # prefill: not timed
    steps(hub, clock, 2, 0.010, 5)  # each follows a busy step, the last one included (it finished the batch)
    steps(hub, clock, 1, 0.005, 4)  # the first of these follows an idle minute and is not timed
    snap = hub.snapshot()
    by = {t.batch_size: t for t in snap.step_times.times}
    assert by[2].steps == 5 and by[2].mean_s == pytest.approx(0.010)
    assert by[1].steps == 3 and by[1].mean_s == pytest.approx(0.005)
    assert snap.decode_batch == 1
    assert snap.to_dict()["step_times"]["times"][0] == {"batch_size": 1, "steps": 3, "mean_s": pytest.approx(0.005)}


def test_profile_interpolates_between_measured_batch_sizes() -> None:
    p = StepProfile((StepTime(1, 10, 0.010), StepTime(8, 10, 0.024), StepTime(4, 1, 1.0)))
    assert p.at(1) == 0.010 and p.at(8) == 0.024
    assert p.at(4) == pytest.approx(0.016)  # batch 4 has too few steps; interpolated
    assert p.at(16) is None and p.at(4, min_steps=1) == 1.0


def test_measured_cost_makes_the_estimate_depend_on_batch_size(tmp_path: Path) -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model"))
    hub.set_cost_ratio(CostRatio(1.0, "estimated from parameter counts", 100, 100))
    steps(hub, clock, 1, 0.015, 10, k=4)
    steps(hub, clock, 8, 0.022, 10, k=4)
    snap = hub.snapshot()
    assert estimate(snap).cost_ratio_source.startswith("estimated")  # type: ignore[union-attr]  # no baseline
    base = StepProfile((StepTime(1, 50, 0.0036), StepTime(8, 50, 0.0043)), "baseline b.json")
    save_profile(base, tmp_path / "b.json", "tiny")
    hub.set_baseline(load_profile(tmp_path / "b.json"))
    snap = hub.snapshot()
    one, eight = by_batch_size(snap)
    tokens = acc.expected_tokens_per_step(1.0, 4)
    assert one.batch_size == 1 and one.expected_speedup == pytest.approx(tokens * 0.0036 / 0.015)
    assert one.cost_ratio == pytest.approx((0.015 / 0.0036 - 1) / 4)
    assert eight.expected_speedup == pytest.approx(tokens * 0.0043 / 0.022) and not eight.pays
    assert "measured at batch 8: 22.0 ms per speculative step, 4.3 ms without speculation" in eight.explain()
    assert "baseline b.json of tiny" in eight.explain()
    assert estimate(snap) == eight  # the last decode batch is the default
    assert by_batch_line([one, eight]) == "by batch size 1: 1.20x  8: 0.98x; pays at batch 1, not at 8"
    assert estimate(snap).cost_ratio_source.startswith("measured")  # type: ignore[union-attr]


def test_bad_baseline_files_say_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    for text, words in (("{", "not a specscope baseline"), ('{"step_times": []}', "not a usable baseline"),
                        ('{"step_times": [{"batch_size": 0, "steps": 1, "mean_s": 1}]}', "not a usable baseline")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=words):
            load_profile(bad)
    with pytest.raises(ValueError, match="cannot read baseline"):
        load_profile(tmp_path / "missing.json")

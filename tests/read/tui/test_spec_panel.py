"""The speculative panel with a K table, for every speculative method specscope knows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specscope.core.model import EngineInfo, StepProfile, StepTime
from specscope.core.sizing import MODEL_FREE_METHODS
from specscope.read.tui.view import spec_panel
from specscope.state.hub import Hub
from specscope.verdict import estimate, k_table, recommended_config, schedule_text
from specscope.verdict.vllm_policy import SCHEDULABLE_METHODS
from tests.verdict.test_verdict import K0_SCHEDULE, SETUP, STEEP, Clock, k0_hub, steps

#: specscope's methods, and two of vLLM's that it lists nowhere.
METHODS = sorted(SCHEDULABLE_METHODS | MODEL_FREE_METHODS | {"medusa", "custom_class"})


@pytest.mark.parametrize(("method", "dp", "runner"), [(m, 1, "v1") for m in METHODS] + [
    ("draft_model", 2, "v1"), ("ngram", 4, "v1"), ("draft_model", 1, "v2"), ("eagle3", 1, "v2")])
def test_the_panel_gives_a_schedule_or_one_k_for_every_method(method: str, dp: int, runner: str) -> None:
    """A baseline and two batch sizes (batch 1, the last decoded, pays): the panel ends with vLLM's schedule where
    vLLM takes one, else the one K to run (a method vLLM keeps no schedule for, or data parallel, where vLLM drops
    the schedule and drafts ``num_speculative_tokens`` at every batch size; a draft model on the V2 runner, which
    drafts ``num_speculative_tokens`` passes on every step whatever the schedule's K)."""
    clock = Clock()
    hub = Hub(clock=clock)
    setup = replace(SETUP, model_runner=runner)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method=method, setup=setup, data_parallel_size=dp))
    hub.set_baseline(StepProfile((StepTime(1, 50, 0.0036), StepTime(4, 50, 0.0040), StepTime(16, 50, 0.0060)),
                                 "measured on /m/target", setup))
    steps(hub, clock, 16, STEEP, 30, accepted=3, prefill_s=0.064)
    steps(hub, clock, 1, 0.008, 30, accepted=3, prefill_s=0.004)
    snap = hub.snapshot()
    table = k_table(snap)
    assert len({c.k for c in table}) > 1  # the best K differs by batch size: a schedule where vLLM takes one
    config = recommended_config(snap)
    assert config is not None
    line = spec_panel(snap, 0.3).plain.splitlines()[-1]
    if method in SCHEDULABLE_METHODS and dp == 1 and (method, runner) != ("draft_model", "v2"):
        assert line == f"K schedule: {json.dumps(config['num_speculative_tokens_per_batch_size'])}"
    else:
        assert set(config) == {"num_speculative_tokens"}
        why = (f"vLLM drops a per-batch-size schedule under data parallel (size {dp})" if dp > 1 else
               "vLLM's V2 model runner drafts num_speculative_tokens passes on every step for a draft model, "
               "whatever K the schedule gives the step" if runner == "v2" else
               f"vLLM keeps no per-batch-size schedule for method {method}")
        assert line == f"K schedule: none ({why}); run K={config['num_speculative_tokens']}"
        assert config["num_speculative_tokens"] == estimate(snap).advised_k  # type: ignore[union-attr]


@pytest.mark.parametrize(("device", "runner", "eager", "said"), [
    ("cuda: NVIDIA H100 80GB HBM3", "v1", False, True), ("cuda: NVIDIA H100 80GB HBM3", "v2", False, False),
    ("cuda: NVIDIA H100 80GB HBM3", "v1", True, False), ("cpu", "v1", False, False)])
def test_a_schedule_says_what_it_costs_in_cuda_graphs(device: str, runner: str, eager: bool, said: bool) -> None:
    """vLLM's V1 runner swaps FULL CUDA graphs for PIECEWISE ones under a schedule: said where graphs run."""
    clock = Clock()
    hub = Hub(clock=clock)
    setup = replace(SETUP, device=device, model_runner=runner, enforce_eager=eager)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="eagle3", setup=setup))
    hub.set_baseline(StepProfile((StepTime(1, 50, 0.0036), StepTime(4, 50, 0.0040), StepTime(16, 50, 0.0060)),
                                 "measured on /m/target", setup))
    steps(hub, clock, 16, STEEP, 30, accepted=3, prefill_s=0.064)
    steps(hub, clock, 1, 0.008, 30, accepted=3, prefill_s=0.004)
    text = "\n".join(schedule_text(hub.snapshot()))
    assert "num_speculative_tokens_per_batch_size" in text
    assert ("PIECEWISE CUDA graphs instead of FULL ones" in text) == said


def test_the_panel_shows_a_k0_ranges_measured_speedup() -> None:
    """At an operating batch in a K = 0 range of the schedule (issue 26 item 3): the range's measured speed, not
    "speedup n/a", and the schedule it runs given back."""
    panel = spec_panel(k0_hub(Clock()).snapshot(), 0.3).plain
    assert "speedup 0.91x (0.71-1.06) at K=0 batch 16; remove speculation (K=0 runs 0.91x)" in panel
    assert "speedup n/a" not in panel and "16: 0.91x  24: 0.91x" in panel
    assert panel.splitlines()[-1] == f"K schedule: {json.dumps([list(r) for r in K0_SCHEDULE])}"

"""The speculative panel with a K table, for every speculative method specscope knows."""

from __future__ import annotations

import json

import pytest

from specscope.hub import Hub
from specscope.model import SCHEDULABLE_METHODS, EngineInfo, StepProfile, StepTime
from specscope.sizing import MODEL_FREE_METHODS
from specscope.tui.view import spec_panel
from specscope.verdict import k_table, recommended_config
from tests.test_verdict import SETUP, Clock, steps

#: specscope's methods, and two of vLLM's that it lists nowhere.
METHODS = sorted(SCHEDULABLE_METHODS | MODEL_FREE_METHODS | {"medusa", "custom_class"})


@pytest.mark.parametrize("method", METHODS)
def test_the_panel_gives_a_schedule_or_one_k_for_every_method(method: str) -> None:
    """A baseline and two batch sizes (batch 1, the last decoded, pays): the panel ends with vLLM's schedule where
    vLLM takes one, else the one K to run."""
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method=method, setup=SETUP))
    hub.set_baseline(StepProfile((StepTime(1, 50, 0.0036), StepTime(4, 50, 0.0040), StepTime(16, 50, 0.0060)),
                                 "measured on /m/target", SETUP))
    steps(hub, clock, 16, 0.030, 30, accepted=3, prefill_s=0.064)
    steps(hub, clock, 1, 0.008, 30, accepted=3, prefill_s=0.004)
    snap = hub.snapshot()
    assert k_table(snap)
    config = recommended_config(snap)
    assert config is not None
    line = spec_panel(snap, 0.3).plain.splitlines()[-1]
    if method in SCHEDULABLE_METHODS:
        assert line == f"K schedule: {json.dumps(config['num_speculative_tokens_per_batch_size'])}"
    else:
        assert line == f"K schedule: none for {method} in vLLM; run K={config['num_speculative_tokens']}"

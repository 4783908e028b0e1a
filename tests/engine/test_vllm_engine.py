"""One hub, one engine: engines made in one process (a plain and a speculative one, side by side in a notebook)
keep their numbers apart, whichever way they are instrumented."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from specscope.engine import gpu_source, vllm_engine, vllm_hook
from specscope.engine.vllm_engine import SpecscopeError, instrument, uninstrument
from specscope.engine.vllm_logger import SpecscopeStatLogger
from specscope.state import hub as hub_module
from specscope.state.hub import Hub, default_hub

stats = pytest.importorskip("vllm.v1.metrics.stats")
spec_metrics = pytest.importorskip("vllm.v1.spec_decode.metrics")


class Engine:
    """What :func:`instrument` touches of a vLLM ``LLMEngine``: its config, its logger manager, ``step``."""

    def __init__(self, model: str, k: int | None = None) -> None:
        spec = None if k is None else SimpleNamespace(method="draft_model", num_speculative_tokens=k,
                                                      draft_model_config=SimpleNamespace(model=f"{model}-draft"))
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(model=model), speculative_config=spec)
        self.logger_manager = SimpleNamespace(stat_loggers=[], engine_indexes=[0])

    def step(self) -> list[Any]:
        return []

    def run_step(self, batch: int, accepted: int | None) -> None:
        """One decode step of ``batch`` requests, as vLLM hands it to the engine's stat loggers."""
        sds = None
        if accepted is not None:
            sds = spec_metrics.SpecDecodingStats.new(4)
            for _ in range(batch):
                sds.observe_draft(num_draft_tokens=4, num_accepted_tokens=accepted)
        sched = stats.SchedulerStats(num_running_reqs=batch, num_waiting_reqs=0, spec_decoding_stats=sds)
        it = stats.IterationStats()
        it.num_generation_tokens = batch * (1 + (accepted or 0))
        for logger in self.logger_manager.stat_loggers:
            logger.record(scheduler_stats=sched, iteration_stats=it, engine_idx=0)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: Any) -> None:
    """A process-wide hub of the test's own; no vLLM hook, no GPU polling."""
    monkeypatch.setattr(hub_module, "_default", None)
    monkeypatch.setattr(vllm_hook, "install", lambda: False)
    monkeypatch.setattr(vllm_hook, "installed", lambda: False)
    monkeypatch.setattr(gpu_source, "attach", lambda hub: None)


def test_a_second_engine_gets_a_hub_of_its_own_and_each_keeps_its_numbers() -> None:
    plain, spec = Engine("target"), Engine("target", k=4)
    first = instrument(plain)
    second = instrument(spec)
    plain.run_step(1, None)
    for _ in range(3):
        spec.run_step(1, 3)
    mine, theirs = first.snapshot(), second.snapshot()
    assert mine.lifetime.steps == 1 and mine.lifetime.spec is None and mine.engine.num_speculative_tokens is None
    assert theirs.lifetime.steps == 3 and theirs.engine.num_speculative_tokens == 4
    assert theirs.lifetime.spec is not None and theirs.lifetime.spec.accepted == 9
    assert theirs.lifetime.spec.mean_acceptance_length == 4  # its own, not diluted by the plain engine's steps
    assert mine.lifetime.generation_tokens == 1 and theirs.lifetime.generation_tokens == 3 * 4
    assert first is default_hub() and second is not first  # the process-wide hub stays the first engine's
    assert vllm_engine.engine_hub(None) is not first  # specscope.LLM's default, too


def test_a_hub_that_holds_another_engine_is_refused_in_one_line_and_its_engine_keeps_recording() -> None:
    plain, spec = Engine("target"), Engine("target", k=4)
    hub = instrument(plain, Hub())
    with pytest.raises(SpecscopeError, match=r"holds the numbers of another engine \(target\).*a hub of its own"):
        instrument(spec, hub)
    with pytest.raises(SpecscopeError, match="another engine"):
        vllm_engine.engine_hub(hub)  # specscope.LLM(..., specscope_hub=hub), before any model is loaded
    assert not spec.logger_manager.stat_loggers  # the refused engine was left as it was
    plain.run_step(2, None)
    assert hub.snapshot().lifetime.steps == 1
    # Moved to another hub and back (a measuring hub, then the engine's own): the same engine, never refused.
    other = instrument(plain, Hub())
    plain.run_step(2, None)
    assert instrument(plain, hub) is hub
    plain.run_step(2, None)
    assert hub.snapshot().lifetime.steps == 2 and other.snapshot().lifetime.steps == 1
    # Uninstrumented, the hub still holds its engine's numbers: another engine is refused there still.
    uninstrument(plain)
    with pytest.raises(SpecscopeError):
        instrument(spec, hub)


def test_the_plugin_on_a_second_engine_leaves_the_process_wide_hub_alone() -> None:
    """vLLM loads the stat-logger plugin into every ``AsyncLLM`` of the process: the second engine's must not write
    into (nor re-describe) the first engine's hub."""
    plain, spec = Engine("target"), Engine("target", k=4)
    SpecscopeStatLogger(plain.vllm_config, [0])
    logger = SpecscopeStatLogger(spec.vllm_config, [0])
    assert logger.hub is not default_hub()
    spec.logger_manager.stat_loggers.append(logger)
    spec.run_step(1, 3)
    snap = default_hub().snapshot()
    assert snap.engine.num_speculative_tokens is None and snap.lifetime.steps == 0

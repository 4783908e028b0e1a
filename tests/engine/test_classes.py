"""Acceptance by traffic class on a real engine: a class the draft predicts badly, which the aggregate hides.

The tiny target with its 10%-noise draft accepts anywhere from 3% to 95% of a request's drafts, depending on the
prompt (greedy text the draft happens to follow, or not). A first pass reads vLLM's own per-request numbers and
takes the prompts the draft predicts best as one class and the worst as another, in a mix whose engine-wide
acceptance stays above the weak-draft threshold (``tiny_models.split_by_acceptance``): the second class's alert
fires, the first's does not, the engine-wide weak-draft alert does not, and the per-class counts add up to vLLM's
own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specscope import Hub, tiny_models
from specscope.collectors import vllm_reader
from tests.conftest import ENGINE_KW, greedy, shutdown

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(48, seed=43)
TOKENS = 48


def vllm_counts(outputs: list[Any]) -> list[tuple[int, int]]:
    """(accepted, drafted) of each request, from vLLM's own per-request metrics."""
    out = []
    for o in outputs:
        steps = vllm_reader.per_step_counts(o.outputs[0].spec_decode_metrics)
        assert steps is not None
        out.append((sum(steps[0]), sum(steps[1])))
    return out


def test_a_class_the_draft_fails_on_alerts_while_the_engine_looks_healthy(tiny: dict[str, Path],
                                                                          engines: Any) -> None:
    import specscope
    from specscope.alerts.evaluate import Evaluator
    from specscope.alerts.rules import Thresholds

    engines.close()
    llm = specscope.LLM(str(tiny["target"]), specscope_hub=Hub(), **ENGINE_KW,
                        speculative_config={"method": "draft_model", "model": str(tiny["noise10"]),
                                            "num_speculative_tokens": 4})
    try:
        easy, hard = tiny_models.split_by_acceptance(llm, PROMPTS, TOKENS)
        assert len(hard) >= 2, "the draft's acceptance does not vary enough by prompt here"
        llm.specscope.reset_window()
        outputs = {"easy": llm.generate(easy, greedy(TOKENS), use_tqdm=False, specscope_class="easy"),
                   "hard": llm.generate(hard, greedy(TOKENS), use_tqdm=False, specscope_class="hard")}
        snap = llm.snapshot()
        classes = {c.name: c for c in snap.classes}
        engine = snap.window.spec
        assert engine is not None and engine.acceptance_rate > 0.3  # type: ignore[operator]
        for name, outs in outputs.items():
            counts = vllm_counts(outs)
            cls = classes[name]
            # The class's counts are vLLM's own per-request numbers, summed.
            assert (cls.window.accepted, cls.window.draft_tokens) == (sum(a for a, _ in counts),
                                                                      sum(d for _, d in counts)), name
            assert cls.window.requests == len(outs) == cls.lifetime.requests
        assert classes["hard"].window.acceptance_rate < 0.3 < classes["easy"].window.acceptance_rate
        # The classes add up to the engine's own counters (vLLM's, through the stat logger).
        assert sum(c.window.draft_tokens for c in classes.values()) == engine.draft_tokens
        assert sum(c.window.accepted for c in classes.values()) == engine.accepted
        print({n: (c.window.acceptance_rate, c.window.draft_tokens) for n, c in classes.items()},
              engine.acceptance_rate)
        # The class alert fires for the hard class only; the engine-wide one does not fire at all.
        alerts = Evaluator(llm.specscope, thresholds=Thresholds(weak_draft_for_s=0)).evaluate(snap)
        firing = {(a.rule, dict(a.labels).get("traffic_class")) for a in alerts if a.state == "firing"}
        assert ("SpecscopeWeakDraftForClass", "hard") in firing, firing
        assert not any(r == "SpecscopeWeakDraftForClass" and c != "hard" for r, c in firing), firing
        assert not any(r == "SpecscopeWeakDraft" for r, _ in firing), firing
    finally:
        shutdown(llm)

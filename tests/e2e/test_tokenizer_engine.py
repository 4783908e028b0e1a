"""Tokenizer mismatch on a real engine: caught where vLLM is silent; vLLM's own error passed on where it is not."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from specscope import Hub, tiny_models
from tests.conftest import ENGINE_KW, greedy, spec_config

pytestmark = pytest.mark.engine


def test_same_size_other_tokenizer_runs_silently_in_vllm_and_is_flagged(tiny: Any, engines: Any,
                                                                        caplog: Any) -> None:
    import specscope
    from specscope.export.endpoint import Endpoint

    engines.close()
    hub = Hub()
    with caplog.at_level(logging.WARNING, logger="specscope"):
        llm = engines.get("other-tokenizer", lambda: specscope.LLM(
            str(tiny["target"]), speculative_config=spec_config(tiny, "other-tokenizer"), specscope_hub=hub,
            **ENGINE_KW))
    llm.generate(tiny_models.prompts(6, seed=2), greedy(32), use_tqdm=False)  # vLLM runs it without a word
    snap = hub.snapshot()
    assert snap.tokenizer is not None and snap.tokenizer.verdict == "mismatch"
    assert any("different ids" in r for r in snap.tokenizer.reasons)
    assert any("does not match the target's" in r.getMessage() for r in caplog.records)
    assert snap.window.spec is not None and snap.window.spec.acceptance_rate < 0.3  # the consequence
    # The alert matrix's mismatch scenario: the critical tokenizer alert, and the acceptance it ruins (weak, or a
    # collapse when about nothing is accepted); nothing else (the verdict's own alert left out: these same-size
    # drafts cannot pay whatever their tokenizer).
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import RULES, Thresholds

    ev = Evaluator(hub, rules=[r for r in RULES if r.name != "SpecscopeSpeculationNotPaying"],
                   thresholds=Thresholds(weak_draft_for_s=0, collapse_for_s=0))
    fired = {a.rule for a in ev.evaluate() if a.state == "firing"}
    length = snap.window.spec.mean_acceptance_length
    consequence = ("SpecscopeAcceptanceCollapse" if length is not None and length <= Thresholds().collapse_length
                   else "SpecscopeWeakDraft")
    assert fired == {"SpecscopeTokenizerMismatch", consequence}, (fired, length)
    endpoint = Endpoint(hub.snapshot, port=0)
    try:
        import httpx

        text = httpx.get(f"{endpoint.url}/metrics", timeout=10).text
        assert 'specscope_tokenizer_verdict{' in text and 'state="mismatch"} 1.0' in text
        assert 'state="identical"} 0.0' in text and "specscope_tokenizer_overlap_ratio{" in text
    finally:
        endpoint.close()


def test_other_vocabulary_size_gives_vllms_error_after_specscopes_explanation(tiny: Any, engines: Any,
                                                                              caplog: Any) -> None:
    import vllm

    import specscope

    engines.close()
    kw = {"speculative_config": spec_config(tiny, "other-vocab"), **ENGINE_KW}
    with pytest.raises(Exception) as theirs:
        vllm.LLM(str(tiny["target"]), **kw)
    with caplog.at_level(logging.WARNING, logger="specscope"), pytest.raises(Exception) as ours:
        specscope.LLM(str(tiny["target"]), specscope_hub=Hub(), **kw)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert "vocab" in str(ours.value).lower()
    assert any("vocabulary sizes differ" in r.getMessage() for r in caplog.records)

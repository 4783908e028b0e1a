"""A plain and a speculative engine side by side in one process, made as a new user makes them (no hub given, vLLM's
default process layout): each snapshot holds its own engine's numbers, never a mix of both."""

from __future__ import annotations

import time
from typing import Any

import pytest

from specscope import tiny_models
from tests.conftest import ENGINE_KW, greedy, shutdown, spec_config, vllm_counters

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("user_layout")]
PROMPTS = tiny_models.prompts(4, seed=31)


def test_a_plain_and_a_speculative_engine_keep_their_numbers_apart(tiny: Any, engines: Any, monkeypatch: Any) -> None:
    import specscope
    from specscope.state import hub as hub_module

    engines.close()  # two cores: these two engines only
    monkeypatch.setattr(hub_module, "_default", None)  # a process-wide hub no earlier engine of the session holds
    plain = specscope.LLM(str(tiny["target"]), **ENGINE_KW)
    spec = specscope.LLM(str(tiny["target"]), speculative_config=spec_config(tiny, "copy"),
                         disable_log_stats=False, **ENGINE_KW)  # vLLM's own counters kept, to compare with
    try:
        assert plain.specscope is specscope.default_hub() and spec.specscope is not plain.specscope
        wall = {"plain": 0.0, "spec": 0.0}
        for prompt in PROMPTS:  # alternately, one request at a time
            for name, llm in (("plain", plain), ("spec", spec)):
                t0 = time.perf_counter()
                llm.generate([prompt], greedy(48), use_tqdm=False)
                wall[name] += time.perf_counter() - t0
        mine, theirs = plain.snapshot(), spec.snapshot()
        counters = vllm_counters(spec)
        assert mine.lifetime.spec is None and mine.engine.num_speculative_tokens is None
        assert mine.lifetime.requests == theirs.lifetime.requests == len(PROMPTS)
        life = theirs.lifetime.spec
        assert life is not None and life.accepted == counters["spec_decode_num_accepted_tokens"]
        # Tokens a request gains per decode step at batch 1: exactly 1 for the plain engine; for the speculative one
        # vLLM's mean acceptance length (1 + accepted / drafts), less what a request's last step drafted past
        # max_tokens (4.7 against 5.0 here); a mix of both engines' steps would read about 1.6.
        vllm_length = 1 + counters["spec_decode_num_accepted_tokens"] / counters["spec_decode_num_drafts"]
        rows = {name: next(t for t in snap.lifetime.step_times.times if t.batch_size == 1)
                for name, snap in (("plain", mine), ("spec", theirs))}
        assert rows["plain"].tokens_per_request_step == 1
        assert rows["spec"].tokens_per_request_step == pytest.approx(vllm_length, rel=0.1)
        # Each engine's step times add up to the time its own requests ran (measured 2.132 s against 2.128 s: a
        # millisecond a request between the engine core's timestamps and this process's clock), not to both's.
        for name, snap in (("plain", mine), ("spec", theirs)):
            busy = sum(t.steps * t.mean_s + t.prefill_s for t in snap.lifetime.step_times.times)
            assert 0 < busy <= 1.05 * wall[name], (name, busy, wall)
    finally:
        shutdown(spec)
        shutdown(plain)

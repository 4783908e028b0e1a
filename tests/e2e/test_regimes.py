"""The regimes users run, on one real engine: prefix caching and chunked prefill on (vLLM's defaults), prompts
longer than the prefill chunk, n > 1, and a KV cache small enough that requests are preempted. Whatever the
regime, the per-request records (complete from the engine through the output-processor hook) add up exactly to
vLLM's own engine counters; the KV token estimate is withheld, with the reason, while prefixes are shared."""

from __future__ import annotations

from typing import Any

import pytest

from specscope import Hub, tiny_models
from tests.conftest import ENGINE_KW, greedy, spec_config, vllm_counters

pytestmark = pytest.mark.engine

#: 6 blocks of 128 tokens: two or three requests at a time; the rest wait, and running ones get preempted.
REGIMES = {**ENGINE_KW, "num_gpu_blocks_override": 6, "long_prefill_token_threshold": 32,
           "enable_prefix_caching": True, "enable_chunked_prefill": True, "disable_log_stats": False}


def test_per_request_numbers_add_up_to_the_engine_in_every_regime(tiny: Any, engines: Any) -> None:
    from vllm import SamplingParams

    import specscope

    llm = engines.get("regimes", lambda: specscope.LLM(str(tiny["target"]), specscope_hub=Hub(),
                                                       speculative_config=spec_config(tiny, "noise2"), **REGIMES))
    # A common prefix longer than a block (128 tokens on CPU), cached by a first request before the others come.
    shared = " ".join(tiny_models.prompts(6, seed=50))  # ~200 tokens
    assert len(llm.get_tokenizer().encode(shared)) > llm.llm_engine.vllm_config.cache_config.block_size
    long_prompts = [" ".join(tiny_models.prompts(6, seed=51 + i, min_words=30, max_words=40)) for i in range(3)]
    short = tiny_models.prompts(6, seed=52)
    prompts = [f"{shared} {short[5]}"]
    llm.generate(prompts, greedy(8), use_tqdm=False)
    batch = [f"{shared} {p}" for p in short[:4]] + long_prompts + short
    prompts += batch
    llm.generate(batch, greedy(96), use_tqdm=False)
    # n > 1 samples (vLLM 0.32 refuses n > 1 with greedy decoding; a per-request seed crashes speculative decoding
    # on CPU: "CPU Generator does not use offset"), each sample its own record.
    llm.generate(short[:2], SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True, n=2),
                 use_tqdm=False)
    snap = llm.snapshot()
    vllm = vllm_counters(llm)

    # Every request is a complete record (speculative numbers from the engine), n=2 samples each their own.
    records = [r for r in snap.requests if r.final_seq]
    assert len(records) == len(prompts) + 2 * 2
    assert all(r.draft_tokens is not None and r.spec_steps is not None for r in records)
    samples = sorted(r.request_id.rsplit("#", 1)[1] for r in records if "#" in r.request_id)
    assert samples == ["0", "0", "1", "1"]
    # Their sums are vLLM's engine counters, exactly.
    assert sum(r.draft_tokens or 0 for r in records) == vllm["spec_decode_num_draft_tokens"]
    assert sum(r.accepted_tokens or 0 for r in records) == vllm["spec_decode_num_accepted_tokens"]
    assert sum(r.spec_steps or 0 for r in records) == vllm["spec_decode_num_drafts"]
    assert snap.attributed is not None and snap.unattributed_draft_tokens == 0  # nothing in flight, none aborted
    life = snap.lifetime
    assert life.spec is not None and life.spec.draft_tokens == vllm["spec_decode_num_draft_tokens"]
    assert life.generation_tokens == vllm["generation_tokens"] == sum(r.generation_tokens or 0 for r in records)
    # The regimes happened: preemptions (counted as vLLM counts them), prefix-cache hits, chunked prompts.
    assert life.preemptions == vllm["num_preemptions"] > 0
    assert life.prefix_cache_hits == vllm["prefix_cache_hits"] > 0
    assert sum(t.prefill_steps for t in life.step_times.times) > len(prompts)  # more prefill steps than prompts
    # With prefixes shared in the window, the token estimate is withheld and says why, never a silent 0.
    assert snap.kv.not_estimable and snap.kv.token_usage is None and snap.kv.fragmentation is None


def test_kv_pressure_fires_its_alerts_and_nothing_else(tiny: Any, engines: Any) -> None:
    """The alert matrix's pressure scenario, on the same engine (6 blocks): every rule but the speedup verdict,
    evaluated at every step while requests are preempted. A full cache with preemptions fires KVCachePressure;
    this same-size draft, whose own KV layers take half of every block, DraftCrowdsKVCache; and fragmentation,
    which is real here: vLLM's 128-token CPU blocks take ~100-token prompts in 32-token chunks, so at full block
    usage 65-80% of the slots are empty (e.g. 4 requests, 5 blocks, 132 tokens; the estimate is checked against
    the block manager in test_kv_estimate.py). Nothing else."""
    import specscope
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import RULES, Thresholds

    llm = engines.get("regimes", lambda: specscope.LLM(str(tiny["target"]), specscope_hub=Hub(),
                                                       speculative_config=spec_config(tiny, "noise2"), **REGIMES))
    hub, original = Hub(), llm.specscope
    specscope.instrument(llm, hub)
    try:
        ev = Evaluator(hub, rules=[r for r in RULES if r.name != "SpecscopeSpeculationNotPaying"],
                       thresholds=Thresholds(kv_pressure_for_s=0, weak_draft_for_s=0, collapse_for_s=0,
                                             fragmentation_for_s=0))
        prompts = [" ".join(tiny_models.prompts(4, seed=60 + i, min_words=20, max_words=30)) for i in range(8)]
        llm.enqueue(prompts, greedy(160), use_tqdm=False)
        engine = llm.llm_engine
        fired: set[str] = set()
        while engine.has_unfinished_requests():
            engine.step()
            fired |= {a.rule for a in ev.evaluate() if a.state == "firing"}
        assert hub.snapshot().lifetime.preemptions > 0
        assert fired == {"SpecscopeKVCachePressure", "SpecscopeDraftCrowdsKVCache",
                         "SpecscopeKVCacheFragmentation"}, fired
    finally:
        specscope.instrument(llm, original)

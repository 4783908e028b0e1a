"""The KV token-usage estimate against the truth read from the engine's own block manager.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the scheduler's requests and block
pool can be read after every step. A small cache (40 blocks of 128 tokens) and prompts of very different lengths
make both usage and fragmentation large enough to matter.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from specscope import Hub
from tests.conftest import ENGINE_KW, greedy, spec_config

pytestmark = pytest.mark.engine

NUM_BLOCKS = 40


@pytest.fixture(scope="module")
def inproc(tiny: Any, engines: Any) -> Any:
    import specscope

    def make() -> tuple[Any, Hub]:
        mp = pytest.MonkeyPatch()
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            hub = Hub()
            llm = specscope.LLM(
                str(tiny["target"]),
                speculative_config=spec_config(tiny, "copy"),
                num_gpu_blocks_override=NUM_BLOCKS,
                enable_prefix_caching=False,
                specscope_hub=hub,
                **ENGINE_KW,
            )
        finally:
            mp.undo()
        return llm, hub

    return engines.get("kv-inproc", make)


def truth(llm: Any) -> tuple[float, float, int]:
    """(token usage, block usage, requests running) from the scheduler and its block pool."""
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    cache = llm.llm_engine.vllm_config.cache_config
    slots = (cache.num_gpu_blocks - 1) * cache.block_size
    held = sum(r.num_computed_tokens for r in sched.running)
    return held / slots, sched.kv_cache_manager.block_pool.get_usage(), len(sched.running)


def test_token_usage_estimate_within_5_points_of_the_block_manager(inproc: Any) -> None:
    llm, hub = inproc
    rng = random.Random(5)
    tok = llm.get_tokenizer()
    words = ["stone", "river", "light", "garden", "engine", "token", "draft", "model", "cache", "block"]
    # Prompt lengths from a few tokens to ~300, so last blocks are filled very unevenly.
    prompts = [" ".join(rng.choices(words, k=rng.randint(1, 100))) for _ in range(12)]
    lengths = [len(tok.encode(p)) for p in prompts]
    assert max(lengths) > 5 * min(lengths) and max(lengths) > 150, lengths
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import BY_RULE, Thresholds

    rule = BY_RULE["SpecscopeKVCacheFragmentation"]
    evaluators = {level: Evaluator(hub, rules=[rule], thresholds=Thresholds(
        fragmentation=level, fragmentation_min_block_usage=0.0, fragmentation_for_s=0, keep_firing_for_s=0))
        for level in (0.15, 0.95)}  # any block usage: this test is about the estimate
    fired = dict.fromkeys(evaluators, False)
    llm.enqueue(prompts, greedy(96), use_tqdm=False)
    engine = llm.llm_engine
    rows = []
    while engine.has_unfinished_requests():
        engine.step()
        snap = hub.snapshot()
        kv = snap.kv
        for level, ev in evaluators.items():
            ev.evaluate(snap)
            firing = any(a.state == "firing" for a in ev.active())
            assert firing == (kv.fragmentation is not None and kv.fragmentation > level), (level, kv.fragmentation)
            fired[level] |= firing
        true_tokens, true_blocks, running = truth(llm)
        if running:
            rows.append((kv.token_usage, true_tokens, kv.block_usage, true_blocks, kv.fragmentation))
    assert len(rows) > 10
    assert max(r[1] for r in rows) > 0.3  # the workload really fills the cache
    for est, real, blocks, real_blocks, _ in rows:
        assert abs(est - real) <= 0.05, (est, real)
        assert blocks == pytest.approx(real_blocks)  # block usage is the engine's own number
    # Fragmentation is real and measured: partly filled last blocks and draft look-ahead slots.
    frag = [r[4] for r in rows]
    true_frag = [1 - r[1] / r[3] for r in rows]
    assert max(frag) > 0.1
    for f, t in zip(frag, true_frag, strict=True):
        assert abs(f - t) <= 0.1
    assert fired == {0.15: True, 0.95: False}  # the alert fires above its threshold only
    snap = hub.snapshot()
    assert snap.kv.tokens_held == 0 and snap.kv.block_usage == 0.0

"""The draft's cost in KV capacity (bytes from configs, blocks by conservation of memory, the rule on pressure);
torch's allocator holding idle memory on a full GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specscope.core.memory import draft_kv_cost
from specscope.core.model import AllocatorStats, DraftMemory, EngineInfo, GpuDevice, GpuMemory
from specscope.engine.vllm_config import draft_memory, draft_memory_note, engine_info
from specscope.export.alerts.evaluate import Evaluator
from specscope.export.alerts.rules import BY_RULE, Thresholds
from specscope.state.hub import Hub, StepStats

GiB = 1 << 30


def llama(layers: int, hidden: int = 4096, heads: int = 32, kv_heads: int = 8) -> dict[str, int]:
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "intermediate_size": 14336, "vocab_size": 128256}


def vllm_config(draft: dict[str, int] | None, method: str = "draft_model", device: str = "cuda",
                cache_dtype: str = "auto") -> SimpleNamespace:
    import torch

    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=llama(32), dtype=torch.bfloat16),
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=16),
        device_config=SimpleNamespace(device_type=device),
        speculative_config=SimpleNamespace(method=method, draft_model_config=SimpleNamespace(hf_config=draft)))


def test_bytes_come_from_the_configs_and_dtypes() -> None:
    # Llama-3-8B-shaped target, a 1B-shaped draft of 16 layers: KV per token 2 x 8 heads x 128 x 2 bytes per layer.
    mem = draft_memory(vllm_config(llama(16, hidden=2048, heads=32, kv_heads=8)))
    assert mem is not None
    assert mem.target_kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert mem.draft_kv_bytes_per_token == 16 * 2 * 8 * 64 * 2
    layer = 2048 * (2048 + 2 * 512 + 2048) + 3 * 2048 * 14336  # q, k, v, o (GQA 32/8, head 64) and the MLP
    assert mem.draft_weight_bytes == (16 * layer + 2 * 128256 * 2048) * 2  # + embeddings and LM head, bf16
    fp8 = draft_memory(vllm_config(llama(16, hidden=2048), cache_dtype="fp8"))
    assert fp8 is not None and fp8.target_kv_bytes_per_token == mem.target_kv_bytes_per_token // 2
    cpu = draft_memory(vllm_config(llama(16, hidden=2048), device="cpu"))
    assert cpu is not None and cpu.draft_weight_bytes == 0  # the CPU KV cache has a fixed size
    eagle3 = draft_memory(vllm_config(llama(1), method="eagle3"))
    assert eagle3 is not None and eagle3.draft_kv_bytes_per_token == mem.target_kv_bytes_per_token // 32
    assert draft_memory(vllm_config(None, method="ngram")) is None


def test_a_kv_dtype_of_unknown_size_is_named_not_silent() -> None:
    from specscope.export.summary import summary

    octave = vllm_config(llama(16, hidden=2048), cache_dtype="octave_k3v4")  # vLLM 0.33's new KV cache dtypes
    assert draft_memory(octave) is None
    assert draft_memory_note(octave) == ("KV cache dtype octave_k3v4 has no size specscope knows: the draft's KV "
                                         "cost is not estimated")
    hub = Hub()
    hub.set_engine(engine_info(octave))
    assert "memory   KV cache dtype octave_k3v4 has no size" in summary(hub.snapshot())
    quantized = vllm_config(llama(16, hidden=2048))
    quantized.speculative_config.draft_lm_head_quantization = "fp8"
    assert draft_memory(quantized) is not None
    assert draft_memory_note(quantized) == ("draft LM head quantized (fp8): the draft's weights are counted "
                                            "unquantized (upper bound)")
    assert draft_memory_note(vllm_config(llama(16, hidden=2048), cache_dtype="fp8")) is None
    assert draft_memory_note(vllm_config(None, method="ngram", cache_dtype="octave_k3v4")) is None  # no draft


@pytest.mark.parametrize(("v2", "runner"), [(True, "v2"), (False, "v1")])
def test_the_model_runner_is_part_of_the_setup_a_baseline_is_checked_against(v2: bool, runner: str) -> None:
    from specscope.core.model import EngineSetup

    cfg = vllm_config(llama(16, hidden=2048))
    cfg.use_v2_model_runner = v2
    setup = engine_info(cfg).setup
    assert setup is not None and setup.model_runner == runner
    assert engine_info(vllm_config(llama(16, hidden=2048))).setup.model_runner is None  # type: ignore[union-attr]
    other = "v1" if runner == "v2" else "v2"
    assert setup.differences(EngineSetup(model_runner=other)) == [f"model runner {runner} vs {other}"]


def test_blocks_lost_conserve_memory() -> None:
    mem = DraftMemory(draft_weight_bytes=3 * GiB, target_kv_bytes_per_token=131072, draft_kv_bytes_per_token=32768)
    blocks, size = 10_000, 16
    kv_bytes = blocks * size * (131072 + 32768)  # what the KV cache holds with the draft
    without = (kv_bytes + 3 * GiB) / (size * 131072)  # the same memory, target-only blocks
    assert mem.blocks_lost(blocks, size) == pytest.approx(without - blocks)
    assert mem.capacity_share(blocks, size) == pytest.approx((without - blocks) / without)


def pressured(usage: float, draft: DraftMemory) -> Hub:
    hub = Hub()
    hub.set_engine(EngineInfo(model="m", draft_model="d", method="draft_model", num_speculative_tokens=4,
                              block_size=16, num_blocks=1001, draft_memory=draft))
    hub.record_step(StepStats(running=8, waiting=3, kv_usage=usage, prompt_tokens=8 * 1000))
    return hub


@pytest.mark.parametrize(("usage", "draft_kv", "fires"), [
    (0.95, 32768, True),  # a draft taking 20% of the capacity while blocks run short
    (0.50, 32768, False),  # the same draft, blocks to spare: preallocation by design is not a finding
    (0.95, 1024, False),  # short of blocks, but the draft costs under 1%
])
def test_the_rule_fires_only_when_a_costly_draft_meets_pressure(usage: float, draft_kv: int, fires: bool) -> None:
    hub = pressured(usage, DraftMemory(0, 131072, draft_kv))
    cost = draft_kv_cost(hub.snapshot())
    assert cost is not None and cost.share == pytest.approx(draft_kv / (131072 + draft_kv))
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeDraftCrowdsKVCache"]], thresholds=Thresholds(kv_pressure_for_s=0))
    fired = ev.evaluate()
    assert len(fired) == int(fires)
    if fires:  # the evidence: blocks, share and the sequences of the observed length they would hold
        assert f"the draft takes {cost.blocks:.0f} KV blocks (20.0% of the capacity)" in fired[0].description
        assert "concurrent sequences of" in fired[0].description


@pytest.mark.parametrize(("reserved", "allocated", "used", "fires"), [
    (30, 18, 0.96, True),  # 12 GiB (40%) idle on a full GPU
    (30, 18, 0.50, False),  # as idle, with room on the GPU: the cache is doing its job
    (30, 28, 0.96, False),  # 7% idle
    (1, 0.2, 0.96, False),  # 80% idle, but 0.8 GiB
])
def test_allocator_fragmentation_fires_only_when_idle_memory_meets_a_full_gpu(reserved: float, allocated: float,
                                                                              used: float, fires: bool) -> None:
    gib = 1 << 30
    hub = Hub()
    memory = GpuMemory(status="ok", devices=(GpuDevice(0, "H100", int(used * 80 * gib), 80 * gib),),
                       allocator=(AllocatorStats(0, int(allocated * gib), int(reserved * gib), 0),),
                       allocator_status="ok")
    hub.add_gpu_source("gpu", lambda: memory)
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeAllocatorFragmentation"]], thresholds=Thresholds(allocator_for_s=0))
    fired = ev.evaluate()
    assert len(fired) == int(fires)
    if fires:
        assert "GPU 0: torch reserves 30.0 GiB, allocates 18.0 GiB: 12.0 GiB (40%) idle; device 96% used" in \
            fired[0].description


def test_allocator_fragmentation_is_quiet_without_torch_in_this_process() -> None:
    hub = Hub()
    memory = GpuMemory(status="ok", devices=(GpuDevice(0, "H100", int(0.99 * 80 * (1 << 30)), 80 * (1 << 30)),),
                       allocator_status="torch not loaded in this process")
    hub.add_gpu_source("gpu", lambda: memory)
    ev = Evaluator(hub, rules=[BY_RULE["SpecscopeAllocatorFragmentation"]], thresholds=Thresholds(allocator_for_s=0))
    assert ev.evaluate() == []

"""Model sizes from configs, against the parameters of the real modules (built on the meta device: no memory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specscope.core.sizing import architecture, draft_size, model_size
from specscope.verdict import cost_ratio_from_sizes


def module_params(cfg: Any) -> tuple[int, int]:
    """(all parameters except norms, parameters of the input embedding) of the Hugging Face model for ``cfg``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = {n: p.numel() for n, p in model.named_parameters()}
    weights = sum(v for n, v in params.items() if "norm" not in n and "e_score_correction_bias" not in n)
    embed = sum(v for n, v in params.items() if n.endswith("embed_tokens.weight"))
    return weights, embed


def small(cls: Any, **kw: Any) -> Any:
    base = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 160}
    return cls(**{**base, **kw})


def test_dense_llama_matches_its_module() -> None:
    from transformers import LlamaConfig

    cfg = small(LlamaConfig, tie_word_embeddings=False)
    weights, embed = module_params(cfg)
    size = model_size(cfg)
    assert size is not None and size.weights == weights
    assert size.per_token == weights - embed  # the embedding is a lookup, not a matrix product


def test_tied_embeddings_are_counted_once() -> None:
    from transformers import LlamaConfig

    cfg = small(LlamaConfig, tie_word_embeddings=True)
    weights, _ = module_params(cfg)
    assert model_size(cfg).weights == weights  # type: ignore[union-attr]


def test_mixture_of_experts_counts_active_experts_per_token() -> None:
    from transformers import MixtralConfig

    cfg = small(MixtralConfig, num_local_experts=8, num_experts_per_tok=2)
    weights, embed = module_params(cfg)
    size = model_size(cfg)
    assert size is not None and size.weights == weights
    expert = 3 * 64 * 160
    assert size.per_token == weights - embed - 3 * (8 - 2) * expert  # six idle experts in each of three layers


def test_deepseek_latent_attention_shared_experts_and_dense_first_layers() -> None:
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=4, intermediate_size=160, moe_intermediate_size=32,
                           n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                           q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                           n_group=1, topk_group=1)
    weights, embed = module_params(cfg)
    size = model_size(cfg)
    assert size is not None and size.weights == weights
    assert size.per_token == weights - embed - 2 * (8 - 2) * 3 * 64 * 32  # two MoE layers, six idle experts each


def test_tiny_model_configs_match_their_weights(tiny: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    for name in ("target", "independent", "deep01-target", "deep01-draft"):
        tensors = load_file(tiny[name] / "model.safetensors")
        weights = sum(t.numel() for n, t in tensors.items() if "norm" not in n)
        cfg = json.loads((tiny[name] / "config.json").read_text())  # a plain dict works as well as a config
        assert model_size(cfg).weights == weights, name  # type: ignore[union-attr]
    assert "layers=12 hidden=512" in (architecture(json.loads((tiny["deep01-target"] / "config.json").read_text()))
                                      or "")


def llama8b() -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}


def test_eagle_heads_are_one_layer_plus_their_projection() -> None:
    layer = 4096 * 128 * (32 + 16) + 32 * 128 * 4096 + 3 * 4096 * 14336  # attention + gated MLP of Llama-3-8B
    eagle = draft_size("eagle", {**llama8b(), "num_hidden_layers": 1}, llama8b())
    assert eagle is not None
    assert eagle.weights == layer + 2 * 4096 * 4096  # ~0.25B, as published for EAGLE-LLaMA3-Instruct-8B
    assert eagle.per_token == eagle.weights + 128256 * 4096  # it runs the target's LM head
    eagle3 = draft_size("eagle3", {**llama8b(), "num_hidden_layers": 1, "draft_vocab_size": 32000}, llama8b())
    assert eagle3 is not None
    qkv_from_2h = 8192 * 128 * (32 + 16) + 32 * 128 * 4096
    assert eagle3.weights == qkv_from_2h + 3 * 4096 * 14336 + 3 * 4096 * 4096 + 32000 * 4096
    target = model_size(llama8b())
    c = cost_ratio_from_sizes(target, eagle, "eagle")
    head = 128256 * 4096
    assert c is not None and c.value == pytest.approx((layer + 2 * 4096 * 4096 + head) / (32 * layer + head))
    assert c.draft_weight_share == pytest.approx(eagle.weights / (target.weights + eagle.weights))  # type: ignore[union-attr]


def test_mtp_runs_one_target_shaped_layer_per_draft_token() -> None:
    from transformers import DeepseekV3Config

    v3 = DeepseekV3Config(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=4, intermediate_size=160, moe_intermediate_size=32, n_routed_experts=8,
                          num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=48,
                          kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=1,
                          topk_group=1)
    weights, embed = module_params(v3)
    dense_cfg = DeepseekV3Config(**{**v3.to_dict(), "num_hidden_layers": 1, "first_k_dense_replace": 1})
    dense_weights, _ = module_params(dense_cfg)
    one_moe_layer = (weights - dense_weights) // 2
    mtp_cfg = {**v3.to_dict(), "model_type": "deepseek_mtp", "n_predict": 1}
    mtp = draft_size("mtp", mtp_cfg, v3)
    assert mtp is not None
    assert mtp.weights == one_moe_layer + 2 * 64 * 64
    expert = 3 * 64 * 32
    assert mtp.per_token == one_moe_layer - (8 - 2) * expert + 2 * 64 * 64 + 1000 * 64
    assert embed == 1000 * 64


def test_model_free_methods_and_unreadable_configs_have_no_size() -> None:
    assert draft_size("ngram", None, llama8b()) is None
    assert draft_size("suffix", llama8b(), llama8b()) is None
    assert model_size({"hidden_size": 64}) is None
    assert cost_ratio_from_sizes(model_size(llama8b()), None, "draft_model") is None

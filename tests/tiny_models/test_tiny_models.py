"""The tiny model family: deterministic, offline, and each draft what it claims to be."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from specscope import tiny_models
from specscope.tiny_models.models import deep_pair


def digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_family_and_properties(tiny: dict[str, Path]) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    assert set(tiny) == set(tiny_models.MODELS) and {"target", *tiny_models.DRAFTS} <= set(tiny)
    target_tok = AutoTokenizer.from_pretrained(tiny["target"])
    assert len(target_tok) == tiny_models.VOCAB_SIZE
    assert digest(tiny["copy"]) == digest(tiny["target"])
    w_t = load_file(tiny["target"] / "model.safetensors")
    for name, frac in (("noise2", 0.02), ("noise10", 0.10)):
        w = load_file(tiny[name] / "model.safetensors")
        key = "model.layers.0.mlp.up_proj.weight"
        ratio = float((w[key] - w_t[key]).std() / w_t[key].std())
        assert ratio == pytest.approx(frac, rel=0.05)
    assert AutoConfig.from_pretrained(tiny["independent"]).num_hidden_layers == 1
    other = AutoTokenizer.from_pretrained(tiny["other-tokenizer"])
    assert len(other) == tiny_models.VOCAB_SIZE  # same size, so vLLM accepts it ...
    va, vb = target_tok.get_vocab(), other.get_vocab()
    assert sum(va[t] != vb.get(t) for t in va) > len(va) // 2  # ... but the ids mean other tokens
    assert AutoConfig.from_pretrained(tiny["other-vocab"]).vocab_size == tiny_models.SMALL_VOCAB_SIZE


def test_the_deep_family_draft_is_exactly_its_targets_first_layer(tiny: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    for name, factor in tiny_models.DEEP.items():
        target = load_file(tiny[f"{name}-target"] / "model.safetensors")
        draft = load_file(tiny[f"{name}-draft"] / "model.safetensors")
        assert set(draft) == {k for k in target if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
        assert all(bool((draft[k] == target[k]).all()) for k in draft)  # the same weights, not a noisy copy
        # Every later layer writes into the residual stream scaled by the factor.
        unscaled = deep_pair(1.0)[0].state_dict()
        key = "model.layers.5.mlp.down_proj.weight"
        assert float((target[key] / unscaled[key]).mean()) == pytest.approx(factor, rel=1e-5)
        assert target["model.layers.0.mlp.down_proj.weight"].equal(unscaled["model.layers.0.mlp.down_proj.weight"])


def test_build_is_deterministic(tiny: dict[str, Path], tmp_path: Path) -> None:
    again = tiny_models.build(tmp_path / "family")
    for name in ("target", "noise10", "other-tokenizer"):
        assert digest(again[name]) == digest(tiny[name])
        assert (again[name] / "tokenizer.json").read_bytes() == (tiny[name] / "tokenizer.json").read_bytes()


def test_prompts_are_deterministic_and_varied() -> None:
    a: Any = tiny_models.prompts(20, seed=4)
    assert a == tiny_models.prompts(20, seed=4) and a != tiny_models.prompts(20, seed=5)
    assert len({len(p.split()) for p in a}) > 5


def test_the_eagle3_heads_are_their_targets_layer_0_in_vllms_eagle3_format(tiny: dict[str, Path]) -> None:
    import json

    import torch
    from safetensors.torch import load_file

    for name in tiny_models.EAGLE3:
        cfg = json.loads((tiny[f"{name}-eagle3"] / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
        assert cfg["norm_before_residual"] and cfg["num_attention_heads"] == 16
        head = load_file(tiny[f"{name}-eagle3"] / "model.safetensors")
        target = load_file(tiny[f"{name}-target"] / "model.safetensors")
        assert not head["midlayer.hidden_norm.weight"].any() and not head["fc.weight"].any()  # hidden states unused
        q = head["midlayer.self_attn.q_proj.weight"]
        assert q.shape == (1024, 1024) and q[:512, :512].equal(target["model.layers.0.self_attn.q_proj.weight"])
        assert not q[:, 512:].any()  # the hidden-state half of the input is weighted zero
        assert head["midlayer.mlp.down_proj.weight"].equal(target["model.layers.0.mlp.down_proj.weight"])
        assert head["lm_head.weight"].equal(target["lm_head.weight"])
        # Heads 8-15 carry the embedding: identity values, output scaled back to the embeddings' size.
        v = head["midlayer.self_attn.v_proj.weight"]
        assert v[512:, :512].equal(torch.eye(512))


def test_the_eagle_head_is_its_targets_layer_0_in_vllms_eagle_format(tiny: dict[str, Path]) -> None:
    import json

    import torch
    from safetensors.torch import load_file

    name = tiny_models.EAGLE
    cfg = json.loads((tiny[f"{name}-eagle"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1  # vLLM: EagleLlama...
    head = load_file(tiny[f"{name}-eagle"] / "model.safetensors")
    target = load_file(tiny[f"{name}-target"] / "model.safetensors")
    assert "lm_head.weight" not in head and "layers.0.input_layernorm.weight" not in head  # the target's; none
    fc = head["fc.weight"]
    assert fc.shape == (512, 1024) and fc[:, :512].equal(torch.eye(512)) and not fc[:, 512:].any()
    embed = target["model.embed_tokens.weight"]
    rms = float(embed.pow(2).mean(-1).sqrt().mean())
    q = head["layers.0.self_attn.q_proj.weight"]
    assert torch.allclose(q * rms, target["model.layers.0.self_attn.q_proj.weight"], atol=1e-6)  # norm folded in
    assert head["layers.0.mlp.down_proj.weight"].equal(target["model.layers.0.mlp.down_proj.weight"])
    assert head["embed_tokens.weight"].equal(embed) and (target["model.norm.weight"] == 1).all()


def test_the_mtp_model_is_the_deep_target_with_its_layer_0_as_the_mtp_layer(tiny: dict[str, Path]) -> None:
    import json

    from safetensors.torch import load_file

    mimo = tiny[f"{tiny_models.MTP}-mimo"]
    cfg = json.loads((mimo / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    w = load_file(mimo / "model.safetensors")
    target = load_file(tiny[f"{tiny_models.MTP}-target"] / "model.safetensors")
    assert all(w[k].equal(v) for k, v in target.items())  # the target itself, unchanged ...
    assert not w["model.layers.3.self_attn.q_proj.bias"].any()  # ... with Qwen2's (zero) QKV biases
    assert w["model.mtp_layers.0.mlp.up_proj.weight"].equal(target["model.layers.0.mlp.up_proj.weight"])
    proj = w["model.mtp_layers.0.input_proj.weight"]
    assert proj.shape == (512, 1024) and not proj[:, :512].any()  # the hidden-state half is weighted zero

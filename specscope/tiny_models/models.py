"""The models' weights, from fixed seeds (the heads as checkpoint weights by name, with their config):

- the **tiny family**: a 4-layer target and drafts of known quality (a copy, noisy copies, an independent model,
  a same-size draft with another tokenizer, a draft with another vocabulary);
- the **deep family**, where speculation really pays on a CPU: 12-layer targets (40.6M parameters) whose layers
  after the first write into the residual stream scaled by a factor f, each with a 1-layer draft that is exactly
  its layer 0 with the same embeddings, final norm and LM head (5.3M parameters). The smaller f, the closer the
  draft's predictions to the target's: f = 0.01 accepts ~75% of draft tokens, 0.03 ~45%, 0.1 ~8%;
- **EAGLE-3 heads** for the deep targets (``deep01-eagle3``, ``deep03-eagle3``), in the format vLLM's ``eagle3``
  method loads (``LlamaForCausalLMEagle3``: ``fc`` over three target layers' hidden states, one decoder layer
  over ``[embedding, hidden]``, the target's norm and LM head). Built, not trained: the decoder layer is the
  target's layer 0 and the hidden-state input is weighted zero (``hidden_norm`` = 0 with
  ``norm_before_residual``), so the head predicts as the layer-0 draft does while vLLM runs the whole EAGLE-3
  path (auxiliary hidden states, ``fc``, the head's own KV cache, its shifted prefill). Eight extra attention
  heads attend to their own position only and carry the token's embedding into the residual stream, where a
  trained head's ``fc`` output would be;
- an **EAGLE-1 head** for deep01 (``deep01-eagle``, method ``eagle``: ``EagleLlamaForCausalLM``, ``fc`` over
  ``[embedding, target hidden state]``, one decoder layer without input norm, the target's LM head), built the same
  way: ``fc`` passes the embedding and weighs the hidden state zero, and the layer is the target's layer 0 with
  its input norm taken as the embeddings' mean RMS (the tokens' RMS varies by about 3% around it);
- an **MTP model**, ``deep01-mimo``: the deep01 target in the layout of Xiaomi's MiMo (Qwen2 layers, zero QKV
  biases: the same function) with one multi-token-prediction layer (vLLM's ``mtp`` method, ``MiMoMTP``), built
  the same way: the MTP block is layer 0, its hidden-state input weighted zero and its input projection mapping
  the normalised embedding back to the embedding.
"""

from __future__ import annotations

from typing import Any

from specscope.tiny_models.tokenizer import VOCAB_SIZE


def llama_config(vocab_size: int, layers: int, hidden: int = 128, intermediate: int = 344, heads: int = 4,
                 positions: int = 512) -> Any:
    """A small Llama's config: untied embeddings, ``<s>`` = 1 and ``</s>`` = 2 as the tokenizers have them."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def random_model(vocab_size: int, layers: int, seed: int) -> Any:
    """A Llama with random weights from ``seed`` and a sharpened LM head."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(vocab_size, layers))
    with torch.no_grad():
        # Sharpen the output distribution so greedy text is not flat.
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def noisy_copy(target: Any, fraction: float, seed: int) -> Any:
    """``target`` plus Gaussian noise of ``fraction`` of each tensor's std."""
    import copy

    import torch

    gen = torch.Generator().manual_seed(seed)
    model = copy.deepcopy(target)
    with torch.no_grad():
        for p in model.parameters():
            std = float(p.std()) if p.numel() > 1 else 0.0
            p.add_(torch.randn(p.shape, generator=gen) * (fraction * std))
    return model


def reindexed_copy(target: Any, target_tok: Any, draft_tok: Any) -> Any:
    """The target's weights with rows moved so each token keeps its meaning under the draft's ids."""
    import copy

    import torch

    model = copy.deepcopy(target)
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    n = len(t_vocab)
    perm = [-1] * n  # perm[draft_id] = target_id carrying the same token
    for token, d_id in d_vocab.items():
        if token in t_vocab and d_id < n:
            perm[d_id] = t_vocab[token]
    unused = iter(sorted(set(range(n)) - {t for t in perm if t >= 0}))
    perm = [t if t >= 0 else next(unused) for t in perm]
    index = torch.tensor(perm)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.copy_(target.model.embed_tokens.weight[index])
        model.lm_head.weight.copy_(target.lm_head.weight[index])
    return model


def deep_pair(factor: float) -> tuple[Any, Any]:
    """A 12-layer target whose layers after the first are scaled by ``factor``, and its layer 0 as a draft."""
    import torch
    from transformers import LlamaForCausalLM

    deep = {"hidden": 512, "intermediate": 1408, "heads": 8, "positions": 1024}
    torch.manual_seed(0)
    target = LlamaForCausalLM(llama_config(VOCAB_SIZE, 12, **deep)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)
    draft = LlamaForCausalLM(llama_config(VOCAB_SIZE, 1, **deep)).eval()
    keep = {k: v for k, v in target.state_dict().items()
            if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    draft.load_state_dict(keep, strict=True)
    return target, draft


#: RoPE pairs (highest frequencies first) that the embedding-carrying heads' constant query and key use, and
#: their amplitude: the score at distance 0 beats every other distance up to 1024 by more than 25 (logits).
_SELF_PAIRS, _SELF_AMPLITUDE = 6, 14.0


def _mean_rms(embed: Any) -> float:
    """The embeddings' RMS, averaged over tokens: what a layer's input norm divides a token's embedding by."""
    return float(embed.pow(2).mean(-1).sqrt().mean())


def eagle3_head(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """An EAGLE-3 head (weights by checkpoint name, config) that predicts as ``target``'s layer 0 does.

    vLLM's head layer sees ``[norm(embedding), hidden_norm(h)]`` with residual ``hidden_norm(h)`` (with
    ``norm_before_residual``); ``hidden_norm`` = 0 turns both into the embedding alone. Heads 0-7 are the target's
    layer-0 attention; heads 8-15 have a constant query and key (biases), so RoPE makes each position attend to
    itself, and their values and output map ``norm(embedding)`` back to the embedding (scaled by the embeddings'
    mean RMS): the residual stream layer 0 sees in the target.
    """
    import torch

    cfg = target.config
    hidden, heads, head_dim = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    sd = {k: v.detach().clone() for k, v in target.state_dict().items()}
    layer = "model.layers.0."
    width = heads * head_dim
    zeros = torch.zeros(width, hidden)
    bias = torch.zeros(2 * width)
    for h in range(heads):
        start = width + h * head_dim
        bias[start:start + _SELF_PAIRS] = _SELF_AMPLITUDE
    w: dict[str, Any] = {}
    for p in "qkv":
        own = sd[layer + f"self_attn.{p}_proj.weight"]
        carry = torch.eye(width, hidden) if p == "v" else zeros
        w[f"midlayer.self_attn.{p}_proj.weight"] = torch.cat(
            [torch.cat([own, zeros], 1), torch.cat([carry, zeros], 1)], 0)
        w[f"midlayer.self_attn.{p}_proj.bias"] = torch.zeros(2 * width) if p == "v" else bias.clone()
    embed = sd["model.embed_tokens.weight"]
    rms = _mean_rms(embed)
    w["midlayer.self_attn.o_proj.weight"] = torch.cat(
        [sd[layer + "self_attn.o_proj.weight"], torch.diag(rms / sd[layer + "input_layernorm.weight"])], 1)
    w["midlayer.self_attn.o_proj.bias"] = torch.zeros(hidden)
    for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
        w[f"midlayer.{name}.weight"] = sd[layer + f"{name}.weight"]
    w["midlayer.hidden_norm.weight"] = torch.zeros(hidden)
    w["fc.weight"] = torch.zeros(hidden, 3 * hidden)
    w["norm.weight"] = sd["model.norm.weight"]
    w["lm_head.weight"] = sd["lm_head.weight"]
    w["embed_tokens.weight"] = embed
    config = cfg.to_dict()
    config.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, num_attention_heads=2 * heads,
                  num_key_value_heads=2 * heads, head_dim=head_dim, attention_bias=True,
                  draft_vocab_size=cfg.vocab_size, target_hidden_size=hidden, norm_before_residual=True)
    return {k: v.contiguous() for k, v in w.items()}, config


def eagle_head(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """An EAGLE-1 head (weights by checkpoint name, config) that predicts as ``target``'s layer 0 does.

    vLLM's EAGLE-1 layer reads ``fc([embedding, hidden])`` with no input norm and ends without a final norm before
    the target's LM head. ``fc`` passes the embedding (the hidden state weighted zero); q, k and v fold in the
    input norm as the embeddings' mean RMS; the target's final norm is all ones, a per-token scale that leaves
    the greedy token as it is.
    """
    import torch

    cfg = target.config
    hidden = cfg.hidden_size
    sd = {k: v.detach().clone() for k, v in target.state_dict().items()}
    if not bool((sd["model.norm.weight"] == 1).all()):
        raise ValueError("an EAGLE-1 head has no final norm: the target's must be all ones")
    layer = "model.layers.0."
    embed = sd["model.embed_tokens.weight"]
    rms = _mean_rms(embed)
    w = {"layers.0." + k.removeprefix(layer): v for k, v in sd.items()
         if k.startswith(layer) and not k.endswith("input_layernorm.weight")}
    norm = sd[layer + "input_layernorm.weight"] / rms
    for p in "qkv":
        w[f"layers.0.self_attn.{p}_proj.weight"] = sd[layer + f"self_attn.{p}_proj.weight"] * norm
    w["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1)
    w["embed_tokens.weight"] = embed
    config = cfg.to_dict()
    config.update(architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    return {k: v.contiguous() for k, v in w.items()}, config


def mimo(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``target`` as a MiMo checkpoint (Qwen2 names, zero QKV biases) with one MTP layer that predicts as its
    layer 0 does: MiMo's layer projects ``[hidden_norm(h), token_norm(embedding)]`` to the block's input and
    residual; the hidden half is weighted zero and the embedding half maps the normalised embedding back to the
    embedding (the embeddings' mean RMS), which is what layer 0 sees in the target."""
    import torch

    cfg = target.config
    hidden = cfg.hidden_size
    sd = {k: v.detach().clone() for k, v in target.state_dict().items()}
    w = dict(sd)
    for key, weight in sd.items():  # Qwen2's attention has QKV biases
        if key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            w[key.removesuffix("weight") + "bias"] = torch.zeros(weight.shape[0])
    layer, mtp = "model.layers.0.", "model.mtp_layers.0."
    for key in [k for k in w if k.startswith(layer)]:
        w[mtp + key.removeprefix(layer)] = w[key].clone()
    embed = sd["model.embed_tokens.weight"]
    rms = _mean_rms(embed)
    w[mtp + "token_layernorm.weight"] = torch.ones(hidden)
    w[mtp + "hidden_layernorm.weight"] = torch.ones(hidden)
    w[mtp + "input_proj.weight"] = torch.cat([torch.zeros(hidden, hidden), rms * torch.eye(hidden)], 1)
    w[mtp + "final_layernorm.weight"] = sd["model.norm.weight"].clone()
    config = {
        "architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "vocab_size": cfg.vocab_size,
        "hidden_size": hidden, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "num_nextn_predict_layers": 1,
        "use_sliding_window": False,
    }
    return {k: v.contiguous() for k, v in w.items()}, config

"""Model sizes from Hugging Face configs: the weights a model holds and the parameters one token's forward pass
reads, for decoder-only transformers (dense, mixture-of-experts, multi-head latent attention) and for the
speculators vLLM runs (a draft model, EAGLE and EAGLE-3 heads, MTP layers).

Configs are read as the engine loaded them (``model_config.hf_config``, ``draft_model_config.hf_config``), so a
model named by hub id, by directory or by HF-cache snapshot is sized the same. A config may be a
``PretrainedConfig`` or a plain dict (``config.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Speculative methods that run no model: the draft costs only the verification of its tokens.
MODEL_FREE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


@dataclass(frozen=True)
class ModelSize:
    """``weights``: parameters held in memory (shared ones counted by their owner); ``per_token``: parameters
    one token's forward pass multiplies by (transformer layers, active experts only, and the LM head)."""

    weights: int
    per_token: int


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)
    return default if value is None else value


def _text(cfg: Any) -> Any:
    """The language model's config of a multimodal config; the config itself otherwise."""
    inner = _get(cfg, "text_config")
    return inner if inner is not None and _get(inner, "hidden_size") else cfg


def _attention(cfg: Any, hidden: int, in_dim: int | None = None) -> int:
    """Attention projection parameters of one layer (multi-head latent attention where configured)."""
    heads = int(_get(cfg, "num_attention_heads", 1))
    kv_lora = _get(cfg, "kv_lora_rank")
    if kv_lora:  # DeepSeek-style MLA
        nope, rope = int(_get(cfg, "qk_nope_head_dim", 128)), int(_get(cfg, "qk_rope_head_dim", 64))
        v_dim = int(_get(cfg, "v_head_dim", 128))
        q_lora = _get(cfg, "q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        kv = hidden * (int(kv_lora) + rope) + int(kv_lora) * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    head_dim = int(_get(cfg, "head_dim", hidden // heads))
    qkv_in = in_dim or hidden
    return qkv_in * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden


def _experts(cfg: Any) -> tuple[int, int, int, int] | None:
    """(experts, experts per token, shared experts, expert width) of a mixture-of-experts config; None if dense."""
    n = _get(cfg, "n_routed_experts") or _get(cfg, "num_local_experts") or _get(cfg, "num_experts")
    per_tok = _get(cfg, "num_experts_per_tok") or _get(cfg, "moe_topk")
    if not n or not per_tok:
        return None
    width = int(_get(cfg, "moe_intermediate_size") or _get(cfg, "intermediate_size"))
    return int(n), int(per_tok), int(_get(cfg, "n_shared_experts", 0)), width


def _layer(cfg: Any, hidden: int, moe: bool, in_dim: int | None = None) -> ModelSize:
    """One decoder layer: attention plus a gated MLP or a mixture of experts."""
    attn = _attention(cfg, hidden, in_dim)
    experts = _experts(cfg) if moe else None
    if experts is None:
        mlp = 3 * hidden * int(_get(cfg, "intermediate_size", 4 * hidden))
        return ModelSize(attn + mlp, attn + mlp)
    n, per_tok, shared, width = experts
    expert = 3 * hidden * width
    router = hidden * n
    return ModelSize(attn + (n + shared) * expert + router, attn + (per_tok + shared) * expert + router)


def _dense_layers(cfg: Any, layers: int) -> int:
    """Leading layers that are dense in an MoE model (DeepSeek's ``first_k_dense_replace``)."""
    if _experts(cfg) is None:
        return layers
    return min(layers, int(_get(cfg, "first_k_dense_replace", 0)))


def model_size(cfg: Any) -> ModelSize | None:
    """A decoder-only language model's size; None when the config lacks the essentials."""
    cfg = _text(cfg)
    try:
        hidden, layers, vocab = int(_get(cfg, "hidden_size")), int(_get(cfg, "num_hidden_layers")), int(
            _get(cfg, "vocab_size"))
    except (TypeError, ValueError):
        return None
    dense = _dense_layers(cfg, layers)
    d, m = _layer(cfg, hidden, moe=False), _layer(cfg, hidden, moe=True)
    head = vocab * hidden
    embeddings = 0 if _get(cfg, "tie_word_embeddings", False) else vocab * hidden
    return ModelSize(
        weights=dense * d.weights + (layers - dense) * m.weights + head + embeddings,
        per_token=dense * d.per_token + (layers - dense) * m.per_token + head,
    )


def draft_size(method: str | None, draft_cfg: Any, target_cfg: Any) -> ModelSize | None:
    """The speculator's own size; None for model-free methods and unreadable configs.

    - ``draft_model``: a whole model.
    - ``eagle``: its decoder layers plus the fusing projection (2h → h); embeddings and LM head are the target's.
    - ``eagle3``: one layer whose attention reads 2h, the projection of three target layers (3h → h), and its
      own LM head over ``draft_vocab_size`` tokens.
    - ``mtp``: ``n_predict`` target-shaped layers plus the projection (2h → h); one layer runs per draft token,
      embeddings and LM head are the target's.
    """
    if method in MODEL_FREE_METHODS or draft_cfg is None:
        return None
    if method in (None, "draft_model"):
        return model_size(draft_cfg)
    cfg, target = _text(draft_cfg), _text(target_cfg) if target_cfg is not None else None
    try:
        hidden = int(_get(cfg, "hidden_size"))
    except (TypeError, ValueError):
        return None
    vocab = int(_get(target if target is not None else cfg, "vocab_size", _get(cfg, "vocab_size", 0)))
    if method == "eagle":
        layers = int(_get(cfg, "num_hidden_layers", 1))
        layer = _layer(cfg, hidden, moe=True)
        fc = 2 * hidden * hidden
        return ModelSize(layers * layer.weights + fc, layers * layer.per_token + fc + vocab * hidden)
    if method == "eagle3":
        layer = _layer(cfg, hidden, moe=True, in_dim=2 * hidden)
        fc = 3 * hidden * hidden
        head = int(_get(cfg, "draft_vocab_size", vocab)) * hidden
        return ModelSize(layer.weights + fc + head, layer.per_token + fc + head)
    if method == "mtp":
        n = int(_get(cfg, "n_predict", 0) or _get(cfg, "num_nextn_predict_layers", 1))
        layer = _layer(cfg, hidden, moe=True)
        proj = 2 * hidden * hidden
        return ModelSize(n * (layer.weights + proj), layer.per_token + proj + vocab * hidden)
    return None


def kv_elements_per_token(cfg: Any, layers: int | None = None) -> int | None:
    """KV-cache elements one token takes in ``layers`` attention layers (default: all of the config's): key and
    value per KV head, or the compressed latent of multi-head latent attention; None when unreadable."""
    cfg = _text(cfg)
    try:
        hidden, heads = int(_get(cfg, "hidden_size")), int(_get(cfg, "num_attention_heads", 1))
        n = int(layers if layers is not None else _get(cfg, "num_hidden_layers"))
    except (TypeError, ValueError):
        return None
    kv_lora = _get(cfg, "kv_lora_rank")
    if kv_lora:
        return n * (int(kv_lora) + int(_get(cfg, "qk_rope_head_dim", 64)))
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    return n * 2 * kv_heads * int(_get(cfg, "head_dim", hidden // heads))


def draft_kv_layers(method: str | None, draft_cfg: Any) -> int:
    """Attention layers the speculator keeps its own KV cache for (they share the target's blocks)."""
    if method in MODEL_FREE_METHODS or draft_cfg is None:
        return 0
    cfg = _text(draft_cfg)
    if method == "eagle3":
        return 1
    if method == "mtp":
        return int(_get(cfg, "n_predict", 0) or _get(cfg, "num_nextn_predict_layers", 1))
    return int(_get(cfg, "num_hidden_layers", 1))


def architecture(cfg: Any) -> str | None:
    """A short fingerprint of what a step's time depends on: class, layers, widths, vocabulary, parameters."""
    size = model_size(cfg)
    if size is None:
        return None
    text = _text(cfg)
    arch = (_get(cfg, "architectures") or ["?"])[0]
    return (f"{arch} layers={_get(text, 'num_hidden_layers')} hidden={_get(text, 'hidden_size')} "
            f"vocab={_get(text, 'vocab_size')} params={size.weights}")

"""Tiny Llama target and draft models, built deterministically and offline.

No weights can be downloaded on the machines specscope is tested on, so tests, benchmarks and the demo use
models built here with fixed seeds and a byte-level BPE tokenizer trained on generated text:

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

Built once and cached on disk (``$SPECSCOPE_CACHE`` or ``~/.cache/specscope``). Needs torch, transformers and
tokenizers (the ``cpu`` or ``vllm`` extra).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Bump when anything below changes what gets built, so stale caches are not reused.
VERSION = "4"

VOCAB_SIZE = 2000
SMALL_VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
#: Plain-text chat template, so the OpenAI chat endpoint works with the tiny models.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"

#: Draft name -> what it is. The target is built alongside them.
DRAFTS: dict[str, str] = {
    "copy": "exact copy of the target (acceptance ~1)",
    "noise2": "target + Gaussian noise of 2% of each tensor's std (good draft)",
    "noise10": "target + Gaussian noise of 10% of each tensor's std (weak draft)",
    "independent": "independent random 1-layer model, same tokenizer (useless draft)",
    "other-tokenizer": "target's weights re-indexed for a different tokenizer of the same vocabulary size",
    "other-vocab": "independent model with a 1000-token vocabulary",
}
#: Deep family: name -> the factor f on every later layer's output projections.
DEEP: dict[str, float] = {"deep01": 0.01, "deep03": 0.03, "deep10": 0.1}
#: Deep targets that get an EAGLE-3 head ``<name>-eagle3``.
EAGLE3 = ("deep01", "deep03")
#: The deep target that gets an EAGLE-1 head ``<name>-eagle``.
EAGLE = "deep01"
#: The deep target that also ships as a MiMo model with one MTP layer, ``<name>-mimo``.
MTP = "deep01"
#: Every model ``build`` returns, with what it is.
MODELS: dict[str, str] = {
    "target": "4-layer target of the tiny family",
    **DRAFTS,
    **{m: d for name, f in DEEP.items() for m, d in (
        (f"{name}-target", f"12-layer target, later layers scaled by {f}"),
        (f"{name}-draft", f"exactly {name}-target's layer 0, with its embeddings and LM head"))},
    **{f"{name}-eagle3": f"EAGLE-3 head for {name}-target: its layer 0, hidden-state input weighted zero"
       for name in EAGLE3},
    f"{EAGLE}-eagle": f"EAGLE-1 head for {EAGLE}-target: its layer 0, hidden-state input weighted zero",
    f"{MTP}-mimo": f"{MTP}-target as a MiMo model with one MTP layer (method mtp): its layer 0, hidden input zero",
}

_WORD_TEXT = (
    "the of and to in is was that for on as with by at from his her they this which be or an are had not "
    "one but all were when there can more has their if would will what about out up into them some time "
    "only other new could its two first over than been these may then do like so people any most after "
    "made also did many before must through back years where much your way well down should because each "
    "just those how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might great old year off come since "
    "against go came right used take three engine token draft model cache block memory speed verify "
    "accept reject batch queue latency window signal metric alert river stone garden window light "
)
_WORDS = _WORD_TEXT.split()


def cache_root() -> Path:
    """Directory holding built model families."""
    base = os.environ.get("SPECSCOPE_CACHE") or os.path.join(Path.home(), ".cache", "specscope")
    return Path(base) / "tiny-models" / f"v{VERSION}"


def _lexicon() -> list[str]:
    """English function words plus seeded pseudo-words, enough for the BPE to fill its vocabulary."""
    rng = random.Random(1)
    onsets = "b c d f g h j k l m n p r s t v w z br cl dr fl gr pl st tr sh ch th"
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    pseudo = {
        "".join(rng.choice(onsets.split()) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(4000)
    }
    return list(_WORDS) + sorted(pseudo)


def _corpus(seed: int, lines: int = 6000) -> list[str]:
    rng = random.Random(seed)
    words = _lexicon()
    rng.shuffle(words)
    # A Zipf-like choice makes frequent words merge first, as in real text.
    weights = [1.0 / (i + 1) for i in range(len(words))]
    out = []
    for _ in range(lines):
        n = rng.randint(6, 18)
        sentence = " ".join(rng.choices(words, weights, k=n))
        out.append(sentence.capitalize() + rng.choice([".", ".", "?", "!"]))
    return out


def _train_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(vocab_size: int, layers: int, hidden: int = 128, intermediate: int = 344, heads: int = 4,
            positions: int = 512) -> Any:
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


def _random_model(vocab_size: int, layers: int, seed: int) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_config(vocab_size, layers))
    with torch.no_grad():
        # Sharpen the output distribution so greedy text is not flat.
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def _noisy_copy(target: Any, fraction: float, seed: int) -> Any:
    import copy

    import torch

    gen = torch.Generator().manual_seed(seed)
    model = copy.deepcopy(target)
    with torch.no_grad():
        for p in model.parameters():
            std = float(p.std()) if p.numel() > 1 else 0.0
            p.add_(torch.randn(p.shape, generator=gen) * (fraction * std))
    return model


def _reindexed_copy(target: Any, target_tok: Any, draft_tok: Any) -> Any:
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


def _deep_pair(factor: float) -> tuple[Any, Any]:
    """A 12-layer target whose layers after the first are scaled by ``factor``, and its layer 0 as a draft."""
    import torch
    from transformers import LlamaForCausalLM

    deep = {"hidden": 512, "intermediate": 1408, "heads": 8, "positions": 1024}
    torch.manual_seed(0)
    target = LlamaForCausalLM(_config(VOCAB_SIZE, 12, **deep)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)
    draft = LlamaForCausalLM(_config(VOCAB_SIZE, 1, **deep)).eval()
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


def _eagle3_head(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _eagle_head(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _mimo(target: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _save_head(weights: dict[str, Any], config: dict[str, Any], tokenizer: Any, path: Path) -> None:
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file(weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(path)


def _save(model: Any, tokenizer: Any, path: Path) -> None:
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def build(root: Path | None = None) -> dict[str, Path]:
    """Build (or reuse) both families; return ``{name: path}`` for every name in :data:`MODELS`."""
    root = root or cache_root()
    paths = {name: root / name for name in MODELS}
    if all((p / "config.json").is_file() for p in paths.values()):
        return paths

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root.parent))
    try:
        corpus = _corpus(seed=7)
        tok = _train_tokenizer(corpus, VOCAB_SIZE)
        other_tok = _train_tokenizer(_corpus(seed=8), VOCAB_SIZE)
        small_tok = _train_tokenizer(corpus, SMALL_VOCAB_SIZE)

        target = _random_model(VOCAB_SIZE, layers=4, seed=0)
        _save(target, tok, tmp / "target")
        _save(target, tok, tmp / "copy")
        _save(_noisy_copy(target, 0.02, seed=2), tok, tmp / "noise2")
        _save(_noisy_copy(target, 0.10, seed=10), tok, tmp / "noise10")
        _save(_random_model(VOCAB_SIZE, layers=1, seed=1234), tok, tmp / "independent")
        _save(_reindexed_copy(target, tok, other_tok), other_tok, tmp / "other-tokenizer")
        _save(_random_model(SMALL_VOCAB_SIZE, layers=1, seed=99), small_tok, tmp / "other-vocab")
        for name, factor in DEEP.items():
            deep_target, deep_draft = _deep_pair(factor)
            _save(deep_target, tok, tmp / f"{name}-target")
            _save(deep_draft, tok, tmp / f"{name}-draft")
            if name in EAGLE3:
                _save_head(*_eagle3_head(deep_target), tok, tmp / f"{name}-eagle3")
            if name == EAGLE:
                _save_head(*_eagle_head(deep_target), tok, tmp / f"{name}-eagle")
            if name == MTP:
                _save_head(*_mimo(deep_target), tok, tmp / f"{name}-mimo")
        (tmp / "README.txt").write_text(
            "specscope tiny models (random weights, for tests only)\n"
            + "".join(f"{k}: {v}\n" for k, v in MODELS.items())
        )
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def prompts(count: int, seed: int = 0, min_words: int = 4, max_words: int = 40) -> list[str]:
    """Deterministic prompts in the tiny models' language, of varied lengths."""
    rng = random.Random(seed)
    lines = _corpus(seed=1000 + seed, lines=count)
    return [" ".join(line.split()[: rng.randint(min_words, max_words)]) for line in lines]


def split_by_acceptance(llm: Any, candidates: Sequence[str], tokens: int = 48, easy: int = 8,
                        floor: float = 0.35) -> tuple[list[str], list[str]]:
    """Two traffic classes the draft of ``llm`` really treats differently, from one greedy pass over
    ``candidates`` (vLLM's own per-request acceptance): the ``easy`` prompts it predicts best, and the worst it
    predicts, as many as keep the mix's acceptance (by draft tokens) at ``floor`` or above. Random-weight models
    have no domains, so the prompts are told apart by what the draft does with them."""
    from vllm import SamplingParams

    from specscope.collectors import vllm_reader

    outputs = llm.generate(list(candidates), SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                           use_tqdm=False)
    counts = []
    for out in outputs:
        steps = vllm_reader.per_step_counts(out.outputs[0].spec_decode_metrics)
        counts.append((sum(steps[0]), sum(steps[1])) if steps and sum(steps[1]) else (0, 1))
    order = sorted(range(len(candidates)), key=lambda i: counts[i][0] / counts[i][1])
    best, accepted, drafted = order[-easy:], 0, 0
    for i in best:
        accepted, drafted = accepted + counts[i][0], drafted + counts[i][1]
    worst = []
    for i in order[:-easy]:
        if (accepted + counts[i][0]) / (drafted + counts[i][1]) < floor:
            break
        worst.append(i)
        accepted, drafted = accepted + counts[i][0], drafted + counts[i][1]
    return [candidates[i] for i in best], [candidates[i] for i in worst]

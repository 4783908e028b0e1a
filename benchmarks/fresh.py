"""What ``bench_truth_user.py --fresh SEED`` is judged on, drawn from SEED: pairs never built before and traffic from a
generator the tests do not use.

- **Draft-model pairs**: a Llama target of 8-16 layers and width 256-768 whose layers after the first write into the
  residual stream scaled by f (log-uniform in 0.005-0.08), and a draft that is exactly its first 1 or 2 layers with
  its embeddings, final norm and LM head (a strict state-dict load, as ``tiny_models.models.deep_pair`` builds);
- an **EAGLE-3 head** on one drawn target (``tiny_models.models.eagle3_head``) and **n-gram lookup** on one;
- **traffic** in two shapes: short chat prompts from templates over a vocabulary of pseudo-words drawn from SEED, and
  retrieval-style prompts of 300+ tokens (numbered passages of that generator's sentences, then a question), each in
  two samples (A predicts, B is measured) with each prompt's own output length.

Models are built into ``tiny_models.cache_root().parent / "fresh-models" / "seed-<SEED>"`` (the tiny family's
tokenizer, whose vocabulary every drawn model shares).
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope import tiny_models
from specscope.read.workload import output_lengths

#: Prompts per sample, and the mean of their output lengths (drawn per prompt from half to 1.5 times it).
SAMPLE_SIZE, MEAN_TOKENS = 64, 64
#: The retrieval-style prompts' length in tokens, drawn per prompt.
RAG_TOKENS = (300, 450)
SHAPES = ("chat", "rag")


@dataclass(frozen=True)
class Target:
    """A drawn target: depth, width, residual scale f of its later layers and its torch seed."""

    name: str
    layers: int
    width: int
    factor: float
    seed: int

    def describe(self) -> str:
        return f"{self.layers} layers, width {self.width}, f = {self.factor:.4f}"


@dataclass(frozen=True)
class Pair:
    """A drawn target and how it speculates: ``draft_layers`` of its own (draft_model), its EAGLE-3 head, or n-gram."""

    name: str
    target: Target
    method: str
    draft_layers: int = 0

    def describe(self) -> str:
        how = {"draft_model": f"its first {self.draft_layers} layer(s) as the draft", "eagle3": "an EAGLE-3 head",
               "ngram": "n-gram lookup (2-4)"}[self.method]
        return f"{self.target.describe()}; {how}"

    def speculative_config(self, root: Path, k: int) -> dict[str, Any]:
        """vLLM's ``speculative_config`` at K = ``k``, the models found under ``root``."""
        if self.method == "ngram":
            return {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, "num_speculative_tokens": k}
        return {"method": self.method, "model": str(root / self.name / "draft"), "num_speculative_tokens": k}


def draw_pairs(seed: int, draft_pairs: int = 2) -> list[Pair]:
    """``draft_pairs`` draft-model pairs on targets drawn from ``seed``, an EAGLE-3 head on one of those targets and
    n-gram lookup on one."""
    rng = random.Random(seed)
    targets = [Target(f"t{i}", rng.randint(8, 16), rng.choice((256, 384, 512, 640, 768)),
                      round(math.exp(rng.uniform(math.log(0.005), math.log(0.08))), 4), rng.randrange(2**31))
               for i in range(draft_pairs)]
    out = [Pair(f"draft{i}", t, "draft_model", rng.choice((1, 2))) for i, t in enumerate(targets)]
    return [*out, Pair("eagle3", rng.choice(targets), "eagle3"), Pair("ngram", rng.choice(targets), "ngram")]


def model_root(seed: int) -> Path:
    """Where the models of ``seed`` are built."""
    return tiny_models.cache_root().parent / "fresh-models" / f"seed-{seed}"


def build(seed: int, pairs: list[Pair]) -> Path:
    """Build (or reuse) each pair's target and draft or head under :func:`model_root`: ``<pair>/target`` and
    ``<pair>/draft`` (n-gram: the target alone)."""
    root = model_root(seed)
    todo = [p for p in pairs if not (root / p.name / "target" / "config.json").is_file()
            or (p.method != "ngram" and not (root / p.name / "draft" / "config.json").is_file())]
    if not todo:
        return root
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    from specscope.tiny_models.models import eagle3_head, llama_config

    tok = AutoTokenizer.from_pretrained(tiny_models.build()["deep01-target"])
    root.mkdir(parents=True, exist_ok=True)
    for pair in todo:
        t = pair.target
        dims = {"hidden": t.width, "intermediate": 64 * round(2.75 * t.width / 64), "heads": t.width // 64,
                "positions": 1024}
        torch.manual_seed(t.seed)
        target = LlamaForCausalLM(llama_config(tiny_models.VOCAB_SIZE, t.layers, **dims)).eval()
        with torch.no_grad():
            target.lm_head.weight.mul_(8.0)
            for layer in target.model.layers[1:]:
                layer.self_attn.o_proj.weight.mul_(t.factor)
                layer.mlp.down_proj.weight.mul_(t.factor)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        target.save_pretrained(tmp / "target", safe_serialization=True)
        tok.save_pretrained(tmp / "target")
        if pair.method == "draft_model":
            draft = LlamaForCausalLM(llama_config(tiny_models.VOCAB_SIZE, pair.draft_layers, **dims)).eval()
            own = tuple(f"model.layers.{i}." for i in range(pair.draft_layers))
            draft.load_state_dict({k: v for k, v in target.state_dict().items()
                                   if not k.startswith("model.layers.") or k.startswith(own)}, strict=True)
            draft.save_pretrained(tmp / "draft", safe_serialization=True)
            tok.save_pretrained(tmp / "draft")
        elif pair.method == "eagle3":
            weights, config = eagle3_head(target)
            (tmp / "draft").mkdir()
            save_file(weights, str(tmp / "draft" / "model.safetensors"))
            (tmp / "draft" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
            tok.save_pretrained(tmp / "draft")
        shutil.rmtree(root / pair.name, ignore_errors=True)
        tmp.rename(root / pair.name)
    return root


#: Syllables of the pseudo-words (none of the tiny language's onsets' spelling rules: its own inventory).
_ONSETS = ("k", "g", "t", "d", "p", "b", "m", "n", "s", "z", "f", "v", "r", "l", "y", "w", "ky", "ny", "sh", "tsu",
           "gw")
_NUCLEI = ("a", "e", "i", "o", "u", "aa", "ei", "ou", "y")
_TEMPLATES = (
    "Hi, I have a question about {n1}. {s} How do I {v} the {n2}?",
    "Can you explain why the {n1} would {v} the {n2}? {s}",
    "{name} asked me to {v} the {n1} before {day}. {s} What should I check first?",
    "Please summarise this in one line: {s} {s}",
    "What is the difference between {n1} and {n2} when you {v} them?",
    "Write a short note to {name} about the {n1}. {s}",
    "My {n1} stopped working after I tried to {v} it. {s} Any idea?",
    "List three ways to {v} a {n1} without a {n2}.",
)


class Traffic:
    """A seeded chat generator: a vocabulary of pseudo-words split into nouns, verbs and names, drawn Zipf-like."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        words = sorted({"".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(rng.randint(1, 3)))
                        for _ in range(900)})
        rng.shuffle(words)
        self.nouns, self.verbs, self.names = words[:400], words[400:600], [w.capitalize() for w in words[600:700]]
        self.filler = [*words[700:], "the", "a", "of", "and", "to", "in", "is", "for", "with", "on", "that", "it"]
        self.weights = [1.0 / (i + 1) for i in range(len(self.filler) + len(self.nouns))]

    def sentence(self, rng: random.Random) -> str:
        """A sentence of 5-14 words."""
        words = rng.choices(self.filler + self.nouns, self.weights, k=rng.randint(5, 14))
        return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!"))

    def chat(self, rng: random.Random) -> str:
        """A chat turn: one template filled in."""
        fill = {"n1": rng.choice(self.nouns), "n2": rng.choice(self.nouns), "v": rng.choice(self.verbs),
                "name": rng.choice(self.names), "day": rng.choice(("Monday", "noon", "the release", "tonight"))}
        text = rng.choice(_TEMPLATES)
        while "{s}" in text:
            text = text.replace("{s}", self.sentence(rng), 1)
        return text.format(**fill)

    def rag(self, rng: random.Random, corpus: list[str], count: Callable[[str], int]) -> str:
        """Numbered passages of ``corpus`` until the prompt holds a drawn 300-450 tokens (``count``), then a
        question."""
        question, want = self.chat(rng), rng.randint(*RAG_TOKENS)
        passages: list[str] = []
        while count(self._rag_text(passages, question)) < want:
            passages.append(rng.choice(corpus))
        return self._rag_text(passages, question)

    @staticmethod
    def _rag_text(passages: list[str], question: str) -> str:
        docs = "\n".join(f"[{i}] {p}" for i, p in enumerate(passages, 1))
        return f"Use the documents to answer.\n{docs}\nQuestion: {question}\nAnswer:"


def samples(seed: int, count: Callable[[str], int]) -> dict[str, tuple[tuple[list[str], list[int]], ...]]:
    """Shape -> (sample A, sample B), each its prompts and their output lengths; ``count`` gives a text's tokens."""
    traffic = Traffic(seed)
    rng = random.Random(seed + 1)
    # One corpus for both samples, as a retrieval service's traffic retrieves from one.
    corpus = [" ".join(traffic.sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    out: dict[str, tuple[tuple[list[str], list[int]], ...]] = {}
    for shape in SHAPES:
        pair = []
        for which in (0, 1):
            draw = random.Random(f"{seed}-{shape}-{which}")
            prompts = [traffic.chat(draw) if shape == "chat" else traffic.rag(draw, corpus, count)
                       for _ in range(SAMPLE_SIZE)]
            pair.append((prompts, output_lengths(SAMPLE_SIZE, MEAN_TOKENS, seed=draw.randrange(2**31))))
        out[shape] = tuple(pair)
    return out

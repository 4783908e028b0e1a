"""Tiny Llama target and draft models, built deterministically and offline.

No weights can be downloaded on the machines specscope is tested on, so tests, benchmarks and the demo use
models built here with fixed seeds and a byte-level BPE tokenizer trained on generated text: a tiny family (a
4-layer target and drafts of known quality), a deep family where speculation really pays on a CPU, and EAGLE-3,
EAGLE-1 and MTP heads built from the deep targets. The rooms:

- :mod:`.family`: every model by name, and :func:`build`, which builds them all once into a versioned cache;
- :mod:`.models`: the weights (and how each head is made);
- :mod:`.tokenizer`: the byte-level BPE tokenizers;
- :mod:`.language`: the generated text the tokenizers learn, and :func:`prompts`;
- :mod:`.classes`: two traffic classes from prompts, by how well the draft predicts them.

Built once and cached on disk (``$SPECSCOPE_CACHE`` or ``~/.cache/specscope``). Needs torch, transformers and
tokenizers (the ``cpu`` or ``vllm`` extra).
"""

from __future__ import annotations

from specscope.tiny_models.classes import acceptance_counts, split_by_acceptance
from specscope.tiny_models.family import DEEP, DRAFTS, EAGLE, EAGLE3, MODELS, MTP, VERSION, build, cache_root
from specscope.tiny_models.language import prompts
from specscope.tiny_models.tokenizer import SMALL_VOCAB_SIZE, VOCAB_SIZE

__all__ = [
    "DEEP",
    "DRAFTS",
    "EAGLE",
    "EAGLE3",
    "MODELS",
    "MTP",
    "SMALL_VOCAB_SIZE",
    "VERSION",
    "VOCAB_SIZE",
    "acceptance_counts",
    "build",
    "cache_root",
    "prompts",
    "split_by_acceptance",
]

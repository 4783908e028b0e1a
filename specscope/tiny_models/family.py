"""Every model by name, and :func:`build`: all of them built once, into a cache keyed by :data:`VERSION`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from specscope.tiny_models import language, models, tokenizer
from specscope.tiny_models.tokenizer import SMALL_VOCAB_SIZE, VOCAB_SIZE

#: Bump when anything in this package changes what gets built, so stale caches are not reused.
VERSION = "4"

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


def cache_root() -> Path:
    """Directory holding built model families."""
    base = os.environ.get("SPECSCOPE_CACHE") or os.path.join(Path.home(), ".cache", "specscope")
    return Path(base) / "tiny-models" / f"v{VERSION}"


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
        text = language.corpus(seed=7)
        tok = tokenizer.train(text, VOCAB_SIZE)
        other_tok = tokenizer.train(language.corpus(seed=8), VOCAB_SIZE)
        small_tok = tokenizer.train(text, SMALL_VOCAB_SIZE)

        target = models.random_model(VOCAB_SIZE, layers=4, seed=0)
        _save(target, tok, tmp / "target")
        _save(target, tok, tmp / "copy")
        _save(models.noisy_copy(target, 0.02, seed=2), tok, tmp / "noise2")
        _save(models.noisy_copy(target, 0.10, seed=10), tok, tmp / "noise10")
        _save(models.random_model(VOCAB_SIZE, layers=1, seed=1234), tok, tmp / "independent")
        _save(models.reindexed_copy(target, tok, other_tok), other_tok, tmp / "other-tokenizer")
        _save(models.random_model(SMALL_VOCAB_SIZE, layers=1, seed=99), small_tok, tmp / "other-vocab")
        for name, factor in DEEP.items():
            deep_target, deep_draft = models.deep_pair(factor)
            _save(deep_target, tok, tmp / f"{name}-target")
            _save(deep_draft, tok, tmp / f"{name}-draft")
            if name in EAGLE3:
                _save_head(*models.eagle3_head(deep_target), tok, tmp / f"{name}-eagle3")
            if name == EAGLE:
                _save_head(*models.eagle_head(deep_target), tok, tmp / f"{name}-eagle")
            if name == MTP:
                _save_head(*models.mimo(deep_target), tok, tmp / f"{name}-mimo")
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

"""Do a target and a draft tokenize the same way? vLLM checks only the vocabulary size; this checks the ids.

With ``draft_model`` speculation the draft runs on the target's token ids. A draft trained with another
tokenizer of the same size passes vLLM's check and then proposes ids that mean other tokens: acceptance
collapses, or worse, is silently low. :func:`compare` loads both tokenizers from local files only (never the
network) and compares the token→id map, special tokens, added tokens, the normalizer / pre-tokenizer /
decoder, and the ids of a probe corpus.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["identical", "compatible", "mismatch"]

SPECIALS = ("bos_token", "eos_token", "pad_token", "unk_token")

#: Texts whose ids must agree: prose, code, numbers, whitespace, punctuation and non-ASCII scripts.
PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding: a small draft proposes K tokens and the target verifies them.",
    "def forward(self, x):\n    return self.proj(x) + 1",
    '{"model": "llama", "max_tokens": 128, "temperature": 0.0}',
    "1234567890 3.14159 -42 1e-9 0xFF",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\nnew\nlines\r\n",
    "UPPER lower MiXeD CaSe",
    "Ünïcödé façade naïve café résumé",
    "日本語のテキスト、中文文本。",
    "Привет, мир! Γειά σου κόσμε",  # noqa: RUF001 - the Greek letters are the point
    "emoji 🚀🔥👍 and symbols ©®™ ∑∫√",
    "https://example.com/path?query=1&b=two#frag",
    "a" * 64,
    "river stone garden light engine token draft model cache block memory speed verify accept",
)


class TokenizerCheckError(RuntimeError):
    """A tokenizer could not be loaded (one line, fit for the user)."""


@dataclass
class Report:
    """Everything compared, with the verdict and the reasons for it."""

    target: str
    draft: str
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vocab_size: tuple[int, int] = (0, 0)
    ids_differing: int = 0
    id_examples: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    specials: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    added_tokens: tuple[list[str], list[str]] = ([], [])
    pipeline_differences: list[str] = field(default_factory=list)
    probes_identical: float = 1.0
    first_divergence: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def load(path: str) -> Any:
    """A tokenizer from a local directory or the local Hugging Face cache; never downloads (local files only, with
    no change to the process's environment)."""
    if (os.path.isabs(path) or path.startswith(".")) and not os.path.isdir(path):
        raise TokenizerCheckError(f"no such directory: {path}")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizerCheckError("checking tokenizers needs transformers (the 'cpu' or 'vllm' extra)") from None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerCheckError(f"cannot load a tokenizer from {path!r} (local files only): {first}") from None


def _pipeline(tok: Any) -> dict[str, Any]:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return {}
    spec = json.loads(backend.to_str())
    return {k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder", "post_processor")}


def compare(target: str, draft: str, probes: tuple[str, ...] = PROBES, max_examples: int = 5) -> Report:
    """Compare the two tokenizers; raises :class:`TokenizerCheckError` when one cannot be loaded."""
    t, d = load(target), load(draft)
    tv, dv = t.get_vocab(), d.get_vocab()
    report = Report(target=target, draft=draft, verdict="identical", vocab_size=(len(t), len(d)))
    reasons, notes = report.reasons, report.notes
    if len(t) != len(d):
        reasons.append(f"vocabulary sizes differ: target {len(t)}, draft {len(d)} (vLLM refuses to start)")
    differing = sorted(tok for tok in set(tv) | set(dv) if tv.get(tok) != dv.get(tok))
    report.ids_differing = len(differing)
    # Tokens both know under different ids say most; then tokens only one knows.
    telling = sorted(differing, key=lambda tok: (tok not in tv or tok not in dv, tok))
    report.id_examples = [(tok, tv.get(tok), dv.get(tok)) for tok in telling[:max_examples]]
    if differing:
        share = len(differing) / max(1, len(set(tv) | set(dv)))
        reasons.append(f"{len(differing)} tokens ({share:.0%}) have different ids or exist in one vocabulary only")
    for name in SPECIALS:
        pair = (getattr(t, name, None), getattr(d, name, None))
        ids = (getattr(t, f"{name}_id", None), getattr(d, f"{name}_id", None))
        report.specials[name] = (f"{pair[0]}={ids[0]}", f"{pair[1]}={ids[1]}")
        if ids[0] != ids[1]:
            reasons.append(f"{name} differs: target {pair[0]!r} id {ids[0]}, draft {pair[1]!r} id {ids[1]}")
        elif pair[0] != pair[1]:
            notes.append(f"{name} has the same id but another string: {pair[0]!r} vs {pair[1]!r}")
    added_t = sorted(str(a) for a in t.get_added_vocab())
    added_d = sorted(str(a) for a in d.get_added_vocab())
    report.added_tokens = (added_t, added_d)
    if added_t != added_d:
        reasons.append(f"added tokens differ: {sorted(set(added_t) ^ set(added_d))[:max_examples]}")
    pt, pd = _pipeline(t), _pipeline(d)
    report.pipeline_differences = [k for k in pt if pt.get(k) != pd.get(k)]
    for k in report.pipeline_differences:
        notes.append(f"{k} configuration differs")
    same = 0
    for text in probes:
        a = t.encode(text, add_special_tokens=False)
        b = d.encode(text, add_special_tokens=False)
        if a == b:
            same += 1
        elif report.first_divergence is None:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            report.first_divergence = {"text": text, "position": i, "target_ids": a[i:i + 8], "draft_ids": b[i:i + 8]}
    report.probes_identical = same / len(probes)
    if same < len(probes):
        reasons.append(f"only {same} of {len(probes)} probe texts encode to the same ids")
    if reasons:
        report.verdict = "mismatch"
    elif notes:
        report.verdict = "compatible"
    return report


def render(report: Report) -> str:
    """A human-readable account of the report."""
    lines = [f"verdict: {report.verdict.upper()}", f"target:  {report.target}", f"draft:   {report.draft}",
             f"vocabulary: target {report.vocab_size[0]}, draft {report.vocab_size[1]}; "
             f"{report.ids_differing} tokens with different ids"]
    for tok, a, b in report.id_examples:
        lines.append(f"  {tok!r}: target id {a}, draft id {b}")
    for name, (a, b) in report.specials.items():
        lines.append(f"{name}: target {a}, draft {b}")
    lines.append(f"probe texts encoding identically: {report.probes_identical:.0%}")
    if report.first_divergence:
        fd = report.first_divergence
        lines.append(f"  first divergence in {fd['text']!r} at token {fd['position']}: "
                     f"target {fd['target_ids']} vs draft {fd['draft_ids']}")
    lines += [f"mismatch: {r}" for r in report.reasons] + [f"note: {n}" for n in report.notes]
    return "\n".join(lines)

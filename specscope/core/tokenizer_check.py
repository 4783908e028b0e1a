"""Do a target and a draft tokenize the same way? vLLM checks only the vocabulary size; this checks the ids.

With ``draft_model`` speculation the draft runs on the target's token ids. A draft trained with another
tokenizer of the same size passes vLLM's check and then proposes ids that mean other tokens: acceptance
collapses, or worse, is silently low. :func:`compare` loads both tokenizers from local files only (never the
network) and compares the token→id map, special tokens, added tokens, the chat template, the normalizer /
pre-tokenizer / decoder, and the ids of a probe corpus. The verdict is graded:

- ``mismatch`` (critical): tokens both vocabularies hold have different ids, probe texts encode differently, or
  the models' configured vocabulary sizes differ (vLLM refuses to start);
- ``warning``: tokens only one side has (added tokens; a vocabulary padded or extended at the end), special
  tokens or the chat template differ — every shared token still means the same;
- ``compatible``: the same ids, with cosmetic differences (a token's string, the decoder's configuration);
- ``identical``.

The share of the target's vocabulary the draft holds under the same ids bounds acceptance: a token outside it
can never be proposed right.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specscope.core.model import TokenizerStatus

Verdict = Literal["identical", "compatible", "warning", "mismatch"]

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
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Share of the target's vocabulary the draft holds under the same ids: a ceiling on acceptance.
    overlap: float = 1.0
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

    def status(self) -> TokenizerStatus:
        """What the snapshot carries: the verdict, the reasons for it (mismatch) or the warnings, the overlap."""
        return TokenizerStatus(self.verdict, tuple(self.reasons or self.warnings), self.overlap)


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


def _config_vocab(path: str) -> int | None:
    """The model's configured vocabulary size (what vLLM compares), where a config sits beside the tokenizer."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception:
        return None
    cfg = getattr(cfg, "text_config", None) or cfg
    size = getattr(cfg, "vocab_size", None)
    return int(size) if size else None


def compare(target: str, draft: str, probes: tuple[str, ...] = PROBES, max_examples: int = 5) -> Report:
    """Compare the two tokenizers; raises :class:`TokenizerCheckError` when one cannot be loaded."""
    t, d = load(target), load(draft)
    tv, dv = t.get_vocab(), d.get_vocab()
    report = Report(target=target, draft=draft, verdict="identical", vocab_size=(len(t), len(d)))
    reasons, warnings, notes = report.reasons, report.warnings, report.notes
    configured = (_config_vocab(target), _config_vocab(draft))
    if None not in configured and configured[0] != configured[1]:
        reasons.append(f"vocabulary sizes differ: target {configured[0]}, draft {configured[1]} "
                       "(vLLM refuses to start)")
    shared = set(tv) & set(dv)
    differing = sorted(tok for tok in shared if tv[tok] != dv[tok])
    alone = sorted(set(tv) ^ set(dv))
    report.ids_differing = len(differing) + len(alone)
    # Tokens both know under different ids say most; then tokens only one knows.
    telling = differing + alone
    report.id_examples = [(tok, tv.get(tok), dv.get(tok)) for tok in telling[:max_examples]]
    report.overlap = (len(shared) - len(differing)) / max(1, len(tv))
    if differing:
        reasons.append(f"{len(differing)} tokens both vocabularies hold ({len(differing) / max(1, len(shared)):.0%}) "
                       "have different ids: the draft proposes ids that mean other tokens")
    if alone:
        only_t, only_d = sum(1 for tok in alone if tok in tv), sum(1 for tok in alone if tok in dv)
        warnings.append(f"{len(alone)} tokens are in one vocabulary only (target {only_t}, draft {only_d}): added "
                        f"tokens or a padded vocabulary; acceptance is at most {report.overlap:.0%} on them")
    for name in SPECIALS:
        pair = (getattr(t, name, None), getattr(d, name, None))
        ids = (getattr(t, f"{name}_id", None), getattr(d, f"{name}_id", None))
        report.specials[name] = (f"{pair[0]}={ids[0]}", f"{pair[1]}={ids[1]}")
        if ids[0] != ids[1]:
            warnings.append(f"{name} differs: target {pair[0]!r} id {ids[0]}, draft {pair[1]!r} id {ids[1]}")
        elif pair[0] != pair[1]:
            notes.append(f"{name} has the same id but another string: {pair[0]!r} vs {pair[1]!r}")
    added_t = sorted(str(a) for a in t.get_added_vocab())
    added_d = sorted(str(a) for a in d.get_added_vocab())
    report.added_tokens = (added_t, added_d)
    if added_t != added_d:
        warnings.append(f"added tokens differ: {sorted(set(added_t) ^ set(added_d))[:max_examples]}")
    if getattr(t, "chat_template", None) != getattr(d, "chat_template", None):
        warnings.append("chat templates differ (chat requests are rendered with the target's)")
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
    report.verdict = "mismatch" if reasons else "warning" if warnings else "compatible" if notes else "identical"
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
    lines.append(f"vocabulary overlap (same token, same id): {report.overlap:.0%} of the target's, a ceiling on "
                 "acceptance")
    if report.first_divergence:
        fd = report.first_divergence
        lines.append(f"  first divergence in {fd['text']!r} at token {fd['position']}: "
                     f"target {fd['target_ids']} vs draft {fd['draft_ids']}")
    lines += [f"mismatch: {r}" for r in report.reasons] + [f"warning: {w}" for w in report.warnings]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def record_verdict(target: str, draft: str, hub: Any) -> None:
    """Compare ``target``'s and ``draft``'s tokenizers and record the verdict in ``hub``; log a mismatch. Never
    raises: a check that cannot be made (a tokenizer that cannot be loaded) or fails is counted in the hub's
    health, so the missing verdict shows there and in ``specscope top``."""
    import logging

    log = logging.getLogger("specscope")
    try:
        report = compare(target, draft)
    except Exception as exc:
        hub.health.count_error("tokenizer check", exc)  # logged once there
        return
    hub.set_tokenizer(report.status())
    if report.verdict == "mismatch":
        log.warning("specscope: the draft's tokenizer does not match the target's: %s", "; ".join(report.reasons))
    elif report.verdict == "warning":
        log.warning("specscope: the draft's tokenizer differs from the target's (shared tokens keep their ids): "
                    "%s", "; ".join(report.warnings))

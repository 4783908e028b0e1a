"""The workload ``specscope evaluate``, ``specscope calibrate --prompts`` and the demo measure on: a prompts file
(JSON lines or ShareGPT JSON) read into :class:`Prompt`, then tokenized with the target's tokenizer into a
:class:`Workload`."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope.core import classes

#: The fields of a line of a prompts file.
FIELDS = ("prompt", "messages", "class", "max_tokens")
#: The fields of a row specscope's capture writes (:mod:`specscope.engine.capture`), read as its prompt, class and
#: length.
CAPTURED = ("conversations", "input_ids", "loss_mask", "class", "acceptance", "model", "finish_reason")


class InputError(ValueError):
    """Input the evaluation cannot run on (one line; exit code 2)."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of the workload: text, or chat messages (rendered with the target's chat template)."""

    text: str | None = None
    #: (role, content) pairs.
    messages: tuple[tuple[str, str], ...] | None = None
    traffic_class: str | None = None
    max_tokens: int | None = None
    #: The prompt's token ids as the target saw them (a captured row).
    token_ids: tuple[int, ...] | None = None


def load_prompts(path: str) -> tuple[list[Prompt], int]:
    """The prompts of a JSON-lines file (``prompt`` or ``messages``, optional ``class`` and ``max_tokens``; or the
    rows :mod:`specscope.engine.capture` writes: their prompt tokens, class and served length) or of ShareGPT JSON (each
    conversation's first human turn), and how many conversations had no human turn to take."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a prompts file (not UTF-8 text)") from None
    skipped = 0
    if text.lstrip().startswith("["):
        prompts, skipped = _sharegpt(path, text)
    else:
        prompts = [_line(f"{path}:{n}", line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not prompts:
        raise InputError(f"{path} holds no prompts" + (f" ({skipped} conversations without a human turn)"
                                                       if skipped else ""))
    return prompts, skipped


def _sharegpt(path: str, text: str) -> tuple[list[Prompt], int]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({getattr(exc, 'msg', exc)})") from None
    out, skipped = [], 0
    for i, item in enumerate(doc):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise InputError(f"{path}: entry {i} has no \"conversations\" list (ShareGPT JSON: a list of "
                             "{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]})")
        human = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")),
                     None)
        if isinstance(human, str) and human.strip():
            out.append(Prompt(text=human))
        else:
            skipped += 1
    return out, skipped


def _line(where: str, line: str) -> Prompt:
    try:
        d = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(d, dict):
        raise InputError(f"{where}: not a JSON object")
    if "input_ids" in d or "conversations" in d:
        return _captured(where, d)
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    if ("prompt" in d) == ("messages" in d):
        raise InputError(f"{where}: give either \"prompt\" (a string) or \"messages\" (OpenAI chat messages)")
    text, messages = d.get("prompt"), None
    if "prompt" in d and (not isinstance(text, str) or not text.strip()):
        raise InputError(f"{where}: \"prompt\" must be a non-empty string")
    if "messages" in d:
        raw = d["messages"]
        if not isinstance(raw, list) or not raw or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in raw):
            raise InputError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": ..., \"content\": ...}} "
                             "with string values")
        messages = tuple((m["role"], m["content"]) for m in raw)
    n = d.get("max_tokens")
    if "max_tokens" in d and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise InputError(f"{where}: \"max_tokens\" must be a positive integer")
    return Prompt(text, messages, _class(where, d), n)


def _class(where: str, d: dict[str, Any]) -> str | None:
    if d.get("class") is None:
        return None
    cls = classes.clean(d["class"])
    if cls is None and d["class"] not in classes.PROMPT_BUCKETS:
        raise InputError(f"{where}: class {str(d['class'])[:60]!r} is not a class name: up to "
                         f"{classes.MAX_LENGTH} letters, digits and _.:/+- (starting with a letter or digit)")
    return cls or str(d["class"])


def _captured(where: str, d: dict[str, Any]) -> Prompt:
    """A captured row: its prompt tokens (``input_ids`` where ``loss_mask`` is 0) and served length (where it is
    1), else its conversation up to the last assistant turn; its class."""
    unknown = sorted(set(d) - set(CAPTURED))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} in a captured row (fields: {', '.join(CAPTURED)})")
    ids, mask = d.get("input_ids"), d.get("loss_mask")
    if ids is not None:
        if not (isinstance(ids, list) and isinstance(mask, list) and len(ids) == len(mask) and 1 in mask
                and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise InputError(f"{where}: \"input_ids\" and \"loss_mask\" must be lists of the same length, the mask "
                             "1 on the completion")
        start = mask.index(1)
        if not start:
            raise InputError(f"{where}: the row has no prompt (its loss_mask is 1 from the first token)")
        return Prompt(traffic_class=_class(where, d), max_tokens=len(mask) - start, token_ids=tuple(ids[:start]))
    turns = d["conversations"]
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns):
        raise InputError(f"{where}: \"conversations\" must be a list of {{\"from\": ..., \"value\": ...}}")
    roles = [str(t.get("from") or t.get("role")) for t in turns]
    last = max((i for i, r in enumerate(roles) if r in ("assistant", "gpt")), default=len(turns))
    if not last:
        raise InputError(f"{where}: the conversation has no turn before its answer")
    messages = tuple(({"human": "user", "gpt": "assistant"}.get(r, r), t["value"])
                     for r, t in zip(roles[:last], turns[:last], strict=True))
    return Prompt(messages=messages, traffic_class=_class(where, d))


def output_lengths(count: int, mean: int, seed: int = 0) -> list[int]:
    """``count`` output lengths drawn uniformly from half of ``mean`` to 1.5 times it (at least 1), the same for the
    same ``seed``: each prompt's own, as served traffic's vary. With one length for every request a plain engine's
    batch finishes in lockstep and prefills its replacements together, while a speculative engine's requests finish
    apart and prefill one by one: a difference served traffic does not have, which a throughput window then charges
    to speculation alone."""
    rng = random.Random(seed)
    return [rng.randint(max(1, mean - mean // 2), mean + mean // 2) for _ in range(count)]


@dataclass(frozen=True)
class Workload:
    """The prompts as the engines take them: token ids, output lengths and classes, in file order."""

    prompts: list[dict[str, list[int]]]
    max_tokens: list[int]
    classes: list[str | None]
    #: Prompts left out: prompt and max_tokens longer than the engine's max_model_len.
    skipped_long: int
    max_model_len: int


def prepare(prompts: Sequence[Prompt], tokenizer: Any, max_model_len: int, default_max_tokens: int) -> Workload:
    """Tokenize ``prompts`` with the target's tokenizer (chat messages through its chat template), leaving out
    those whose prompt and output do not fit in ``max_model_len``. The classes are interleaved (each class's prompts
    in file order, taken in turn in proportion to their counts), so that a measurement window, which takes the
    prompts from the first, reaches every class however the file is sorted. A prompt without its own
    ``max_tokens`` gets one drawn around ``default_max_tokens`` (:func:`output_lengths`)."""
    out: list[dict[str, list[int]]] = []
    lengths: list[int] = []
    labels: list[str | None] = []
    drawn = output_lengths(len(prompts), default_max_tokens)
    for p, default in zip(_interleaved(prompts), drawn, strict=True):
        if p.token_ids is not None:
            ids = list(p.token_ids)
        elif p.messages is not None:
            try:
                text = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in p.messages],
                                                     tokenize=False, add_generation_prompt=True)
            except Exception as exc:
                raise InputError(f"cannot apply the target's chat template to messages: {exc}") from None
            ids = list(tokenizer.encode(text, add_special_tokens=False))
        else:
            ids = list(tokenizer.encode(p.text))
        n = p.max_tokens or default
        if len(ids) + n > max_model_len:
            continue
        out.append({"prompt_token_ids": ids})
        lengths.append(n)
        labels.append(p.traffic_class)
    return Workload(out, lengths, labels, len(prompts) - len(out), max_model_len)


def _interleaved(prompts: Sequence[Prompt]) -> list[Prompt]:
    """``prompts`` with their classes taken in turn, each in proportion to its count (stable within a class)."""
    by_class: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        by_class.setdefault(p.traffic_class, []).append(p)
    # Each prompt's place: the i-th of a class of n sits at (i + 0.5) / n of the way through the list.
    placed = [((i + 0.5) / len(group), order, p) for order, group in enumerate(by_class.values())
              for i, p in enumerate(group)]
    return [p for _, _, p in sorted(placed, key=lambda x: (x[0], x[1]))]

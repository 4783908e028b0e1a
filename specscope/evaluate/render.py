"""``specscope evaluate``: which draft, and which K, measured before deploying.

Each candidate (a draft model, an EAGLE-3 or EAGLE-1 head, the target's own MTP layers, or n-gram lookup) runs at
each K beside the target without speculation: the two engines take the same prompts with the batch held full at each
batch size (:func:`~specscope.measure.steady_throughput`: greedy, each request's ``max_tokens`` generated),
alternating which goes first, and the speedup at a batch size is the median of the rounds' ratios, with their
spread. One speculative engine is alive at a time beside the plain one. For each candidate: a draft's tokenizer
verdict (a mismatch is refused unless forced; heads run with the target's), acceptance overall, by draft position
and by traffic class, the draft's cost in KV capacity, specscope's predicted speedup (its estimate from the run,
against the plain engine's step times measured right after it) beside the measured one, and the best K at each batch
size (K = 0: remove ``speculative_config``). From those comes vLLM's ``num_speculative_tokens_per_batch_size``
schedule, which is run as configured and measured too: a K = 0 range in it is not plain speed (a draft model or head
still runs a pass a step), so it is chosen only where it beats every K at the price specscope's estimate puts on it.

Candidates are ranked by :data:`RANKING_RULE`.
"""

from __future__ import annotations

import argparse
import gc
import html
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specscope import classes
from specscope.model import ClassCounts

#: The fields of a line of a prompts file.
FIELDS = ("prompt", "messages", "class", "max_tokens")
#: n-gram lookup's settings as a candidate.
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
#: Candidates named by their method alone (no model path): n-gram lookup, and the target's own multi-token-prediction
#: layers.
BY_METHOD = ("ngram", "mtp")
#: Speculative heads, by vLLM's method name: they run with the target's tokenizer and read its hidden states.
HEADS = {"eagle3": "EAGLE-3", "eagle": "EAGLE-1"}
RANKING_RULE = ("the geometric mean, over the batch sizes given, of each candidate's best measured speedup there "
                "(at its best K; refused and failed candidates last)")
#: Exit status of an interrupted run (its partial results are written).
INTERRUPTED = 130


class InputError(ValueError):
    """Input the evaluation cannot run on (one line; exit code 2)."""


class EngineStopped(RuntimeError):
    """The target without speculation stopped: nothing more can be measured (exit code 1, partial results)."""


# ----------------------------------------------------------------------------- prompts
@dataclass(frozen=True)
class Prompt:
    """One prompt of the workload: text, or chat messages (rendered with the target's chat template)."""

    text: str | None = None
    #: (role, content) pairs.
    messages: tuple[tuple[str, str], ...] | None = None
    traffic_class: str | None = None
    max_tokens: int | None = None


def load_prompts(path: str) -> tuple[list[Prompt], int]:
    """The prompts of a JSON-lines file (``prompt`` or ``messages``, optional ``class`` and ``max_tokens``) or of
    ShareGPT JSON (each conversation's first human turn), and how many conversations had no human turn to take."""
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
    cls = None
    if "class" in d:
        cls = classes.clean(d["class"])
        if cls is None:
            raise InputError(f"{where}: class {str(d['class'])[:60]!r} is not a class name: up to "
                             f"{classes.MAX_LENGTH} letters, digits and _.:/+- (starting with a letter or digit)")
    n = d.get("max_tokens")
    if "max_tokens" in d and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise InputError(f"{where}: \"max_tokens\" must be a positive integer")
    return Prompt(text, messages, cls, n)


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
    prompts from the first, reaches every class however the file is sorted."""
    out: list[dict[str, list[int]]] = []
    lengths: list[int] = []
    labels: list[str | None] = []
    for p in _interleaved(prompts):
        if p.messages is not None:
            try:
                text = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in p.messages],
                                                     tokenize=False, add_generation_prompt=True)
            except Exception as exc:
                raise InputError(f"cannot apply the target's chat template to messages: {exc}") from None
            ids = list(tokenizer.encode(text, add_special_tokens=False))
        else:
            ids = list(tokenizer.encode(p.text))
        n = p.max_tokens or default_max_tokens
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


# ----------------------------------------------------------------------------- measurements
@dataclass
class Cell:
    """One engine at one batch size: output tokens/s of each round, with speculation and without."""

    plain: list[float] = field(default_factory=list)
    spec: list[float] = field(default_factory=list)
    #: specscope's predicted speedup here (its estimate from the run against the plain engine's step times), and
    #: its interval where one could be drawn from the run's requests.
    predicted: float | None = None
    interval: tuple[float, float] | None = None

    @property
    def ratios(self) -> list[float]:
        """Each round's speculative / plain throughput."""
        return [s / p for s, p in zip(self.spec, self.plain, strict=True) if p > 0]

    @property
    def speedup(self) -> float | None:
        """The median over rounds; None before any."""
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest round."""
        return (min(self.ratios), max(self.ratios)) if self.ratios else None


@dataclass
class KRun:
    """A candidate at one K: measured cells by batch size, and the acceptance its measured runs saw."""

    k: int
    cells: dict[int, Cell] = field(default_factory=dict)
    acceptance: float | None = None
    alpha: float | None = None
    per_position: tuple[float, ...] = ()
    #: Each traffic class's counts over the measured runs (the hub's, from the finished requests).
    by_class: dict[str, ClassCounts] = field(default_factory=dict)
    #: specscope's price of a K = 0 range in vLLM's schedule, by batch size (``SpeedupEstimate.k0_speedup``).
    k0_price: dict[int, float] = field(default_factory=dict)


@dataclass
class Choice:
    """What to run at one batch size."""

    batch_size: int
    #: The best K measured there, 0 where none beats plain decoding (remove ``speculative_config``).
    best_k: int
    best_speedup: float
    #: The K for vLLM's schedule: a K = 0 range priced at what it costs (the draft still runs a pass a step).
    k: int
    expected: float
    #: specscope's price of a K = 0 range here; None where it has none, and the schedule keeps the best K measured.
    k0_price: float | None = None


@dataclass
class Schedule:
    """The best K by batch size as vLLM's schedule, and that schedule measured as configured."""

    choices: list[Choice]
    ranges: list[tuple[int, int, int]]
    #: The speculative-config keys to set; None: run without speculation (nothing pays at any batch size).
    config: dict[str, Any] | None
    cells: dict[int, Cell] = field(default_factory=dict)
    #: The schedule is this one K throughout: its measurement is that K's.
    same_as_k: int | None = None


@dataclass
class Candidate:
    """A draft model, a head, the target's MTP layers or n-gram lookup, and what was measured of it."""

    name: str
    method: str
    draft: str | None = None
    #: pending, measured, refused (tokenizer mismatch), failed (the engine did not start), or interrupted.
    status: str = "pending"
    note: str | None = None
    tokenizer: dict[str, Any] | None = None
    runs: dict[int, KRun] = field(default_factory=dict)
    schedule: Schedule | None = None
    draft_kv: dict[str, Any] | None = None

    def config(self, k: int) -> dict[str, Any]:
        """Its ``speculative_config`` at K = ``k``."""
        if self.method == "ngram":
            base: dict[str, Any] = dict(NGRAM)
        elif self.draft is None:
            base = {"method": self.method}
        else:
            base = {"method": self.method, "model": self.draft}
        return {**base, "num_speculative_tokens": k}

    def best(self, b: int) -> tuple[int, float] | None:
        """The K measured fastest at batch ``b`` and its speedup; None where nothing was measured there."""
        found = [(x, -k) for k, run in self.runs.items() if b in run.cells and (x := run.cells[b].speedup) is not None]
        if not found:
            return None
        speedup, k = max(found)
        return -k, speedup


@dataclass
class Evaluation:
    """Everything measured, in the order it was."""

    target: str
    settings: dict[str, Any]
    candidates: list[Candidate]
    prompts: dict[str, Any] = field(default_factory=dict)
    partial: bool = False
    note: str | None = None
    seconds: float = 0.0


def choose_schedule(cand: Candidate, batch_sizes: Sequence[int], max_batch: int) -> Schedule | None:
    """The best K at each batch size measured and vLLM's schedule from it; None before anything was measured.

    A measured batch size's K holds from it to the next one measured (the first from batch 1, the last to
    ``max_batch``). A K = 0 range costs what specscope's estimate prices it at, and is never scheduled where it
    has no price; where no K pays at any batch size, the advice is to run without speculation (``config`` None).
    """
    choices = []
    for b in sorted(batch_sizes):
        best = cand.best(b)
        if best is None:
            continue
        k, speedup = best
        prices = [run.k0_price[b] for run in cand.runs.values() if b in run.k0_price]
        k0 = statistics.median(prices) if prices else None
        scheduled, expected = (0, k0) if k0 is not None and k0 > speedup else (k, speedup)
        choices.append(Choice(b, k if speedup > 1.0 else 0, max(speedup, 1.0), scheduled, expected, k0))
    if not choices:
        return None
    ranges: list[tuple[int, int, int]] = []
    for i, c in enumerate(choices):
        start = 1 if i == 0 else c.batch_size
        end = choices[i + 1].batch_size - 1 if i + 1 < len(choices) else max(max_batch, c.batch_size)
        if ranges and ranges[-1][2] == c.k:
            ranges[-1] = (ranges[-1][0], end, c.k)
        else:
            ranges.append((start, end, c.k))
    from specscope.verdict import schedule_config

    config = schedule_config(ranges) if any(c.best_k for c in choices) else None
    same = ranges[0][2] if config is not None and len(ranges) == 1 else None
    return Schedule(choices, ranges, config, cand.runs[same].cells if same else {}, same)


def score(cand: Candidate, batch_sizes: Sequence[int]) -> float | None:
    """The ranking score (:data:`RANKING_RULE`) over the batch sizes measured; None where none was."""
    best = [found[1] for b in batch_sizes if (found := cand.best(b)) is not None]
    return math.exp(sum(math.log(x) for x in best) / len(best)) if best else None


def rank(candidates: Sequence[Candidate], batch_sizes: Sequence[int]) -> list[tuple[Candidate, float | None]]:
    """The candidates, best first, with their scores (:data:`RANKING_RULE`)."""
    scored = [(c, score(c, batch_sizes)) for c in candidates]
    return sorted(scored, key=lambda cs: (cs[0].status in ("refused", "failed"), cs[1] is None, -(cs[1] or 0.0)))


# ----------------------------------------------------------------------------- running
def _shutdown(llm: Any) -> None:
    """Stop an engine's worker processes now; never raises (an interrupted engine may be half gone)."""
    try:
        from specscope import uninstrument

        uninstrument(llm)
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    gc.collect()


class Runner:
    """Runs the engines: the plain target throughout, one speculative engine at a time beside it."""

    def __init__(self, target: str, engine_kw: dict[str, Any], rounds: int, window_s: float,
                 progress: Callable[[str], None]) -> None:
        self.target, self.engine_kw, self.rounds, self.window_s = target, engine_kw, rounds, window_s
        self.progress = progress
        self.plain: Any = None
        self.spec: Any = None
        #: Seconds an engine start, a window and a calibration took (for the time left).
        self.took: dict[str, list[float]] = {"start": [], "window": [], "calibration": []}
        self.todo: dict[str, int] = {"start": 0, "window": 0, "calibration": 0}

    def start_plain(self) -> tuple[Any, int, int]:
        """Start the target without speculation: its tokenizer, max_model_len and max_num_seqs."""
        import specscope

        self.plain = specscope.LLM(self.target, specscope_hub=specscope.Hub(), **self.engine_kw)
        config = self.plain.llm_engine.vllm_config
        return self.plain.get_tokenizer(), config.model_config.max_model_len, config.scheduler_config.max_num_seqs

    def close(self) -> None:
        """Stop every engine still running."""
        for llm in (self.spec, self.plain):
            if llm is not None:
                _shutdown(llm)
        self.spec = self.plain = None

    # -- time left
    def _plan(self, candidates: int, ks: int, batches: int) -> None:
        """What is left for ``candidates`` more candidates (each: its Ks and maybe a schedule run)."""
        self.todo = {"start": candidates * (ks + 1), "window": candidates * (ks + 1) * self.rounds * batches * 2,
                     "calibration": candidates * ks}

    def _done(self, kind: str, seconds: float) -> None:
        self.took[kind].append(seconds)
        self.todo[kind] = max(0, self.todo[kind] - 1)

    def left(self) -> str:
        """The time left, estimated from what each kind of work took so far."""
        guess = {"start": 40.0, "window": self.window_s * 1.1 + 0.5, "calibration": 10.0}
        s = sum(n * (statistics.mean(self.took[kind]) if self.took[kind] else guess[kind])
                for kind, n in self.todo.items())
        return f"about {int(s // 60)}m{int(s % 60):02d}s left"

    # -- measuring
    def run(self, ev: Evaluation, work: Workload, max_batch: int) -> None:
        """Measure every candidate not refused, filling ``ev`` as it goes (an interrupt leaves what was measured)."""
        ks, sizes = ev.settings["k"], ev.settings["batch_sizes"]
        todo = [c for c in ev.candidates if c.status == "pending"]
        self._warm(self.plain, work, sizes)
        for i, cand in enumerate(todo):
            self._plan(len(todo) - i, len(ks), len(sizes))
            label = f"[{i + 1}/{len(todo)} {_short(cand)}]"
            try:
                for k in ks:
                    run = cand.runs.setdefault(k, KRun(k))
                    self.spec = self._start(cand.config(k))
                    hub = self._measure(self.spec, run.cells, work, sizes, f"{label} K={k}")
                    self._predict(cand, run, hub, work, sizes)
                    _shutdown(self.spec)
                    self.spec = None
                cand.schedule = choose_schedule(cand, sizes, max_batch)
                sched = cand.schedule
                if sched is not None and sched.config is not None and sched.same_as_k is None:
                    self.spec = self._start({**cand.config(1), **sched.config})
                    self._measure(self.spec, sched.cells, work, sizes, f"{label} schedule")
                    _shutdown(self.spec)
                    self.spec = None
                cand.status = "measured"
            except KeyboardInterrupt:
                cand.status = "interrupted"
                if cand.runs and cand.schedule is None:
                    cand.schedule = choose_schedule(cand, sizes, max_batch)
                raise
            except Exception as exc:  # a configuration vLLM refuses: that candidate fails, the others go on
                cand.status, cand.note = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                self.progress(f"{label} failed: {cand.note}")
                if self.spec is not None:
                    _shutdown(self.spec)
                    self.spec = None
                if getattr(getattr(self.plain.llm_engine.engine_core, "resources", None), "engine_dead", False):
                    raise EngineStopped(f"the target without speculation stopped ({cand.note})") from None

    def _start(self, spec_config: dict[str, Any]) -> Any:
        import specscope

        t0 = time.monotonic()
        llm = specscope.LLM(self.target, specscope_hub=specscope.Hub(), speculative_config=spec_config,
                            **self.engine_kw)
        self._done("start", time.monotonic() - t0)
        return llm

    def _warm(self, llm: Any, work: Workload, sizes: Sequence[int]) -> None:
        """A few tokens at each batch size: a fresh engine's first steps are slower."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        for b in sizes:
            llm.generate([work.prompts[i % len(work.prompts)] for i in range(b)], params, use_tqdm=False)

    def _measure(self, spec: Any, cells: dict[int, Cell], work: Workload, sizes: Sequence[int], label: str) -> Any:
        """Rounds of plain and speculative throughput at each batch size (which goes first alternating); returns
        the hub that recorded the speculative engine's measured runs."""
        import specscope
        from specscope.measure import steady_throughput

        self._warm(spec, work, sizes)
        hub = specscope.Hub(window_s=3600, max_requests=100_000)
        specscope.instrument(spec, hub)
        for r in range(self.rounds):
            for i, b in enumerate(sizes):
                cell = cells.setdefault(b, Cell())
                tok_s = {}
                for name in (("plain", "spec") if (r + i) % 2 == 0 else ("spec", "plain")):
                    t0 = time.monotonic()
                    tok_s[name] = steady_throughput(self.plain if name == "plain" else spec, b, self.window_s,
                                                    work.prompts, work.max_tokens, work.classes)
                    self._done("window", time.monotonic() - t0)
                cell.plain.append(tok_s["plain"])
                cell.spec.append(tok_s["spec"])
                self.progress(f"{label} batch {b} round {r + 1}/{self.rounds}: {tok_s['spec'] / tok_s['plain']:.2f}x "
                              f"(plain {tok_s['plain']:.0f} tok/s, speculative {tok_s['spec']:.0f}); {self.left()}")
        return hub

    def _predict(self, cand: Candidate, run: KRun, hub: Any, work: Workload, sizes: Sequence[int]) -> None:
        """specscope's estimate of the run against the plain engine's step times measured now; acceptance by
        position and class; the draft's KV cost."""
        from specscope.measure import measure_step_times
        from specscope.memory import draft_kv_cost
        from specscope.verdict import estimate

        t0 = time.monotonic()
        # On the workload's own prompts: the contexts the runs attend over, with no slope to extrapolate along.
        hub.set_baseline(measure_step_times(self.plain, sizes, tokens=64, rounds=1, prompts=work.prompts, contexts=1))
        self._done("calibration", time.monotonic() - t0)
        snap = hub.snapshot()
        for b in sizes:
            est = estimate(snap, batch_size=b)
            if est is not None and b in run.cells:
                run.cells[b].predicted, run.cells[b].interval = est.expected_speedup, est.interval
                run.k0_price[b] = est.k0_speedup
        spec = snap.lifetime.spec
        if spec is not None:
            run.acceptance, run.alpha, run.per_position = spec.acceptance_rate, spec.alpha, tuple(spec.per_position)
        run.by_class = {tc.name: tc.lifetime for tc in snap.classes if tc.lifetime.draft_tokens}
        kv = draft_kv_cost(snap)
        if kv is not None and cand.draft_kv is None:
            cand.draft_kv = {"blocks": round(kv.blocks, 1), "share": round(kv.share, 4), "text": kv.explain()}


# ----------------------------------------------------------------------------- writers
def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _cell_dict(c: Cell) -> dict[str, Any]:
    lo_hi = c.spread
    return {"speedup": _r(c.speedup), "min": _r(lo_hi[0]) if lo_hi else None, "max": _r(lo_hi[1]) if lo_hi else None,
            "rounds": [_r(x) for x in c.ratios], "plain_tok_s": [_r(x, 1) for x in c.plain],
            "speculative_tok_s": [_r(x, 1) for x in c.spec], "predicted": _r(c.predicted),
            "predicted_interval": None if c.interval is None else [_r(c.interval[0]), _r(c.interval[1])]}


def to_dict(ev: Evaluation) -> dict[str, Any]:
    """The evaluation as JSON-ready data (batch sizes and K as string keys)."""
    sizes = ev.settings["batch_sizes"]
    ranked = rank(ev.candidates, sizes)
    cands = []
    for c, s in ranked:
        sched = c.schedule
        cands.append({
            "name": c.name, "method": c.method, "draft": c.draft, "status": c.status, "note": c.note,
            "score": _r(s), "tokenizer": c.tokenizer, "draft_kv_cost": c.draft_kv,
            "by_k": {str(k): {
                "acceptance": _r(run.acceptance), "alpha": _r(run.alpha),
                "per_position": [_r(x) for x in run.per_position],
                "by_class": {name: {"requests": a.requests, "drafted": a.draft_tokens, "accepted": a.accepted,
                                    "acceptance": _r(a.acceptance_rate),
                                    "per_position": [_r(x) for x in a.per_position]}
                             for name, a in sorted(run.by_class.items())},
                "k0_price": {str(b): _r(x) for b, x in sorted(run.k0_price.items())},
                "batch": {str(b): _cell_dict(cell) for b, cell in sorted(run.cells.items())},
            } for k, run in sorted(c.runs.items())},
            "schedule": None if sched is None else {
                "best": {str(ch.batch_size): {"best_k": ch.best_k, "best_speedup": _r(ch.best_speedup),
                                              "schedule_k": ch.k, "expected": _r(ch.expected),
                                              "k0_price": _r(ch.k0_price)}
                         for ch in sched.choices},
                "ranges": [list(r) for r in sched.ranges],
                "speculative_config": sched.config,
                "verdict": _verdict(sched),
                "same_as_k": sched.same_as_k,
                "measured": {str(b): _cell_dict(cell) for b, cell in sorted(sched.cells.items())},
            },
        })
    return {"specscope_evaluate": 1, "target": ev.target, "partial": ev.partial, "note": ev.note,
            "seconds": round(ev.seconds, 1), "settings": ev.settings, "prompts": ev.prompts,
            "ranking_rule": RANKING_RULE, "ranking": [c.name for c, _ in ranked], "candidates": cands}


def _verdict(sched: Schedule) -> str:
    if sched.config is None:
        return "run without speculation: no K pays at any batch size measured (remove speculative_config)"
    losing = [c for c in sched.choices if c.best_k == 0]
    if not losing:
        return "speculate with this schedule"
    unpriced = [str(c.batch_size) for c in losing if c.k0_price is None]
    return ("speculate with this schedule; at batch " + ", ".join(str(c.batch_size) for c in losing)
            + " no K pays, and its range there is not plain speed (" + ", ".join(f"{c.expected:.2f}x" for c in losing)
            + (f"; K = 0 unpriced at batch {', '.join(unpriced)}: the best K measured kept" if unpriced else "")
            + "): if the engine runs there most, run without speculation instead")


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _cell_text(c: Cell | None) -> str:
    if c is None or c.speedup is None:
        return "n/a"
    lo, hi = c.spread or (c.speedup, c.speedup)
    spread = f" [{lo:.2f}-{hi:.2f}]" if len(c.ratios) > 1 else ""
    interval = f" {c.interval[0]:.2f}-{c.interval[1]:.2f}" if c.interval is not None else ""
    return f"{c.speedup:.2f}x{spread}" + (f" (pred {c.predicted:.2f}x{interval})" if c.predicted is not None else "")


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def render_text(ev: Evaluation) -> str:
    """The evaluation for a terminal."""
    s, p = ev.settings, ev.prompts
    sizes = s["batch_sizes"]
    lines = [f"specscope evaluate: {ev.target}; K {', '.join(map(str, s['k']))}; batch sizes "
             f"{', '.join(map(str, sizes))}; {s['rounds']} round(s) of {s['window_s']:g} s windows"
             + (" — PARTIAL: " + (ev.note or "interrupted") if ev.partial else ""),
             f"prompts: {p.get('used', 0)} used; {p.get('skipped_long', 0)} skipped (prompt + max_tokens longer "
             f"than max_model_len {p.get('max_model_len', '?')}); classes "
             + ", ".join(f"{k} {v}" for k, v in p.get("classes", {}).items()),
             f"ranking: {RANKING_RULE}"]
    for n, (c, sc) in enumerate(rank(ev.candidates, sizes), 1):
        tok = f"; tokenizer {c.tokenizer['verdict']}" if c.tokenizer else ""
        lines.append(f"{n}. {c.name} ({c.method}) score {_x(sc)}{tok}; {c.status}"
                     + (f": {c.note}" if c.note else ""))
        if c.draft_kv:
            lines.append(f"   KV: {c.draft_kv['text']}")
        for k, run in sorted(c.runs.items()):
            lines.append(f"   K={k}: " + "  ".join(f"batch {b} {_cell_text(run.cells.get(b))}" for b in sizes))
            said = [f"by position {' '.join(_pct(x) for x in run.per_position)}"] if run.per_position else []
            if run.by_class:
                said.append("by class " + ", ".join(f"{name} {_pct(a.acceptance_rate)} ({a.requests} requests)"
                                                    for name, a in sorted(run.by_class.items())))
            lines.append(f"        acceptance {_pct(run.acceptance)}" + (f" ({'; '.join(said)})" if said else ""))
        sched = c.schedule
        if sched is None:
            continue
        lines.append("   best K: " + "; ".join(
            f"batch {ch.batch_size} " + (f"K={ch.best_k} {ch.best_speedup:.2f}x" if ch.best_k else
                                         "none pays (remove speculative_config)") for ch in sched.choices))
        lines.append(f"   {_verdict(sched)}")
        if sched.config is not None:
            lines.append("   speculative_config: " + json.dumps(sched.config))
            lines.append("   schedule measured: " + "  ".join(
                f"batch {ch.batch_size} (K={ch.k}) {_cell_text(sched.cells.get(ch.batch_size))}"
                for ch in sched.choices) + (f" (the schedule is K={sched.same_as_k} throughout)"
                                            if sched.same_as_k is not None else ""))
    return "\n".join(lines) + "\n"


def _short(c: Candidate) -> str:
    return Path(c.name).name or c.name


def _speedup_bars(ev: Evaluation) -> Callable[[Any], None]:
    sizes = ev.settings["batch_sizes"]
    cands = [c for c, _ in rank(ev.candidates, sizes)]

    def draw(ax: Any) -> None:
        width = 0.8 / max(1, 2 * len(cands))
        for i, c in enumerate(cands):
            for j, kind in enumerate(("best K", "schedule")):
                xs, ys, lo, hi, labels = [], [], [], [], []
                for x, b in enumerate(sizes):
                    if kind == "best K":
                        best = c.best(b)
                        cell = c.runs[best[0]].cells[b] if best else None
                        label = f"K={best[0]}" if best else ""
                    else:
                        cell = c.schedule.cells.get(b) if c.schedule and c.schedule.config else None
                        label = ""
                    if cell is None or cell.speedup is None:
                        continue
                    mn, mx = cell.spread or (cell.speedup, cell.speedup)
                    xs.append(x + (2 * i + j + 0.5) * width - 0.4)
                    ys.append(cell.speedup)
                    lo.append(cell.speedup - mn)
                    hi.append(mx - cell.speedup)
                    labels.append(label)
                if not xs:
                    continue
                bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=f"C{i}",
                              alpha=1.0 if j == 0 else 0.45, hatch="" if j == 0 else "//",
                              label=f"{_short(c)}: {kind}")
                for bar, label in zip(bars, labels, strict=True):
                    if label:
                        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                                    va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(sizes)), [f"batch {b}" for b in sizes])
        ax.set_ylabel("measured speedup (median; bars: min-max)")
        ax.set_title("Measured speedup over no speculation")
        ax.legend(fontsize=7, ncol=2)

    return draw


def _class_bars(c: Candidate) -> Callable[[Any], None]:
    names = sorted({name for run in c.runs.values() for name in run.by_class})
    ks = sorted(k for k, run in c.runs.items() if run.by_class)

    def draw(ax: Any) -> None:
        width = 0.8 / max(1, len(ks))
        for j, k in enumerate(ks):
            rates = [(c.runs[k].by_class.get(n) or ClassCounts()).acceptance_rate or 0.0 for n in names]
            ax.bar([x + (j + 0.5) * width - 0.4 for x in range(len(names))], rates, width, label=f"K={k}")
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("acceptance (accepted / drafted)")
        ax.set_title(f"{_short(c)}: acceptance by traffic class")
        ax.legend(fontsize=8)

    return draw


def _predicted_vs_measured(ev: Evaluation) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        top = 1.0
        for i, (c, _) in enumerate(rank(ev.candidates, ev.settings["batch_sizes"])):
            pts = [(cell.speedup, cell.predicted) for run in c.runs.values() for cell in run.cells.values()
                   if cell.speedup is not None and cell.predicted is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, "o", color=f"C{i}", label=_short(c))
                top = max(top, *xs, *ys)
        ax.plot([0, top * 1.05], [0, top * 1.05], "--", color="gray", linewidth=0.8)
        ax.set_xlabel("measured speedup")
        ax.set_ylabel("specscope's predicted speedup")
        ax.set_title("Predicted against measured (each K and batch size)")
        ax.legend(fontsize=8)

    return draw


def render_html(ev: Evaluation) -> str:
    """One self-contained page (plots as embedded PNGs)."""
    from specscope.report import _CSS, _img, _na, _png, _table

    s, p, sizes = ev.settings, ev.prompts, ev.settings["batch_sizes"]
    title = f"specscope evaluate: {ev.target}"
    out = [f"<h1>{html.escape(title)}</h1>"]
    if ev.partial:
        out.append(f"<p><strong>PARTIAL: {html.escape(ev.note or 'interrupted')}</strong>; what was measured "
                   "before it stopped.</p>")
    out.append(f"<p>K {', '.join(map(str, s['k']))}; batch sizes {', '.join(map(str, sizes))} held full; "
               f"{s['rounds']} round(s) of {s['window_s']:g} s windows, plain and speculative alternating; "
               f"{p.get('used', 0)} prompts ({p.get('skipped_long', 0)} longer than max_model_len "
               f"{p.get('max_model_len', '?')} skipped); classes "
               + html.escape(", ".join(f"{k} {v}" for k, v in p.get("classes", {}).items()))
               + f"; took {ev.seconds / 60:.1f} min</p>")
    ranked = rank(ev.candidates, sizes)
    out.append("<h2>Ranking</h2>" + f"<p>By {html.escape(RANKING_RULE)}.</p><div class='rank'>" + _table(
        ["#", "candidate", "score", *(f"batch {b}: best K" for b in sizes), "verdict"],
        [(n, _short(c), _x(sc), *(_best_text(c, b) for b in sizes),
          _verdict(c.schedule) if c.schedule else f"{c.status}{': ' + c.note if c.note else ''}")
         for n, (c, sc) in enumerate(ranked, 1)]) + "</div>")
    cells = [cell for c in ev.candidates for run in c.runs.values() for cell in run.cells.values()]
    if any(cell.speedup is not None for cell in cells):
        out.append(_img(_png(_speedup_bars(ev), height=3.8), "measured speedup by batch size"))
    if any(cell.speedup is not None and cell.predicted is not None for cell in cells):
        out.append(_img(_png(_predicted_vs_measured(ev), width=5.0, height=4.0), "predicted against measured"))
    for c, sc in ranked:
        out.append(f"<h2>{html.escape(c.name)} ({html.escape(c.method)}): {_x(sc)}</h2>")
        facts = [f"status: {c.status}" + (f" ({c.note})" if c.note else "")]
        if c.tokenizer:
            why = [*c.tokenizer.get("reasons", []), *c.tokenizer.get("warnings", [])]
            facts.append(f"tokenizer: {c.tokenizer['verdict']}" + "".join(f"; {x}" for x in why))
        facts.append("KV capacity: " + (c.draft_kv["text"] if c.draft_kv else "no draft model, or not known"))
        out.append("<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in facts) + "</ul>")
        if not c.runs:
            continue
        out.append(_table(["K", "acceptance", "alpha", "by position",
                           *(f"batch {b}: measured [min-max] (predicted, its interval)" for b in sizes)],
                          [(k, _pct(run.acceptance), _x(run.alpha).rstrip("x"),
                            " ".join(_pct(x) for x in run.per_position),
                            *(_cell_text(run.cells.get(b)) for b in sizes)) for k, run in sorted(c.runs.items())]))
        if any(run.by_class for run in c.runs.values()):
            out.append(_img(_png(_class_bars(c), height=2.8), f"{c.name}: acceptance by class"))
            out.append(_table(["K", "class", "requests", "drafted", "accepted", "acceptance", "by position"],
                              [(k, name, a.requests, a.draft_tokens, a.accepted, _pct(a.acceptance_rate),
                                " ".join(_pct(x) for x in a.per_position))
                               for k, run in sorted(c.runs.items()) for name, a in sorted(run.by_class.items())]))
        sched = c.schedule
        if sched is not None:
            out.append("<h3>Schedule</h3>" + _table(
                ["batch", "best K (0: remove speculative_config)", "its speedup", "K in vLLM's schedule",
                 "expected", "schedule measured [min-max]"],
                [(ch.batch_size, ch.best_k, _x(ch.best_speedup), ch.k, _x(ch.expected),
                  _cell_text(sched.cells.get(ch.batch_size)) if sched.config else "not run")
                 for ch in sched.choices]))
            out.append(f"<p>{html.escape(_verdict(sched))}</p>")
            if sched.config is not None:
                out.append("<pre style='white-space:pre-wrap'>" + html.escape(json.dumps({"speculative_config": {
                    **{k: v for k, v in c.config(1).items() if k != "num_speculative_tokens"}, **sched.config}}))
                    + "</pre>")
        elif c.status == "measured":
            out.append(_na("no schedule: nothing measured"))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}.rank td:last-child{{text-align:left}}</style></head><body>{''.join(out)}</body></html>")


def _best_text(c: Candidate, b: int) -> str:
    ch = next((x for x in c.schedule.choices if x.batch_size == b), None) if c.schedule else None
    if ch is None:
        return "n/a"
    return f"K={ch.best_k} {ch.best_speedup:.2f}x" if ch.best_k else "none pays"


# ----------------------------------------------------------------------------- command
def _ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise InputError(f"{flag} takes positive integers like 1,4,16, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evaluate`` subcommand's arguments."""
    parser.add_argument("target", help="target model (as for vllm.LLM)")
    parser.add_argument("--draft", action="append", default=[], metavar="MODEL",
                        help="a draft model to evaluate (draft_model speculation); repeatable")
    for method, name in HEADS.items():
        parser.add_argument(f"--{method}", action="append", default=[], metavar="HEAD",
                            help=f"an {name} head to evaluate (method {method}; it runs with the target's "
                            "tokenizer); repeatable")
    parser.add_argument("--method", action="append", default=[], choices=list(BY_METHOD),
                        help="a method to evaluate that needs no model path (ngram: prompt_lookup_min 2, max 4; mtp: "
                        "the target's own multi-token-prediction layers)")
    parser.add_argument("--k", default="1,2,4,6", help="comma-separated K to measure (default 1,2,4,6)")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="JSON lines ({\"prompt\": ...} or {\"messages\": [...]}, optional \"class\" and "
                        "\"max_tokens\"), or ShareGPT JSON (each conversation's first human turn)")
    parser.add_argument("--batch-sizes", default="1,4,16", help="comma-separated batch sizes (default 1,4,16)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement; the median is kept (default 3)")
    parser.add_argument("--window-s", type=float, default=10.0,
                        help="seconds each measurement holds its batch full (default 10)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="output tokens of a prompt without max_tokens (default 128)")
    parser.add_argument("--engine-arg", action="append", metavar="NAME=VALUE",
                        help="a vllm.LLM argument for every engine; VALUE is JSON when it parses (e.g. "
                        "max_model_len=1024); prefix caching is off unless set here")
    parser.add_argument("-o", "--out", metavar="FILE", help="write the HTML report (plots embedded) to FILE")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--force", action="store_true", help="measure drafts whose tokenizer mismatches the target's")


def main(args: argparse.Namespace, engine_kw: dict[str, Any]) -> int:
    """Run ``specscope evaluate``: exit 0 done, 2 bad input, 1 the plain engine stopped and 130 interrupted (both
    with what was measured written, marked partial)."""
    def fail(message: str) -> int:
        print(f"specscope: error: {message}", file=sys.stderr)
        return 2

    try:
        ks, sizes = _ints(args.k, "--k"), _ints(args.batch_sizes, "--batch-sizes")
        if args.rounds < 1 or not args.window_s > 0 or args.max_tokens < 1:
            raise InputError("--rounds and --max-tokens take positive integers, --window-s a positive number")
        models = [*args.draft, *(h for m in HEADS for h in getattr(args, m))]
        if not models and not args.method:
            raise InputError("name at least one candidate: --draft MODEL, --eagle3 HEAD, --eagle HEAD or --method "
                             "ngram|mtp")
        if len(set(models)) < len(models) or len(set(args.method)) < len(args.method):
            raise InputError("each candidate once: a model or --method is named twice")
        if "speculative_config" in engine_kw:
            raise InputError("candidates come from --draft, --eagle3, --eagle and --method; drop speculative_config "
                             "from --engine-arg")
        if args.out:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise InputError("the HTML report draws with matplotlib: pip install 'specscope[report]'") from None
        for path in (args.out, args.json):
            if path and not Path(path).resolve().parent.is_dir():
                raise InputError(f"cannot write {path}: no such directory")
        prompts, no_human = load_prompts(args.prompts)
        candidates = _candidates(args)
    except InputError as exc:
        return fail(str(exc))
    if all(c.status == "refused" for c in candidates):
        return fail("every draft's tokenizer mismatches the target's (see check-tokenizers); --force measures them")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the progress lines readable
    engine_kw = {"enable_prefix_caching": False, **engine_kw}  # every round repeats the prompts
    settings = {"k": ks, "batch_sizes": sizes, "rounds": args.rounds, "window_s": args.window_s,
                "max_tokens": args.max_tokens, "engine_args": engine_kw, "prompts_file": args.prompts}
    ev = Evaluation(args.target, settings, candidates)
    for c in candidates:
        if c.status == "refused":
            print(f"specscope evaluate: {c.name}: {c.note}", file=sys.stderr)
    runner = Runner(args.target, engine_kw, args.rounds, args.window_s,
                    lambda line: print(f"specscope evaluate: {line}", file=sys.stderr, flush=True))
    t0 = time.monotonic()
    code = 0
    try:
        print(f"specscope evaluate: starting {args.target} without speculation", file=sys.stderr, flush=True)
        try:
            tokenizer, max_model_len, max_num_seqs = runner.start_plain()
        except Exception as exc:
            return fail(f"the engine did not start: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                        if str(exc) else f"the engine did not start: {type(exc).__name__}")
        try:
            work = prepare(prompts, tokenizer, max_model_len, args.max_tokens)
            if not work.prompts:
                raise InputError(f"no prompt fits: every prompt with its max_tokens is longer than max_model_len "
                                 f"{max_model_len}")
            if sizes[-1] > max_num_seqs:
                raise InputError(f"batch size {sizes[-1]} is above the engine's max_num_seqs {max_num_seqs}")
        except InputError as exc:
            return fail(str(exc))
        counts: dict[str, int] = {}
        for cls in work.classes:
            counts[cls or "(prompt-length bucket)"] = counts.get(cls or "(prompt-length bucket)", 0) + 1
        ev.prompts = {"used": len(work.prompts), "skipped_long": work.skipped_long,
                      "no_human_turn": no_human, "max_model_len": max_model_len, "classes": counts}
        if work.skipped_long:
            print(f"specscope evaluate: {work.skipped_long} prompts skipped: prompt + max_tokens longer than "
                  f"max_model_len {max_model_len}", file=sys.stderr)
        runner.run(ev, work, max_num_seqs)
    except KeyboardInterrupt:
        ev.partial, ev.note, code = True, "interrupted (Ctrl-C)", INTERRUPTED
        print("specscope evaluate: interrupted; writing what was measured", file=sys.stderr)
    except EngineStopped as exc:
        ev.partial, ev.note, code = True, str(exc), 1
        print(f"specscope evaluate: {exc}; writing what was measured", file=sys.stderr)
    finally:
        runner.close()
    ev.seconds = time.monotonic() - t0
    return _write(ev, args) or code


def _candidates(args: argparse.Namespace) -> list[Candidate]:
    """The candidates, drafts' tokenizers checked (a mismatch refused unless ``--force``; heads run with the
    target's)."""
    from specscope.tokenizer_check import TokenizerCheckError, compare

    out = []
    for draft in args.draft:
        try:
            report = compare(args.target, draft)
        except TokenizerCheckError as exc:
            raise InputError(str(exc)) from None
        c = Candidate(draft, "draft_model", draft,
                      tokenizer={"verdict": report.verdict, "reasons": list(report.reasons),
                                 "warnings": list(report.warnings)})
        if report.verdict == "mismatch" and not args.force:
            c.status = "refused"
            c.note = "tokenizer mismatch (" + "; ".join(report.reasons)[:300] + "); --force measures it anyway"
        out.append(c)
    out += [Candidate(head, m, head) for m in HEADS for head in getattr(args, m)]
    out += [Candidate(m, m) for m in args.method]
    return out


def _write(ev: Evaluation, args: argparse.Namespace) -> int:
    """Print the summary and write the files asked for; 2 where one cannot be written."""
    sys.stdout.write(render_text(ev))
    try:
        if args.json:
            Path(args.json).write_text(json.dumps(to_dict(ev), indent=1) + "\n", encoding="utf-8")
            print(f"wrote {args.json}")
        if args.out:
            Path(args.out).write_text(render_html(ev), encoding="utf-8")
            print(f"wrote {args.out}")
    except OSError as exc:
        print(f"specscope: error: cannot write the results: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0

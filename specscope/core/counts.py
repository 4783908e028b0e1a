"""Interval counts, defined once: what engine steps add, summed in one-second buckets and over the lifetime.

Over 400 lines on purpose: a step, its columns, the per-second counts and the ring that keeps them are one
structure, changed together.

:class:`StepStats` is one step; :class:`StepBatch` is consecutive steps of one engine column by column, as
:mod:`specscope.engine.vllm_stats` reads them from vLLM and as everything here counts them. :class:`StepTimer`
says how long each step took; :class:`Counts` adds both up for an interval; :class:`Ring` keeps one ``Counts`` per
second for the sliding window, preallocated so that memory stays flat, and folds each finished second into the
lifetime. One engine's stream of them is :class:`specscope.state.streams.EngineStream`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple, TypeVar

from specscope.core.model import SpecCounts, StepProfile, StepTime, Totals

#: The scalar counts of an interval, each with the step field it sums (the only place that maps the two; ``steps``
#: counts steps).
_SOURCES = (("steps", None), ("prompt_tokens", "prompt_tokens"), ("generation_tokens", "generation_tokens"),
            ("requests", "finished"), ("preemptions", "preemptions"), ("pc_queries", "prefix_cache_queries"),
            ("pc_hits", "prefix_cache_hits"), ("drafts", "drafts"), ("draft_tokens", "draft_tokens"),
            ("accepted", "accepted"), ("rejections", "rejections"), ("prefills", "first_tokens"))
SCALARS = tuple(name for name, _ in _SOURCES)
#: Distinct batch sizes kept per interval (vLLM's max_num_seqs is 256 to 1024 in practice).
MAX_BATCH_SIZES = 1024
N = TypeVar("N", int, float)
#: The most tokens a request runs in a forward that the fit of the target's forward takes
#: (:func:`forward_moments`): a verify forward runs K+1, a short prompt's prefill a few dozen; long prompts'
#: forwards, whose attention over themselves grows faster than their tokens, are left out.
FIT_TOKENS_PER_REQUEST = 64


def forward_moments(forwards: Sequence[tuple[int, int, int, float]]) -> list[float]:
    """The sums a least-squares fit of a forward's seconds over ``a + b·requests + c·tokens`` needs, each forward a
    point: n, Σr, Σt, Σr², Σrt, Σt², Σy, Σry, Σty over ``(requests, tokens, count, seconds)`` rows (those of at most
    :data:`FIT_TOKENS_PER_REQUEST` tokens a request). Sums add and subtract over intervals like every count, so
    they are counted here with the rest of an interval (:meth:`Counts.add_forwards`); the fit itself is the
    verdict's (:func:`specscope.verdict.forward.fit_forward`)."""
    out = [0.0] * 9
    for r, t, c, s in forwards:
        if t <= r * FIT_TOKENS_PER_REQUEST:
            out[:] = map(operator.add, out, (c, c * r, c * t, c * r * r, c * r * t, c * t * t, s, r * s, t * s))
    return out


@dataclass(slots=True)
class StepStats:
    """What one engine step reports, already read out of vLLM's objects."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    finished_tokens: int = 0
    num_spec_tokens: int | None = None
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: Sequence[int] = ()
    draft_tokens_per_pos: Sequence[int] = ()
    rejections: int = 0
    #: The requests the step ran (running after it plus those it finished); None when unknown.
    batch: int | None = None
    #: A pure decode step's duration in the engine core (every request decoded, none was in prefill).
    decode_s: float | None = None
    #: The step carried prefill: a prompt chunk, or a request's first token.
    prefill: bool = False
    #: Requests whose prefill ended in this step, and the shortest of their times to first token (which bounds
    #: the step's duration).
    first_tokens: int = 0
    first_token_s: float | None = None
    #: Of a pure decode step's requests, those this process holds the numbers of, where vLLM split them among
    #: several API-server processes; None: all of them.
    seen: int | None = None


class StepBatch(NamedTuple):
    """Consecutive steps of one engine, column by column: the time each step was reported at (the hub's clock),
    then one sequence per :class:`StepStats` field, of the same name, in the same order."""

    times: Sequence[float]
    running: Sequence[int | None]
    waiting: Sequence[int | None]
    kv_usage: Sequence[float | None]
    preemptions: Sequence[int]
    prefix_cache_queries: Sequence[int]
    prefix_cache_hits: Sequence[int]
    prompt_tokens: Sequence[int]
    generation_tokens: Sequence[int]
    finished: Sequence[int]
    finished_tokens: Sequence[int]
    num_spec_tokens: Sequence[int | None]
    drafts: Sequence[int]
    draft_tokens: Sequence[int]
    accepted: Sequence[int]
    accepted_per_pos: Sequence[Sequence[int]]
    draft_tokens_per_pos: Sequence[Sequence[int]]
    rejections: Sequence[int]
    batch: Sequence[int | None]
    decode_s: Sequence[float | None]
    prefill: Sequence[bool]
    first_tokens: Sequence[int]
    first_token_s: Sequence[float | None]
    seen: Sequence[int | None]

    @classmethod
    def of(cls, steps: Sequence[tuple[float, StepStats]]) -> StepBatch:
        """The batch of ``(time, step)`` pairs."""
        return cls([t for t, _ in steps], *(zip(*map(_STEP_ROW, (s for _, s in steps)), strict=True)
                                            if steps else [()] * len(STEP_FIELDS)))

    def part(self, start: int, end: int) -> StepBatch:
        """Steps ``start`` to ``end`` (excluded)."""
        return StepBatch._make(column[start:end] for column in self)


#: StepStats' fields, in order (StepBatch's columns after ``times``).
STEP_FIELDS = tuple(f.name for f in fields(StepStats))
_STEP_ROW = operator.attrgetter(*STEP_FIELDS)
#: The StepBatch columns that :data:`SCALARS` after ``steps`` sum, in that order.
_SUMMED = operator.itemgetter(*(StepBatch._fields.index(field) for _, field in _SOURCES[1:]))


def _add_into(dst: list[N], src: Sequence[N]) -> None:
    if len(dst) == len(src):
        dst[:] = map(operator.add, dst, src)
        return
    if len(dst) < len(src):
        dst.extend([0] * (len(src) - len(dst)))
    for i, v in enumerate(src):
        dst[i] += v


def _column_sums(rows: list[Sequence[int]]) -> Sequence[int]:
    """Per-position sums of several steps' arrays (of one length in practice: vLLM sizes them by K)."""
    if len(rows) == 1:
        return rows[0]
    return [sum(col) for col in itertools.zip_longest(*rows, fillvalue=0)]


def _pad(values: list[int], k: int) -> tuple[int, ...]:
    return tuple(values[:k]) + (0,) * max(0, k - len(values))


#: How one step was timed (see :class:`StepTimer`): its batch size, its seconds, and whether it was pure decode
#: (else it carried prefill).
Timing = tuple[int, float, bool]


#: The columns of a batch size's row in :attr:`Counts.batches`: decode steps, their seconds and tokens; steps carrying
#: prefill, their seconds and tokens, and the first tokens in them (requests whose prefill ended); the decode steps'
#: context per request, summed over them (0 for a step whose context is unknown).
(DECODE_STEPS, DECODE_S, DECODE_TOKENS, PREFILL_STEPS, PREFILL_S, PREFILL_TOKENS, FIRST_TOKENS, DECODE_CONTEXT,
 FORWARDS, FORWARD_S, FORWARD_TOKENS) = range(11)


class StepTimer:
    """Times engine steps from what vLLM reports.

    A pure decode step's duration is measured in the engine core (the interval between its outputs, the same for
    every request of the step). A step carrying prefill produces no such interval; its duration is bounded by the
    gap since the previous step report of a busy engine and by its requests' time to first token, and the
    smaller bound is taken. After an idle moment with no first token (a long prompt's first chunk) it is unknown.
    """

    __slots__ = ("_busy", "_last")

    def __init__(self) -> None:
        self._last: float | None = None
        self._busy = False

    def time(self, steps: StepBatch) -> list[Timing | None]:
        """Each step's timing, or None where the step says too little (no batch: an idle or partial report)."""
        out: list[Timing | None] = []
        prev, busy = self._last, self._busy
        for now, running, waiting, batch, prefill, decode_s, first_s in zip(
                steps.times, steps.running, steps.waiting, steps.batch, steps.prefill, steps.decode_s,
                steps.first_token_s, strict=True):
            was_busy, last = busy, prev
            prev = now
            if running is not None:
                busy = bool(running or waiting)
            if not batch:
                out.append(None)
            elif not prefill:
                out.append(None if decode_s is None else (batch, decode_s, True))
            else:
                gap = now - last if was_busy and last is not None else None
                bound = first_s if gap is None else gap if first_s is None else min(gap, first_s)
                out.append(None if bound is None else (batch, bound, False))
        self._last, self._busy = prev, busy
        return out


class Counts:
    """Counts of one interval: scalars, per-position arrays and step times by batch size."""

    __slots__ = ("batches", "dt_per_pos", "moments", "per_pos", "scalars")

    def __init__(self) -> None:
        self.scalars = [0] * len(SCALARS)
        self.per_pos: list[int] = []
        self.dt_per_pos: list[int] = []
        #: batch size -> its row, columns ``DECODE_STEPS`` .. ``FORWARD_TOKENS`` (a list added to in place)
        self.batches: dict[int, list[float]] = {}
        #: The target's forwards of every shape, as :func:`forward_moments` sums them ([] before the first)
        self.moments: list[float] = []

    def clear(self) -> None:
        """Back to zero, keeping the allocated lists."""
        self.scalars[:] = [0] * len(SCALARS)
        self.per_pos[:] = [0] * len(self.per_pos)
        self.dt_per_pos[:] = [0] * len(self.dt_per_pos)
        self.batches.clear()
        self.moments.clear()

    def add_steps(self, steps: StepBatch, timings: Sequence[Timing | None], contexts: Sequence[float]) -> None:
        """Add consecutive steps of one engine, each with its timing (None: untimed) and the tokens each of its
        requests attended over (0.0: unknown)."""
        self.scalars[:] = map(operator.add, self.scalars, (len(steps.times), *map(sum, _SUMMED(steps))))
        drafts = steps.drafts
        if any(drafts):
            _add_into(self.per_pos, _column_sums(list(itertools.compress(steps.accepted_per_pos, drafts))))
            _add_into(self.dt_per_pos, _column_sums(list(itertools.compress(steps.draft_tokens_per_pos, drafts))))
        for timing, generated, first, context, seen, accepted, drafted in zip(
                timings, steps.generation_tokens, steps.first_tokens, contexts, steps.seen, steps.accepted, drafts,
                strict=True):
            if timing is None:
                continue
            batch, seconds, decode = timing
            row = self._row(batch)
            if row is None:
                continue
            if decode:
                row[DECODE_STEPS] += 1
                row[DECODE_S] += seconds
                # A step seen in part: every request verified its drafts, and produced its accepted tokens and one.
                row[DECODE_TOKENS] += generated if seen is None else accepted + drafted
                row[DECODE_CONTEXT] += context
            else:
                row[PREFILL_STEPS] += 1
                row[PREFILL_S] += seconds
                row[PREFILL_TOKENS] += generated
                row[FIRST_TOKENS] += first

    def add_forwards(self, forwards: Sequence[tuple[int, int, int, float]], decode_tokens: int) -> None:
        """Add the target's forward passes timed since the last call: ``(requests, tokens, count, seconds)`` rows.
        Every shape goes into the fit's sums; those of at most ``decode_tokens`` tokens a request (K + 1: the rest
        ran a prompt) into their batch size's row."""
        _add_into(self.moments, forward_moments(forwards))
        for requests, tokens, count, seconds in forwards:
            if tokens > requests * decode_tokens:
                continue
            row = self._row(requests)
            if row is None:
                continue
            row[FORWARDS] += count
            row[FORWARD_S] += seconds
            row[FORWARD_TOKENS] += tokens * count

    def _row(self, batch: int) -> list[float] | None:
        """The row of ``batch``, made on its first numbers; None past :data:`MAX_BATCH_SIZES` batch sizes."""
        row = self.batches.get(batch)
        if row is None and len(self.batches) < MAX_BATCH_SIZES:
            row = self.batches[batch] = [0, 0.0, 0, 0, 0.0, 0, 0, 0.0, 0, 0.0, 0]
        return row

    def add(self, other: Counts) -> None:
        """Add another interval's counts."""
        self.scalars[:] = map(operator.add, self.scalars, other.scalars)
        _add_into(self.per_pos, other.per_pos)
        _add_into(self.dt_per_pos, other.dt_per_pos)
        _add_into(self.moments, other.moments)
        for b, row in other.batches.items():
            mine = self.batches.get(b)
            if mine is None:
                self.batches[b] = list(row)
            else:
                mine[:] = map(operator.add, mine, row)

    def totals(self, seconds: float, k: int | None, spreads: dict[int, tuple[float, int]] | None = None,
               forwards_alone: bool = False) -> Totals:
        """The interval as an immutable :class:`Totals`; speculative counts only when ``k`` is known; ``spreads``:
        each batch size's moment-to-moment spread of its decode-step time (:func:`moment_spread`) and the seconds
        it is over.
        ``forwards_alone``: keep the batch sizes this process timed forwards at but got no steps of (another
        API-server process may have them; :func:`specscope.state.merge.merge` drops those nobody stepped at)."""
        spreads = spreads or {}
        c = dict(zip(SCALARS, self.scalars, strict=True))
        spec = None
        if k is not None:
            spec = SpecCounts(
                num_spec_tokens=k,
                drafts=c["drafts"],
                draft_tokens=c["draft_tokens"],
                accepted=c["accepted"],
                accepted_per_pos=_pad(self.per_pos, k),
                draft_tokens_per_pos=_pad(self.dt_per_pos, k),
                rejections=c["rejections"],
            )
        times = tuple(StepTime(b, int(n), t / n if n else 0.0, int(tok), int(pn), ps, int(ptok), int(first),
                               ctx / n if n else 0.0, spread=spreads.get(b, (0.0, 0))[0],
                               readings=spreads.get(b, (0.0, 0))[1], forwards=int(fn),
                               forward_s=fs / fn if fn else 0.0, forward_tokens=ftok / fn if fn else 0.0)
                      for b, (n, t, tok, pn, ps, ptok, first, ctx, fn, fs, ftok) in sorted(self.batches.items())
                      if n or pn or fn)
        profile = StepProfile(times, forward_moments=tuple(self.moments) if any(self.moments) else ())
        return Totals(
            seconds=seconds,
            steps=c["steps"],
            prompt_tokens=c["prompt_tokens"],
            generation_tokens=c["generation_tokens"],
            requests=c["requests"],
            preemptions=c["preemptions"],
            prefix_cache_queries=c["pc_queries"],
            prefix_cache_hits=c["pc_hits"],
            spec=spec,
            step_times=profile if forwards_alone else profile.stepped(),
            prefills=c["prefills"],
        )


#: Seconds with decode steps at a batch size that its moment-to-moment spread is drawn from (fewer: unknown).
MIN_SPREAD_SECONDS = 5
_PROMPT_TOKENS = SCALARS.index("prompt_tokens")


def moment_spread(seconds: Sequence[tuple[float, float, float, float]]) -> float:
    """How much a batch size's decode-step time moves from one second to the next, relative to its mean: from each
    second's ``(steps, seconds in them, context summed over them, prompt tokens prefilled in it)``, the
    step-weighted standard deviation of the seconds' mean step times about what the workload explains, over the
    mean; 0.0 (unknown) with fewer than :data:`MIN_SPREAD_SECONDS` seconds.

    The workload's part is a least-squares plane in the seconds' mean context (a second of longer contexts is
    slower for a reason) and their prompt tokens (the prompts' own steps are timed apart, as prefill, but share the
    machine with the decode steps beside them), each slope at least 0: a second is not faster for attending over
    more tokens or prefilling more of them. What is left is the machine's: a baseline timed at another moment
    differs from now by about this much (other work on the host, clocks, a neighbour's traffic), which its own
    calibration rounds, back to back, do not see.
    """
    rows = [(n, t / n, c / n, p) for n, t, c, p in seconds if n > 0]
    if len(rows) < MIN_SPREAD_SECONDS:
        return 0.0
    w = sum(r[0] for r in rows)
    y0, c0, p0 = (sum(r[0] * r[i] for r in rows) / w for i in (1, 2, 3))
    centred = [(n, y - y0, c - c0, p - p0) for n, y, c, p in rows]
    slopes = _nonnegative_fit(centred, w, (c0, p0))
    resid = sum(n * (y - slopes[0] * c - slopes[1] * p) ** 2 for n, y, c, p in centred) / w
    fitted = 1 + sum(1 for s in slopes if s)
    return (resid * len(rows) / (len(rows) - fitted)) ** 0.5 / y0 if y0 > 0 else 0.0


def _nonnegative_fit(centred: Sequence[tuple[float, float, float, float]], w: float,
                     means: tuple[float, float]) -> tuple[float, float]:
    """The slopes of the weighted least-squares fit of centred ``(weight, y, x1, x2)`` rows' y on x1 and x2 with
    both at least 0 (0 for a regressor that does not move): the fit of the smallest residual among the two-, one-
    and no-regressor fits whose slopes are all at least 0."""
    sxx = [[sum(r[0] * r[i] * r[j] for r in centred) for j in (2, 3)] for i in (2, 3)]
    sxy = [sum(r[0] * r[i] * r[1] for r in centred) for i in (2, 3)]
    moving = [sxx[i][i] > 1e-9 * w * (means[i] ** 2 + 1) for i in (0, 1)]
    # Each candidate's residual sum of squares, less Σ n·y² (the same for all): minus what its slopes explain.
    candidates: list[tuple[float, tuple[float, float]]] = [(0.0, (0.0, 0.0))]
    for i in (0, 1):
        if moving[i] and sxy[i] > 0:
            slope = sxy[i] / sxx[i][i]
            candidates.append((-slope * sxy[i], (slope, 0.0) if i == 0 else (0.0, slope)))
    det = sxx[0][0] * sxx[1][1] - sxx[0][1] ** 2
    if all(moving) and det > 1e-12 * sxx[0][0] * sxx[1][1]:  # else the two move together: one stands for both
        both = ((sxy[0] * sxx[1][1] - sxy[1] * sxx[0][1]) / det, (sxx[0][0] * sxy[1] - sxx[0][1] * sxy[0]) / det)
        if min(both) >= 0:
            candidates.append((-(both[0] * sxy[0] + both[1] * sxy[1]), both))
    return min(candidates, key=lambda c: c[0])[1]


def batch_seconds(rings: Sequence[Ring], now: int, window: int) -> dict[int, list[tuple[float, float, float, float]]]:
    """Per batch size, each second's decode ``(steps, seconds, context sum, prompt tokens)`` over ``rings``
    (engines summed; the prompt tokens are the second's, at every batch size), for :func:`moment_spread`."""
    per_second: dict[int, dict[int, list[float]]] = {}
    prompts: dict[int, float] = {}
    for ring in rings:
        for second, counts in ring.seconds_of(now, window):
            prompts[second] = prompts.get(second, 0.0) + counts.scalars[_PROMPT_TOKENS]
            for b, row in counts.batches.items():
                if row[DECODE_STEPS]:
                    cell = per_second.setdefault(b, {}).setdefault(second, [0.0, 0.0, 0.0])
                    cell[0] += row[DECODE_STEPS]
                    cell[1] += row[DECODE_S]
                    cell[2] += row[DECODE_CONTEXT]
    return {b: [(n, t, c, prompts[second]) for second, (n, t, c) in by_second.items()]
            for b, by_second in per_second.items()}


class Ring:
    """One :class:`Counts` per second over ``size`` seconds, allocated at creation and reused, and the lifetime they
    add up to: each step is added once, to its second's bucket, which joins the lifetime's past when a later second
    begins."""

    __slots__ = ("buckets", "current", "past", "seconds", "size")

    def __init__(self, size: int, past: Counts | None = None) -> None:
        self.size = size
        self.seconds = [-1] * size
        self.buckets = [Counts() for _ in range(size)]
        #: Every second before the current one, summed.
        self.past = past or Counts()
        #: The second steps are being added to (its bucket holds it and is not in ``past`` yet); -1 when none is.
        self.current = -1

    def bucket(self, second: int) -> Counts:
        """The bucket steps of ``second`` are added to (a clock that stepped back gets the current second's)."""
        if second < self.current:
            second = self.current
        i = second % self.size
        bucket = self.buckets[i]
        if second != self.current:  # a new second: its slot's old contents are past the kept history
            self._close_current()
            self.current = self.seconds[i] = second
            bucket.clear()
        return bucket

    def sum(self, now: int, window: int) -> Counts:
        """The counts of the last ``window`` seconds up to ``now``."""
        total = Counts()
        for second in range(now - window + 1, now + 1):
            i = second % self.size
            if self.seconds[i] == second:
                total.add(self.buckets[i])
        return total

    def seconds_of(self, now: int, window: int) -> Iterator[tuple[int, Counts]]:
        """``(second, counts)`` of each second with counts in the last ``window`` seconds up to ``now``."""
        for second in range(now - window + 1, now + 1):
            i = second % self.size
            if self.seconds[i] == second:
                yield second, self.buckets[i]

    def lifetime(self) -> Counts:
        """Everything ever added."""
        total = Counts()
        total.add(self.past)
        if self.current >= 0:
            total.add(self.buckets[self.current % self.size])
        return total

    def clear(self) -> None:
        """Forget every bucket; the lifetime keeps them."""
        self._close_current()
        self.seconds = [-1] * self.size

    def resized(self, size: int) -> Ring:
        """An empty ring of ``size`` seconds with this one's lifetime."""
        return Ring(size, self.lifetime())

    def _close_current(self) -> None:
        if self.current >= 0:
            self.past.add(self.buckets[self.current % self.size])
        self.current = -1

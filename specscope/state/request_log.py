"""The hub's request records: joined from their parts, numbered when final, bounded, and summed.

Over 400 lines on purpose: joining a record's parts, numbering it and summing it share one lock and one
lifetime rule.

A record may come in parts from several sources (the stat logger's engine timing, the server's response); it is
*final* once every expected part is in, or after :data:`PENDING_TIMEOUT_S` without the rest. Final records get a
``final_seq`` (the cursor incremental readers fetch by), feed the per-request histograms and the attribution sums,
and go to the listeners, once: a part that comes after its record was made final amends the record and adds only
what it brought to the histograms and sums. Only the last ``max_requests`` records are kept. Not thread-safe: the
hub calls it under its lock.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specscope.core import classes
from specscope.core.model import (
    ACCEPTANCE_LENGTH_BOUNDS,
    ACCEPTANCE_RATE_BOUNDS,
    OUTPUT_POSITION_BOUNDS,
    REQUEST_DURATION_BOUNDS,
    TPOT_BOUNDS,
    TTFT_BOUNDS,
    Attribution,
    ClassCounts,
    Histogram,
    OperationLatency,
    PositionAcceptance,
    RequestRecord,
    TrafficClass,
)

#: Distinct GenAI operation names whose latency is kept apart (vLLM's server has chat and completions).
MAX_OPERATIONS = 8
#: Seconds a record waits for its other part before it is final as it is: longer than the stat logger keeps steps
#: before adding them (:data:`specscope.engine.vllm_logger.BATCH_S`), so the engine's part is not late.
PENDING_TIMEOUT_S = 10.0


class _Hist:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v

    def freeze(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.total)


class RequestLog:
    """Request records: parts joined, final ones numbered and observed, the last ``max_requests`` kept."""

    def __init__(self, max_requests: int, max_classes: int = classes.MAX_CLASSES, history_s: float = 900.0,
                 class_rank_s: float = classes.RANK_WINDOWS * 60.0) -> None:
        self.max_requests = max_requests
        self.max_classes = max_classes
        self._tau = class_rank_s
        self.history_s = history_s
        self.parts_expected = 1
        self.recent: OrderedDict[str, RequestRecord] = OrderedDict()
        self._pending: OrderedDict[str, float] = OrderedDict()  # records waiting for a part, and since when
        self._parts: dict[str, int] = {}
        self._seq = 0
        self._final_seq = 0
        self.rate = _Hist(ACCEPTANCE_RATE_BOUNDS)
        self.length = _Hist(ACCEPTANCE_LENGTH_BOUNDS)
        self.e2e = _Hist(REQUEST_DURATION_BOUNDS)
        self.ttft = _Hist(TTFT_BOUNDS)
        self.tpot = _Hist(TPOT_BOUNDS)
        #: operation name -> its e2e, TTFT and TPOT histograms (the GenAI metrics are split by operation)
        self._by_operation: dict[str, tuple[_Hist, _Hist, _Hist]] = {}
        self._attributed = _Row()
        self._positions = [[0, 0] for _ in range(len(OUTPUT_POSITION_BOUNDS) + 1)]  # [drafted, accepted]
        self._positions_seen = False
        #: class name -> its running counts
        self._classes: dict[str, _Row] = {}
        #: The same rows by the second the requests finished in (the last ``history_s`` seconds): windows of any
        #: length are summed from at most that many seconds, not from every record.
        self._class_seconds: dict[int, dict[str, _Row]] = {}
        self._folded: set[str] = set()
        #: Recent traffic of the names with rows (not the prompt-length buckets, not other), and of at most
        #: ``(TRACKED_PER_ROW - 1) * max_classes`` others, the least busy forgotten first (Space-Saving). Weights are
        #: decayed forward: a request at ``t`` adds ``exp((t - landmark) / class_rank_s)``.
        self._held: dict[str, _Traffic] = {}
        self._ranked: dict[str, _Traffic] = {}
        self._landmark = 0.0
        self._latest = 0.0  # the latest time a request was ranked at
        #: request id -> the class key its counts went to (kept with the record, for a late part to move them)
        self._counted: dict[str, str] = {}

    def add_part(self, request_id: str, now: float, fields: dict[str, Any]) -> list[RequestRecord]:
        """Add one source's part of a request; returns the records that became final."""
        rec = self.recent.get(request_id)
        parts = self._parts.get(request_id, 0) + 1
        final = parts >= self.parts_expected
        if rec is None:
            self._seq += 1
            # A record complete in one part is made final as it is made (the engine path's common case).
            rec = RequestRecord(request_id=request_id, seq=self._seq, finished_at=now,
                                final_seq=self._final_seq + 1 if final else 0, **fields)
            self.recent[request_id] = rec
            while len(self.recent) > self.max_requests:
                old, _ = self.recent.popitem(last=False)
                self._parts.pop(old, None)
                self._pending.pop(old, None)
                self._counted.pop(old, None)
        else:
            known = {k: v for k, v in fields.items() if v is not None}  # a part's unknowns keep the other's numbers
            if rec.final_seq and request_id not in self._pending:
                self._amend(rec, replace(rec, **known), now)
                return self.release_expired(now)
            rec = replace(rec, **known)
            self.recent[request_id] = rec
        done = []
        if final:
            self._parts.pop(request_id, None)
            self._pending.pop(request_id, None)
            done.append(self._finalize(rec, now))
        else:
            self._parts[request_id] = parts
            self._pending[request_id] = now
        return done + self.release_expired(now)

    def release_expired(self, now: float) -> list[RequestRecord]:
        """Finalize the records that waited too long for their other part."""
        out = []
        while self._pending:
            rid, t = next(iter(self._pending.items()))
            if now - t < PENDING_TIMEOUT_S:
                break
            self._pending.popitem(last=False)
            self._parts.pop(rid, None)
            rec = self.recent.get(rid)
            if rec is not None:
                out.append(self._finalize(rec, now))
        return out

    def add_positions(self, per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> None:
        """One finished request's per-step draft counts, binned by the output position each step drafted at."""
        self._positions_seen = True
        n = min(len(per_step_accepted), len(per_step_drafted))
        if not n:
            return
        # Step i drafts at 1 + the tokens before it (the first token comes from prefill; a step adds accepted + 1).
        starts = list(itertools.accumulate(map(operator.add, per_step_accepted[:n - 1], itertools.repeat(1)),
                                           initial=1))
        rows, bounds = self._positions, OUTPUT_POSITION_BOUNDS
        b, lo = bisect.bisect_right(bounds, 1), 0
        while lo < n:  # positions only grow: each bin takes the steps up to its bound
            hi = bisect.bisect_left(starts, bounds[b], lo) if b < len(bounds) else n
            if hi > lo:
                rows[b][0] += sum(per_step_drafted[lo:hi])
                rows[b][1] += sum(per_step_accepted[lo:hi])
            lo, b = hi, b + 1

    def positions(self) -> PositionAcceptance | None:
        """Acceptance by output position, once detailed per-request metrics came in."""
        if not self._positions_seen:
            return None
        return PositionAcceptance(OUTPUT_POSITION_BOUNDS, tuple(d for d, _ in self._positions),
                                  tuple(a for _, a in self._positions))

    def latency_by_operation(self) -> tuple[OperationLatency, ...]:
        """The latency histograms of each operation's requests so far."""
        return tuple(OperationLatency(op, *(h.freeze() for h in hists))
                     for op, hists in sorted(self._by_operation.items()))

    def attribution(self) -> Attribution:
        """Speculative counts summed over every final record so far (not only the kept ones)."""
        a = self._attributed
        return Attribution(a.requests, a.spec_steps, a.draft_tokens, a.accepted)

    @property
    def class_rank_s(self) -> float:
        """Seconds over which names' traffic is ranked for rows: a request's weight falls by a factor e in that
        time (:data:`classes.RANK_WINDOWS` of the hub's windows)."""
        return self._tau

    @class_rank_s.setter
    def class_rank_s(self, seconds: float) -> None:
        self._decay_to(self._latest)  # the weights so far decayed at the old rate, the ones to come at the new
        self._tau = seconds

    def class_key(self, name: str | None, now: float, rank: bool = True) -> str | None:
        """Where a request of class ``name`` is counted at ``now``: its name while it has a row, else
        :data:`classes.OTHER` (:mod:`specscope.core.classes` says which names have rows; the prompt-length buckets
        always do). ``rank``: the request counts toward its name's traffic, which may take it a row (False for a
        late part of a request already counted under that name)."""
        if name is None or name in classes.PROMPT_BUCKETS or name == classes.OTHER:
            return name
        if rank:
            gain = self._rank(name, now)
            if name not in self._held and (self._row_free() or self._takes_row(name, gain)):
                self._held[name] = self._ranked.pop(name)
        if name in self._held:
            return name
        if len(self._folded) < MAX_FOLDED:
            self._folded.add(name)
        return classes.OTHER

    def _rank(self, name: str, now: float) -> float:
        """Count a request of ``name`` at ``now`` toward its traffic; returns the weight one request adds now. A
        name not tracked replaces the least busy one without a row, and starts from its weight (which it may not
        have had: its error)."""
        x = (now - self._landmark) / self._tau
        if x > _RESCALE:
            self._decay_to(now)
            x = 0.0
        self._latest = max(self._latest, now)
        gain = math.exp(x)
        traffic = self._held.get(name) or self._ranked.get(name)
        if traffic is None:
            floor = 0.0
            if len(self._ranked) >= (classes.TRACKED_PER_ROW - 1) * self.max_classes:
                floor = self._ranked.pop(min(self._ranked, key=lambda n: self._ranked[n].weight)).weight
            traffic = self._ranked[name] = _Traffic(floor, floor)
        traffic.weight += gain
        return gain

    def _decay_to(self, t: float) -> None:
        """Move the weights' landmark to ``t`` (they stay finite however long specscope runs)."""
        f = math.exp((self._landmark - t) / self._tau)
        for traffic in itertools.chain(self._held.values(), self._ranked.values()):
            traffic.weight *= f
            traffic.error *= f
        self._landmark = t

    def _row_free(self) -> bool:
        """Whether fewer than ``max_classes`` classes have rows (the prompt-length buckets among them)."""
        return len(self._held) + sum(b in self._classes for b in classes.PROMPT_BUCKETS) < self.max_classes

    def _takes_row(self, name: str, gain: float) -> bool:
        """Whether ``name`` (without a row) takes the row of the least busy name with one: it surely has more than
        :data:`classes.TAKEOVER` times that one's traffic and a request (``gain``) more. That name's row goes, its
        counts with it, and it is ranked with the others."""
        if not self._held:
            return False
        weakest = min(self._held, key=lambda n: self._held[n].weight)
        mine = self._ranked[name]
        if mine.weight - mine.error <= classes.TAKEOVER * self._held[weakest].weight + gain:
            return False
        self._ranked[weakest] = self._held.pop(weakest)
        del self._classes[weakest]
        for by_key in self._class_seconds.values():
            by_key.pop(weakest, None)
        self._counted = {rid: key for rid, key in self._counted.items() if key != weakest}
        return True

    def class_totals(self) -> dict[str, ClassCounts]:
        """Every final record's counts so far, by class."""
        return {name: row.counts() for name, row in self._classes.items()}

    def window_classes(self, since: float) -> dict[str, ClassCounts]:
        """The counts, by class, of the final records that finished at or after ``since`` (to the second)."""
        start = int(since)
        out: dict[str, ClassCounts] = {}
        for second, by_key in self._class_seconds.items():
            if second < start:
                continue
            for key, row in by_key.items():
                counts = row.counts()
                out[key] = out[key] + counts if key in out else counts
        return out

    def traffic_classes(self, since: float) -> tuple[TrafficClass, ...]:
        """Each class's lifetime counts, and its window's (the records that finished since ``since``)."""
        lifetime = self.class_totals()
        if not lifetime:
            return ()
        window, empty = self.window_classes(since), ClassCounts()
        out = [TrafficClass(name, window.get(name, empty), life) for name, life in lifetime.items() if life.requests]
        return tuple(sorted(out, key=lambda c: (-c.lifetime.requests, c.name)))

    def clear_class_window(self) -> None:
        """Forget the class rows by second (a window reset); the lifetime sums stay."""
        self._class_seconds.clear()

    def folded_classes(self) -> int:
        """Distinct class names counted as :data:`classes.OTHER` (at most :data:`MAX_FOLDED`)."""
        return len(self._folded)

    def _count_class(self, rec: RequestRecord, sign: int, now: float, rank: bool = True) -> None:
        """Add a final record's counts to its class's rows (``sign`` 1; ``rank``: as in :meth:`class_key`), or take
        them from where they went (-1)."""
        if sign > 0:
            key = self.class_key(rec.class_name, now, rank)
            if key is not None:
                self._counted[rec.request_id] = key
        else:  # none where the row they went to was given up since
            key = self._counted.pop(rec.request_id, None)
        if key is None:
            return
        row = self._classes.get(key)
        if row is None:
            row = self._classes[key] = _Row()
        row.add_record(rec, sign)
        second = int(rec.finished_at)
        by_key = self._class_seconds.get(second)
        if by_key is None:
            by_key = self._class_seconds[second] = {}
            if len(self._class_seconds) > self.history_s + 64:  # drop what no window reaches, now and then
                oldest = max(self._class_seconds) - self.history_s
                self._class_seconds = {s: k for s, k in self._class_seconds.items() if s >= oldest}
        row = by_key.get(key)
        if row is None:
            row = by_key[key] = _Row()
        row.add_record(rec, sign)

    def _finalize(self, rec: RequestRecord, now: float) -> RequestRecord:
        self._final_seq += 1
        if rec.final_seq != self._final_seq:
            rec = replace(rec, final_seq=self._final_seq)
            self.recent[rec.request_id] = rec
        self._observe(rec, _NOTHING)
        self._attributed.requests += 1
        self._count_class(rec, 1, now)
        return rec

    def _amend(self, old: RequestRecord, new: RequestRecord, now: float) -> None:
        """A final record's late part: the record is amended (its ``final_seq`` kept), and what the part added goes
        to the histograms and sums; the request is not counted again and not published again."""
        self.recent[new.request_id] = new
        self._observe(new, old)
        self._count_class(old, -1, now)
        self._count_class(new, 1, now, rank=new.class_name != old.class_name)

    def _observe(self, rec: RequestRecord, before: RequestRecord) -> None:
        """Add to the histograms each value ``rec`` has that ``before`` did not, and to the sums their difference."""
        op = self._by_operation.get(rec.operation_name)
        if op is None and len(self._by_operation) < MAX_OPERATIONS:
            op = self._by_operation[rec.operation_name] = (_Hist(REQUEST_DURATION_BOUNDS), _Hist(TTFT_BOUNDS),
                                                           _Hist(TPOT_BOUNDS))
        e2e, ttft, tpot = op or (None, None, None)
        for hists, value in (((self.rate,), _RATE), ((self.length,), _LENGTH), ((self.e2e, e2e), _E2E),
                             ((self.ttft, ttft), _TTFT), ((self.tpot, tpot), _tpot)):
            v = value(rec)
            if v is not None and value(before) is None:
                for hist in hists:
                    if hist is not None:
                        hist.observe(v)
        att = self._attributed
        att.spec_steps += (rec.spec_steps or 0) - (before.spec_steps or 0)
        att.draft_tokens += (rec.draft_tokens or 0) - (before.draft_tokens or 0)
        att.accepted += (rec.accepted_tokens or 0) - (before.accepted_tokens or 0)


@dataclass(slots=True)
class _Traffic:
    """A class name's recent requests, decayed (see :meth:`RequestLog._rank`): at most ``weight``, at least
    ``weight - error``."""

    weight: float
    error: float


@dataclass(slots=True)
class _Row:
    """Running speculative counts of a set of finished requests (a traffic class, or all attributed ones)."""

    requests: int = 0
    spec_steps: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    #: Accepted tokens at each draft position.
    by_position: list[int] = field(default_factory=list)

    def add_record(self, rec: RequestRecord, sign: int = 1) -> None:
        """Add (or with ``sign`` -1, take away) one request's counts."""
        self.requests += sign
        self.spec_steps += sign * (rec.spec_steps or 0)
        self.draft_tokens += sign * (rec.draft_tokens or 0)
        self.accepted += sign * (rec.accepted_tokens or 0)
        hist = rec.acceptance_histogram
        if hist:
            # Steps that accepted exactly j tokens accepted one at each position below j.
            positions = self.by_position
            if len(positions) < len(hist) - 1:
                positions.extend([0] * (len(hist) - 1 - len(positions)))
            for i, accepted in enumerate(reversed(list(itertools.accumulate(reversed(hist[1:]))))):
                positions[i] += sign * accepted

    def counts(self) -> ClassCounts:
        """The counts, frozen."""
        return ClassCounts(self.requests, self.spec_steps, self.draft_tokens, self.accepted, tuple(self.by_position))


#: Folded class names remembered (to count them once); past it they are still counted as other, not remembered.
MAX_FOLDED = 10_000
#: How far (in ``class_rank_s``) the newest request may be from the weights' landmark before it moves there.
_RESCALE = 50.0
#: A record with nothing known (what a new record is observed against).
_NOTHING = RequestRecord(request_id="", seq=0, finished_at=0.0)
#: The per-request values the histograms observe (a zero TPOT, of a one-token request, is not observed).
_RATE = operator.attrgetter("acceptance_rate")
_LENGTH = operator.attrgetter("mean_acceptance_length")
_E2E = operator.attrgetter("e2e_s")
_TTFT = operator.attrgetter("ttft_s")


def _tpot(r: RequestRecord) -> float | None:
    return r.tpot_s or None

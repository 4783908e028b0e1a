"""Several snapshots of one server as one: the API-server processes of ``vllm serve --api-server-count N``.

vLLM hands each step's scheduler stats to one front end and each request's stats to the front end that owns the
request, so every API-server process sees a disjoint share of the steps and requests. Counts, step times,
histograms and the attribution sums add up; each engine's gauges (running, waiting, KV cache) are taken from
the process that heard from that engine last; request records are the newest of all. A process that is gone comes
in :func:`aged`: its lifetime counts stay, its window and gauges do not. Whether it is gone is not judged here, from
the snapshots' wall-clock times (a clock step would bring a dead process back or drop a live one), but by the
reader of the shared files, from the process's pid and its own monotonic clock
(:meth:`specscope.engine.share.ProcessShare.others`).
Traffic classes are capped again after adding (:func:`_add_classes`), and a histogram whose buckets differ from
the others' (another specscope version) is left out and counted in health (:data:`DROPPED_HISTOGRAM`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from specscope.core import classes, intervals
from specscope.core.model import (
    CaptureStatus,
    ClassCounts,
    EngineInfo,
    EngineView,
    Health,
    Histogram,
    KVCache,
    OperationLatency,
    PositionAcceptance,
    Snapshot,
    Totals,
    TrafficClass,
)

#: Where the health counts each histogram left out of a merge because its buckets differ from the others'.
DROPPED_HISTOGRAM = "merge dropped histogram (buckets differ)"


def _add_seq(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))


def _add_hist(a: Histogram | None, b: Histogram | None, name: str, dropped: list[str]) -> Histogram | None:
    if a is None or b is None:
        return a or b
    return _sum_hist(a, b, name, dropped)


def _sum_hist(a: Histogram, b: Histogram, name: str, dropped: list[str]) -> Histogram:
    """Two histograms' sum; where their buckets differ, the first, and ``name`` goes to ``dropped``."""
    if a.bounds != b.bounds:
        dropped.append(name)
        return a
    return Histogram(a.bounds, _add_seq(a.counts, b.counts), a.total + b.total)


def _add_positions(a: PositionAcceptance | None, b: PositionAcceptance | None,
                   dropped: list[str]) -> PositionAcceptance | None:
    if a is None or b is None:
        return a or b
    if a.bounds != b.bounds:
        dropped.append("acceptance_by_output_position")
        return a
    return PositionAcceptance(a.bounds, _add_seq(a.draft_tokens, b.draft_tokens), _add_seq(a.accepted, b.accepted))


def _add_health(a: Health, b: Health) -> Health:
    errors: dict[str, int] = dict(a.errors)
    for where, n in b.errors:
        errors[where] = errors.get(where, 0) + n
    return Health(tuple(sorted(errors.items())), a.dropped_records + b.dropped_records, a.last_error or b.last_error)


def aged(snap: Snapshot) -> Snapshot:
    """A gone process's snapshot: its lifetime counts, with nothing in its windows and no fresh gauges."""
    return replace(snap, window=Totals(seconds=0.0), decode_batch=None,
                   engines=tuple(replace(e, window=Totals(seconds=0.0), decode_batch=None, updated_at=0.0)
                                 for e in snap.engines),
                   classes=tuple(replace(c, window=ClassCounts()) for c in snap.classes))


def _merge_engines(snaps: Sequence[Snapshot]) -> tuple[EngineView, ...]:
    out: dict[int, EngineView] = {}
    for snap in snaps:
        for e in snap.engines:
            o = out.get(e.index)
            if o is None:
                out[e.index] = e
                continue
            newer = e if (e.updated_at or 0.0) >= (o.updated_at or 0.0) else o  # the gauges last reported
            window = intervals.add(o.window, e.window)
            out[e.index] = replace(newer, lifetime=intervals.add(o.lifetime, e.lifetime), window=window,
                                   decode_batch=window.step_times.busiest() or newer.decode_batch)
    return tuple(out[i] for i in sorted(out))


def combine_kv(info: EngineInfo, engines: Sequence[EngineView]) -> KVCache:
    """The engines' KV caches as one: each engine has its own cache of ``info.num_blocks`` blocks (one of them the
    null block); usage is the block-weighted mean, tokens add up, and the token estimate is withheld if any
    engine's is."""
    if len(engines) <= 1:
        return engines[0].kv if engines else KVCache(block_size=info.block_size, num_blocks=info.num_blocks)
    reporting = [e.kv for e in engines if e.kv.block_usage is not None]
    blocks = info.num_blocks
    if not reporting or not blocks:
        return KVCache(block_size=info.block_size, num_blocks=blocks)
    note = next((kv.not_estimable for kv in reporting if kv.not_estimable), None)
    held = [kv.tokens_held for kv in reporting]
    return KVCache(block_size=info.block_size, num_blocks=(blocks - 1) * len(reporting) + 1,
                   block_usage=sum(kv.block_usage or 0.0 for kv in reporting) / len(reporting),
                   tokens_held=None if note or None in held else sum(h or 0 for h in held), not_estimable=note)


def _add_latency(snaps: Sequence[Snapshot], dropped: list[str]) -> tuple[OperationLatency, ...]:
    """Each operation's latency histograms, added over the snapshots."""
    ops: dict[str, OperationLatency] = {}
    for s in snaps:
        for o in s.latency_by_operation:
            mine = ops.get(o.operation)
            ops[o.operation] = o if mine is None else OperationLatency(
                o.operation, *(_sum_hist(getattr(mine, f), getattr(o, f), f"{f} ({o.operation})", dropped)
                               for f in ("duration", "time_to_first_token", "time_per_output_token")))
    return tuple(ops[k] for k in sorted(ops))


def _add_classes(snaps: Sequence[Snapshot], max_classes: int) -> tuple[tuple[TrafficClass, ...], int]:
    """Each traffic class summed over the processes, by name (most requests first), capped as one process caps
    them: the prompt-length buckets are always kept and count toward ``max_classes``, the other names with the
    most requests take the rows left, the rest are added to :data:`classes.OTHER`. Also returns how many names
    this folded."""
    out: dict[str, TrafficClass] = {}
    for s in snaps:
        for c in s.classes:
            mine = out.get(c.name)
            out[c.name] = c if mine is None else TrafficClass(
                c.name, mine.window + c.window, mine.lifetime + c.lifetime)
    ranked = sorted(out.values(), key=lambda c: (-c.lifetime.requests, c.name))
    rows = sum(name in out for name in classes.PROMPT_BUCKETS)
    kept, folded = [], []
    for c in ranked:
        if c.name == classes.OTHER:
            continue
        if c.name in classes.PROMPT_BUCKETS or rows < max_classes:
            rows += c.name not in classes.PROMPT_BUCKETS
            kept.append(c)
        else:
            folded.append(c)
    other = out.get(classes.OTHER)
    for c in folded:
        other = c if other is None else TrafficClass(classes.OTHER, other.window + c.window,
                                                     other.lifetime + c.lifetime)
    if other is not None:
        kept.append(replace(other, name=classes.OTHER))
    return tuple(sorted(kept, key=lambda c: (-c.lifetime.requests, c.name))), len(folded)


#: The per-request histograms a snapshot holds, added field by field.
_HISTOGRAMS = ("request_acceptance_rate", "request_acceptance_length", "request_duration", "time_to_first_token",
               "time_per_output_token")


def merge(snaps: Sequence[Snapshot], max_requests: int = 1000,
          max_classes: int = classes.MAX_CLASSES) -> Snapshot:
    """One snapshot of a server from its processes' snapshots (the first is this process's own, fresh one).

    The target's forwards are read by one process, while each step goes to the process vLLM handed its stats to:
    forwards timed at a batch size join its steps from any process, and a batch size no process stepped at is
    dropped (:func:`_stepped`). A gone process's snapshot is to come :func:`aged` (as
    :meth:`~specscope.engine.share.ProcessShare.others` hands them); none is judged here by its time. The merged
    snapshot
    is the first's moment (``time``): another's wall-clock time, however far ahead, never moves it."""
    if len(snaps) == 1:
        return _stepped(snaps[0])
    first = snaps[0]
    life, window = first.lifetime, first.window
    hists = {name: getattr(first, name) for name in _HISTOGRAMS}
    positions, attributed, health = first.acceptance_by_output_position, first.attributed, first.health
    dropped: list[str] = []
    for s in snaps[1:]:
        life, window = intervals.add(life, s.lifetime), intervals.add(window, s.window)
        hists = {name: _add_hist(h, getattr(s, name), name, dropped) for name, h in hists.items()}
        positions = _add_positions(positions, s.acceptance_by_output_position, dropped)
        attributed = intervals.add(attributed, s.attributed)
        health = _add_health(health, s.health)
    engines = _merge_engines(snaps)
    requests = sorted((r for s in snaps for r in s.requests), key=lambda r: r.finished_at)[-max_requests:]
    running, waiting = sum_known(e.running for e in engines), sum_known(e.waiting for e in engines)
    latency = _add_latency(snaps, dropped)
    if dropped:
        health = _add_health(health, Health(((DROPPED_HISTOGRAM, len(dropped)),),
                                            last_error=f"{DROPPED_HISTOGRAM}: {', '.join(sorted(set(dropped)))}"))
    merged_classes, folded = _add_classes(snaps, max_classes)
    return _stepped(replace(
        first,
        started_at=min(s.started_at for s in snaps),
        lifetime=life,
        window=window,
        running=first.running if running is None else running,
        waiting=first.waiting if waiting is None else waiting,
        kv=combine_kv(first.engine, engines) if engines else first.kv,
        requests=tuple(requests),
        **hists,
        tokenizer=first.tokenizer or next((s.tokenizer for s in snaps if s.tokenizer), None),
        cost_ratio=first.cost_ratio or next((s.cost_ratio for s in snaps if s.cost_ratio), None),
        decode_batch=window.step_times.busiest() or next((s.decode_batch for s in snaps if s.decode_batch), None),
        acceptance_by_output_position=positions,
        health=health,
        engines=engines,
        attributed=attributed,
        unavailable=tuple(sorted({u for s in snaps for u in s.unavailable})),
        latency_by_operation=latency,
        classes=merged_classes,
        folded_classes=sum(s.folded_classes for s in snaps) + folded,
        processes=sum(s.processes for s in snaps),
        capture=_add_capture([s.capture for s in snaps if s.capture is not None]),
    ))


def _stepped(snap: Snapshot) -> Snapshot:
    """``snap`` without the batch sizes that have forwards but no steps (``Hub.local_snapshot(forwards_alone=True)``),
    in its sums and in each engine's."""

    def totals(t: Totals) -> Totals:
        stepped = t.step_times.stepped()
        return t if stepped is t.step_times else replace(t, step_times=stepped)

    return replace(snap, lifetime=totals(snap.lifetime), window=totals(snap.window),
                   engines=tuple(replace(e, lifetime=totals(e.lifetime), window=totals(e.window))
                                 for e in snap.engines))


def _add_capture(parts: list[CaptureStatus]) -> CaptureStatus | None:
    """The processes' captures as one: counts added, the weak classes of any, a stop of any said."""
    if not parts:
        return None
    return CaptureStatus(parts[0].classes, sum(p.rows for p in parts), sum(p.bytes for p in parts),
                         sum(p.dropped_at_cap for p in parts), sum(p.dropped_behind for p in parts),
                         tuple(sorted({c for p in parts for c in p.weak_now})),
                         next((p.stopped for p in parts if p.stopped), None))


def sum_known(values: Iterable[int | None]) -> int | None:
    """The sum of the values that are known; None when none is."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None

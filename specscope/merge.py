"""Several snapshots of one server as one: the API-server processes of ``vllm serve --api-server-count N``.

vLLM hands each step's scheduler stats to one front end and each request's stats to the front end that owns the
request, so every API-server process sees a disjoint share of the steps and requests. Counts, step times,
histograms and the attribution sums add up; each engine's gauges (running, waiting, KV cache) are taken from
the process that heard from that engine last; request records are the newest of all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from specscope import intervals
from specscope.model import (
    EngineInfo,
    EngineView,
    Health,
    Histogram,
    KVCache,
    OperationLatency,
    PositionAcceptance,
    Snapshot,
    TrafficClass,
)


def _add_seq(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))


def _add_hist(a: Histogram | None, b: Histogram | None) -> Histogram | None:
    if a is None or b is None:
        return a or b
    return _sum_hist(a, b)


def _sum_hist(a: Histogram, b: Histogram) -> Histogram:
    """Two histograms' sum (the first where their buckets differ)."""
    if a.bounds != b.bounds:
        return a
    return Histogram(a.bounds, _add_seq(a.counts, b.counts), a.total + b.total)


def _add_positions(a: PositionAcceptance | None, b: PositionAcceptance | None) -> PositionAcceptance | None:
    if a is None or b is None or a.bounds != b.bounds:
        return a or b
    return PositionAcceptance(a.bounds, _add_seq(a.draft_tokens, b.draft_tokens), _add_seq(a.accepted, b.accepted))


def _add_health(a: Health, b: Health) -> Health:
    errors: dict[str, int] = dict(a.errors)
    for where, n in b.errors:
        errors[where] = errors.get(where, 0) + n
    return Health(tuple(sorted(errors.items())), a.dropped_records + b.dropped_records, a.last_error or b.last_error)


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


def _add_latency(snaps: Sequence[Snapshot]) -> tuple[OperationLatency, ...]:
    """Each operation's latency histograms, added over the snapshots."""
    ops: dict[str, OperationLatency] = {}
    for s in snaps:
        for o in s.latency_by_operation:
            mine = ops.get(o.operation)
            ops[o.operation] = o if mine is None else OperationLatency(
                o.operation, _sum_hist(mine.duration, o.duration),
                _sum_hist(mine.time_to_first_token, o.time_to_first_token),
                _sum_hist(mine.time_per_output_token, o.time_per_output_token))
    return tuple(ops[k] for k in sorted(ops))


def _add_classes(snaps: Sequence[Snapshot]) -> tuple[TrafficClass, ...]:
    """Each traffic class summed over the processes, by name (most requests first)."""
    out: dict[str, TrafficClass] = {}
    for s in snaps:
        for c in s.classes:
            mine = out.get(c.name)
            out[c.name] = c if mine is None else TrafficClass(
                c.name, mine.window + c.window, mine.lifetime + c.lifetime)
    return tuple(sorted(out.values(), key=lambda c: (-c.lifetime.requests, c.name)))


def merge(snaps: Sequence[Snapshot], max_requests: int = 1000) -> Snapshot:
    """One snapshot of a server from its processes' snapshots (the first is this process's own, fresh one)."""
    if len(snaps) == 1:
        return snaps[0]
    first = snaps[0]
    life, window = first.lifetime, first.window
    hists = [first.request_acceptance_rate, first.request_acceptance_length, first.request_duration,
             first.time_to_first_token, first.time_per_output_token]
    positions, attributed, health = first.acceptance_by_output_position, first.attributed, first.health
    for s in snaps[1:]:
        life, window = intervals.add(life, s.lifetime), intervals.add(window, s.window)
        theirs = [s.request_acceptance_rate, s.request_acceptance_length, s.request_duration,
                  s.time_to_first_token, s.time_per_output_token]
        hists = [_add_hist(a, b) for a, b in zip(hists, theirs, strict=True)]
        positions = _add_positions(positions, s.acceptance_by_output_position)
        attributed = intervals.add(attributed, s.attributed)
        health = _add_health(health, s.health)
    engines = _merge_engines(snaps)
    requests = sorted((r for s in snaps for r in s.requests), key=lambda r: r.finished_at)[-max_requests:]
    running, waiting = sum_known(e.running for e in engines), sum_known(e.waiting for e in engines)
    return replace(
        first,
        time=max(s.time for s in snaps),
        started_at=min(s.started_at for s in snaps),
        lifetime=life,
        window=window,
        running=first.running if running is None else running,
        waiting=first.waiting if waiting is None else waiting,
        kv=combine_kv(first.engine, engines) if engines else first.kv,
        requests=tuple(requests),
        request_acceptance_rate=hists[0],
        request_acceptance_length=hists[1],
        request_duration=hists[2],
        time_to_first_token=hists[3],
        time_per_output_token=hists[4],
        tokenizer=first.tokenizer or next((s.tokenizer for s in snaps if s.tokenizer), None),
        cost_ratio=first.cost_ratio or next((s.cost_ratio for s in snaps if s.cost_ratio), None),
        decode_batch=window.step_times.busiest() or next((s.decode_batch for s in snaps if s.decode_batch), None),
        acceptance_by_output_position=positions,
        health=health,
        engines=engines,
        attributed=attributed,
        unavailable=tuple(sorted({u for s in snaps for u in s.unavailable})),
        latency_by_operation=_add_latency(snaps),
        classes=_add_classes(snaps),
        folded_classes=sum(s.folded_classes for s in snaps),
        processes=sum(s.processes for s in snaps),
    )


def sum_known(values: Iterable[int | None]) -> int | None:
    """The sum of the values that are known; None when none is."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None

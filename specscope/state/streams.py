"""The steps of each engine of a data-parallel server, kept apart: one :class:`EngineStream` per vLLM
``engine_idx``, behind one lock (:class:`EngineStreams`), folded into a snapshot's sums and per-engine views."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

from specscope.core.counts import Counts, Ring, StepBatch, StepTimer, batch_seconds, moment_spread
from specscope.core.model import EngineInfo, EngineView, KVCache, Totals

#: Why the KV token estimate is withheld while requests share cached prefix blocks.
SHARED_PREFIXES = ("not estimable while requests share prefix-cache blocks (vLLM counts a shared block once; "
                   "requests' token counts cannot tell which blocks they share)")


class StreamsView(NamedTuple):
    """The streams at one moment: the engines' sums over their lifetime and the window, and each engine."""

    lifetime: Totals
    window: Totals
    engines: tuple[EngineView, ...]


class EngineStreams:
    """One :class:`EngineStream` per data-parallel engine, made on its first step; thread-safe."""

    def __init__(self, ring_size: int) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, EngineStream] = {}
        self.ring_size = ring_size

    def add(self, index: int, steps: StepBatch) -> None:
        """Add consecutive steps of the engine ``index``."""
        with self._lock:
            self._stream(index).add_steps(steps)

    def add_forwards(self, index: int, now: float, forwards: Sequence[tuple[int, int, int, float]],
                     decode_tokens: int) -> None:
        """Add the engine ``index``'s target forwards timed since the last call (:meth:`Counts.add_forwards`) to the
        second of ``now``, when they were read."""
        with self._lock:
            self._stream(index).ring.bucket(int(now)).add_forwards(forwards, decode_tokens)

    def _stream(self, index: int) -> EngineStream:
        """The engine ``index``'s stream, made on its first numbers (the caller holds the lock)."""
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = EngineStream(self.ring_size)
        return stream

    def hold(self, seconds: float) -> None:
        """Keep at least ``seconds`` of per-second counts; a longer ring starts empty (lifetimes are kept)."""
        with self._lock:
            if seconds >= self.ring_size:
                self.ring_size = int(seconds) + 1
                for stream in self._streams.values():
                    stream.ring = stream.ring.resized(self.ring_size)

    def clear(self) -> None:
        """Forget every engine's window; lifetimes are kept."""
        with self._lock:
            for stream in self._streams.values():
                stream.ring.clear()

    def read(self, now: float, span: float, window_len: float, age: float, info: EngineInfo,
             forwards_alone: bool = False) -> StreamsView:
        """The sums and engines: windows of the last ``span`` seconds up to ``now`` (rates over ``window_len``),
        lifetimes over ``age`` seconds (``forwards_alone``: as in :meth:`Counts.totals`)."""
        k = info.num_speculative_tokens
        life, window = Counts(), Counts()
        engines = []
        second, seconds = int(now), int(span)
        spreads: dict[int, tuple[float, int]] = {}
        with self._lock:
            for index, stream in sorted(self._streams.items()):
                lifetime, w = stream.ring.lifetime(), stream.ring.sum(second, seconds)
                life.add(lifetime)
                window.add(w)
                spreads = _spreads([stream.ring], second, seconds)
                engines.append(stream.view(index, info, lifetime.totals(age, k, None, forwards_alone),
                                           w.totals(window_len, k, spreads, forwards_alone)))
            if len(self._streams) > 1:
                spreads = _spreads([s.ring for s in self._streams.values()], second, seconds)
        return StreamsView(life.totals(age, k, None, forwards_alone),
                           window.totals(window_len, k, spreads, forwards_alone), tuple(engines))


def _spreads(rings: list[Ring], second: int, seconds: int) -> dict[int, tuple[float, int]]:
    """Each batch size's moment-to-moment spread of its decode-step time over the window, and the seconds it is
    over (0 where too few to tell one)."""
    spreads = {}
    for b, rows in batch_seconds(rings, second, seconds).items():
        spread = moment_spread(rows)
        spreads[b] = (spread, len(rows) if spread else 0)
    return spreads


class EngineStream:
    """Everything one engine's steps say: lifetime and per-second counts, step timing, the gauges it reported last,
    and the KV token estimate (tokens held by its live requests). Kept per engine of a data-parallel server, so
    that no engine's gauges overwrite another's and step timing never spans two engines' reports."""

    __slots__ = ("decode_batch", "kv_usage", "live_tokens", "ring", "running", "timer", "updated_at", "waiting")

    def __init__(self, ring_size: int) -> None:
        self.ring = Ring(ring_size)
        self.timer = StepTimer()
        self.running: int | None = None
        self.waiting: int | None = None
        self.kv_usage: float | None = None
        self.live_tokens = 0
        self.decode_batch: int | None = None
        self.updated_at: float | None = None

    def add_steps(self, steps: StepBatch) -> None:
        """Add consecutive steps of this engine (the caller holds the lock); the steps of one second are added
        to its bucket together."""
        timings = self.timer.time(steps)
        contexts = self._contexts(steps)
        times = steps.times
        seconds = list(map(int, times))
        start, n = 0, len(seconds)
        while start < n:
            second = seconds[start]
            end = start + 1
            while end < n and seconds[end] == second:
                end += 1
            whole = start == 0 and end == n
            self.ring.bucket(second).add_steps(steps if whole else steps.part(start, end),
                                               timings if whole else timings[start:end],
                                               contexts if whole else contexts[start:end])
            start = end
        last = next((batch for batch, _, decode in filter(None, reversed(timings)) if decode), None)
        if last is not None:
            self.decode_batch = last
        # The gauges as the last step that reported them.
        kv = next((v for v in reversed(steps.kv_usage) if v is not None), None)
        if kv is not None:
            self.kv_usage = kv
        last_report = next((i for i in range(n - 1, -1, -1) if steps.running[i] is not None), None)
        if last_report is not None:
            self.running, self.waiting = steps.running[last_report], steps.waiting[last_report]
            self.updated_at = times[last_report]

    def _contexts(self, steps: StepBatch) -> list[float]:
        """Each step's tokens per request it attended over (the live requests' prompts and outputs before the step,
        over its batch, or over the requests this process saw of it; 0.0 where unknown), as the KV estimate is
        carried forward step by step."""
        live = self.live_tokens
        out = []
        for running, waiting, batch, seen, prompt, generated, finished in zip(
                steps.running, steps.waiting, steps.batch, steps.seen, steps.prompt_tokens, steps.generation_tokens,
                steps.finished_tokens, strict=True):
            mine = batch if seen is None else seen  # the requests whose tokens ``live`` counts
            out.append(live / mine if mine and live >= mine else 0.0)
            if running == 0 and not waiting:
                live = 0  # this engine is idle: nothing can be held, whatever the estimate drifted to
                continue
            live += prompt + generated - finished
            if live < 0:
                live = 0
        self.live_tokens = live
        return out

    def view(self, index: int, info: EngineInfo, lifetime: Totals, window: Totals) -> EngineView:
        """This engine in a snapshot, given its totals; with prefix-cache hits in the window the KV token estimate
        is withheld, with why."""
        shared = window.prefix_cache_hits > 0
        kv = KVCache(block_size=info.block_size, num_blocks=info.num_blocks, block_usage=self.kv_usage,
                     tokens_held=None if shared or self.kv_usage is None else self.live_tokens,
                     not_estimable=SHARED_PREFIXES if shared else None)
        return EngineView(index=index, lifetime=lifetime, window=window, running=self.running, waiting=self.waiting,
                          kv=kv, decode_batch=window.step_times.busiest() or self.decode_batch,
                          updated_at=self.updated_at)

"""The hub: one thread-safe, bounded store that every collector writes and every consumer reads.

Writers (the stat logger, the wrapper, the server middleware) call :meth:`Hub.record_step` and
:meth:`Hub.record_request` from the engine's path: these only add numbers under a lock and never raise.
Readers call :meth:`Hub.snapshot`. The numbers are kept in one :class:`~specscope.counts.EngineStream` per engine
of a data-parallel server (counts, window, step timing, gauges, KV estimate, kept apart) and a
:class:`~specscope.request_log.RequestLog` (request records); beside them the hub has its health
(:class:`~specscope.health.HealthLog`), its :class:`~specscope.baseline.Baseline` and its background threads
(:mod:`specscope.background`). Memory is bounded: lifetime totals are counters, windows are rings of one-second
buckets, and only the last ``max_requests`` request records are kept.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from specscope import classes
from specscope.background import Dispatcher, GpuPoller, GpuSource, Listener
from specscope.counts import Counts, EngineStream, StepBatch, StepStats
from specscope.health import HealthLog
from specscope.merge import combine_kv, merge
from specscope.model import CostRatio, EngineInfo, RequestRecord, Snapshot, StepProfile, TokenizerStatus
from specscope.request_log import PENDING_TIMEOUT_S, RequestLog
from specscope.verdict import Baseline

__all__ = ["GpuSource", "Hub", "Listener", "StepStats", "default_hub"]

#: A finished request's per-step accepted and drafted token counts (vLLM's ``detailed`` metrics).
PerStep = tuple[Sequence[int], Sequence[int]]


class Hub:
    """Thread-safe telemetry store. See the module docstring."""

    #: Seconds a request record waits for its other part before listeners get it as it is.
    PENDING_TIMEOUT_S = PENDING_TIMEOUT_S

    def __init__(self, window_s: float = 60.0, max_requests: int = 1000, history_s: float = 900.0,
                 gpu_poll_s: float = 2.0, clock: Callable[[], float] = time.time,
                 max_classes: int | None = None) -> None:
        if window_s <= 0 or max_requests <= 0 or history_s <= 0:
            raise ValueError("window_s, max_requests and history_s must be positive")
        self._clock = clock
        self._lock = threading.Lock()
        self._ring_size = int(max(history_s, window_s)) + 1
        self._streams: dict[int, EngineStream] = {}
        self._window_s = window_s
        self._started = self._window_start = clock()
        self._engine = EngineInfo()
        self._tokenizer: TokenizerStatus | None = None
        self._cost_ratio: CostRatio | None = None
        self._requests = RequestLog(max_requests, classes.max_classes() if max_classes is None else max_classes,
                                    self._ring_size)
        self._pending_sources: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._share: Any = None
        #: Where specscope's own failures are counted (``hub.health.count_error``); shown in every snapshot.
        self.health = HealthLog()
        self._baseline = Baseline()
        self._gpu = GpuPoller(gpu_poll_s, self.health)
        self._dispatch = Dispatcher(self.health, self._expired)

    # ----------------------------------------------------------------- configuration
    @property
    def window_s(self) -> float:
        """Length of the sliding window in seconds."""
        return self._window_s

    def set_window(self, seconds: float) -> None:
        """Change the sliding window's length; beyond the kept history (``history_s``) it starts empty."""
        if seconds <= 0:
            raise ValueError("window must be positive")
        with self._lock:
            self._window_s = seconds
            if seconds >= self._ring_size:
                self._ring_size = int(seconds) + 1
                for stream in self._streams.values():  # a longer window starts empty
                    stream.ring = stream.ring.resized(self._ring_size)

    def reset_window(self) -> None:
        """Forget the window's contents; lifetime totals are kept."""
        with self._lock:
            for stream in self._streams.values():
                stream.ring.clear()
            self._requests.clear_class_window()
            self._window_start = self._clock()

    def set_engine(self, info: EngineInfo) -> None:
        """Say which engine and models the numbers come from."""
        with self._lock:
            self._engine = info
        self._baseline.check(info.setup)

    def set_tokenizer_status(self, status: TokenizerStatus) -> None:
        """Record the verdict of the start-up tokenizer check."""
        with self._lock:
            self._tokenizer = status

    def set_cost_ratio(self, cost: CostRatio | None) -> None:
        """Record c, the draft/target step-cost ratio the speedup estimate uses."""
        with self._lock:
            self._cost_ratio = cost

    def set_baseline(self, profile: StepProfile | None) -> None:
        """Give the same target's step times without speculation, which turn live step times into a measured c
        (see :class:`~specscope.baseline.Baseline`: one from another setup is not used, and ``baseline_problem``
        says why)."""
        self._baseline.set(profile, self._engine.setup)

    @property
    def clock(self) -> Callable[[], float]:
        """The hub's clock (``time.time`` unless a test gave another)."""
        return self._clock

    def add_pending_source(self, flush: Callable[[], None]) -> None:
        """A writer that keeps steps before adding them (the stat logger): ``flush`` (a bound method, held weakly)
        is called before every read, so that readers see every step recorded so far."""
        with self._lock:
            self._pending_sources = [w for w in self._pending_sources if w() is not None]
            self._pending_sources.append(weakref.WeakMethod(flush))

    def _flush_pending(self) -> None:
        for ref in self._pending_sources:
            flush = ref()
            if flush is not None:
                try:
                    flush()
                except Exception as exc:
                    self.health.count_error("stat logger flush", exc)

    @property
    def tokenizer_status(self) -> TokenizerStatus | None:
        """The tokenizer verdict recorded so far, if any."""
        return self._tokenizer

    @property
    def engine(self) -> EngineInfo:
        """The engine description last set."""
        return self._engine

    def expect_request_parts(self, parts: int) -> None:
        """How many sources report each request (2 when timing and speculative numbers come separately)."""
        with self._lock:
            self._requests.parts_expected = max(1, parts)

    def add_gpu_source(self, name: str, source: GpuSource) -> None:
        """Poll ``source`` for GPU memory every ``gpu_poll_s`` seconds, on a background thread; a source added under
        an existing name replaces it."""
        self._gpu.add(name, source)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every finished request, on a background thread."""
        self._dispatch.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._dispatch.remove(listener)

    def attach_share(self, share: Any) -> None:
        """Merge the snapshots other API-server processes of this server publish (:mod:`specscope.share`)."""
        self._share = share

    # ----------------------------------------------------------------- writers (engine path)
    def record_step(self, s: StepStats, engine: int = 0) -> None:
        """Add one step of the data-parallel engine ``engine`` (vLLM's ``engine_idx``; 0 without DP), now."""
        self.record_steps(engine, StepBatch.of([(self._clock(), s)]))

    def record_steps(self, engine: int, steps: StepBatch) -> None:
        """Add consecutive steps of ``engine``, each with the hub-clock time it was reported at."""
        if not steps.times:
            return
        with self._lock:
            stream = self._streams.get(engine)
            if stream is None:
                stream = self._streams[engine] = EngineStream(self._ring_size)
            stream.add_steps(steps)
            if self._engine.num_speculative_tokens is None:
                k = next((k for k in steps.num_spec_tokens if k is not None), None)
                if k is not None:
                    self._engine = replace(self._engine, num_speculative_tokens=k)
            expired = self._requests.release_expired(steps.times[-1])
        self._dispatch.publish(expired)

    def record_request(self, request_id: str, **fields: Any) -> None:
        """Add one source's part of a finished request (see :class:`RequestRecord` for the fields)."""
        now = self._clock()
        with self._lock:
            done = self._requests.add_part(request_id, now, fields)
        self._dispatch.publish(done)

    def record_finished(self, requests: Sequence[tuple[float, str, dict[str, Any], PerStep | None]]) -> None:
        """Add parts of requests that finished in the engine: ``(hub-clock time, request id, fields, per-step draft
        counts)``, the counts where vLLM kept them (see :meth:`record_draft_positions`)."""
        done: list[RequestRecord] = []
        with self._lock:
            log = self._requests
            for now, request_id, fields, per_step in requests:
                done += log.add_part(request_id, now, fields)
                if per_step is not None:
                    log.add_positions(*per_step)
        self._dispatch.publish(done)

    def record_draft_positions(self, per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> None:
        """Add one finished request's per-step draft counts (vLLM's ``detailed`` metrics) by output position."""
        with self._lock:
            self._requests.add_positions(per_step_accepted, per_step_drafted)

    def _expired(self) -> list[RequestRecord]:
        """The records that waited too long for their other part, released now (for the listeners' thread)."""
        with self._lock:
            return self._requests.release_expired(self._clock())

    # ----------------------------------------------------------------- readers
    def has_request(self, request_id: str) -> bool:
        """Whether a record for ``request_id`` is held."""
        self._flush_pending()
        with self._lock:
            return request_id in self._requests.recent

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until every record so far (steps kept by a writer included) reached the listeners (for tests and
        shutdown)."""
        self._flush_pending()
        return self._dispatch.wait_idle(timeout)

    def snapshot(self, window_s: float | None = None) -> Snapshot:
        """The server's snapshot: this process's, merged with its other API-server processes' where shared.
        ``window_s``: the window's length (default: the hub's); beyond the kept history the window is all of it.
        Other processes' windows are the ones they published (their hubs' own)."""
        own = self.local_snapshot(window_s)
        return own if self._share is None else merge([own, *self._share.others()], self._requests.max_requests)

    def local_snapshot(self, window_s: float | None = None) -> Snapshot:
        """An immutable view of everything this process recorded: the engines' sums, and each engine on its own
        (``window_s``: as in :meth:`snapshot`)."""
        self._flush_pending()
        gpu, health, unavailable = self._gpu.last, self.health.freeze(), self.health.unavailable()
        baseline, baseline_problem = self._baseline.state
        with self._lock:
            now = self._clock()
            age = now - self._started
            k = self._engine.num_speculative_tokens
            span = self._window_s if window_s is None else min(window_s, self._ring_size - 1)
            window_len = min(span, now - self._window_start)
            info = self._engine
            life, window = Counts(), Counts()
            engines = []
            for index, stream in sorted(self._streams.items()):
                lifetime, w = stream.ring.lifetime(), stream.ring.sum(int(now), int(span))
                life.add(lifetime)
                window.add(w)
                engines.append(stream.view(index, info, lifetime.totals(age, k), w.totals(window_len, k)))
            requests = self._requests
            spec_on = k is not None
            fleet_window = window.totals(window_len, k)
            return Snapshot(
                time=now,
                started_at=self._started,
                engine=info,
                lifetime=life.totals(age, k),
                window=fleet_window,
                window_seconds=span,
                running=_sum(e.running for e in engines),
                waiting=_sum(e.waiting for e in engines),
                kv=combine_kv(info, engines),
                gpu=gpu,
                requests=tuple(requests.recent.values()),
                request_acceptance_rate=requests.rate.freeze() if spec_on else None,
                request_acceptance_length=requests.length.freeze() if spec_on else None,
                request_duration=requests.e2e.freeze(),
                time_to_first_token=requests.ttft.freeze(),
                time_per_output_token=requests.tpot.freeze(),
                tokenizer=self._tokenizer,
                cost_ratio=self._cost_ratio,
                baseline=baseline,
                baseline_problem=baseline_problem,
                decode_batch=fleet_window.step_times.busiest()
                or next((e.decode_batch for e in engines if e.decode_batch), None),
                acceptance_by_output_position=requests.positions(),
                health=health,
                engines=tuple(engines),
                attributed=requests.attribution(),
                unavailable=unavailable,
                latency_by_operation=requests.latency_by_operation(),
                classes=requests.traffic_classes(now - window_len),
                folded_classes=requests.folded_classes(),
            )


def _sum(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


_default: Hub | None = None
_default_lock = threading.Lock()


def default_hub() -> Hub:
    """The process-wide hub that the vLLM plugin, the middleware and ``specscope.LLM`` share by default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Hub()
        return _default

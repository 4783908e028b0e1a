"""The hub: one thread-safe, bounded store that every collector writes and every consumer reads.

Writers (the stat logger, the wrapper, the server middleware) add steps with :meth:`Hub.record_steps` and request
parts through :attr:`Hub.requests` from the engine's path: these only add numbers under a lock and never raise.
Readers call :meth:`Hub.snapshot`. A hub holds one vLLM engine's numbers (:meth:`Hub.claim`; the engines of one
data-parallel server are one). The steps are kept per engine of a data-parallel server
(:class:`~specscope.state.streams.EngineStreams`), the requests in a
:class:`~specscope.state.request_store.RequestStore`;
beside them are the hub's health (:class:`~specscope.core.health.HealthLog`), its
:class:`~specscope.state.baseline.Baseline` and its GPU poller. Memory is bounded: lifetime totals are counters,
windows are rings of one-second buckets, and only the last ``max_requests`` request records are kept.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from specscope.core import classes
from specscope.core.counts import StepBatch, StepStats
from specscope.core.health import HealthLog
from specscope.core.model import CaptureStatus, CostRatio, EngineInfo, Snapshot, StepProfile, TokenizerStatus
from specscope.state.background import Flushers, GpuPoller, GpuSource, Listener
from specscope.state.baseline import Baseline
from specscope.state.merge import combine_kv, merge, sum_known
from specscope.state.request_log import RequestLog
from specscope.state.request_store import RequestStore
from specscope.state.streams import EngineStreams

__all__ = ["GpuSource", "Hub", "Listener", "SharedSnapshots", "StepStats", "default_hub"]


class SharedSnapshots(Protocol):
    """The other API-server processes of this server (:class:`specscope.engine.share.ProcessShare`)."""

    def others(self) -> list[Snapshot]:
        """Their last published snapshots."""


class Hub:
    """Thread-safe telemetry store. See the module docstring."""

    def __init__(self, window_s: float = 60.0, max_requests: int = 1000, history_s: float = 900.0,
                 gpu_poll_s: float = 2.0, clock: Callable[[], float] = time.time,
                 max_classes: int | None = None) -> None:
        if window_s <= 0 or max_requests <= 0 or history_s <= 0:
            raise ValueError("window_s, max_requests and history_s must be positive")
        self._clock = clock
        self._lock = threading.Lock()
        ring_size = int(max(history_s, window_s)) + 1
        self._streams = EngineStreams(ring_size)
        self._window_s = window_s
        self._started = self._window_start = clock()
        self._engine = EngineInfo()
        self._recorded: Callable[[], object | None] | None = None  # the engine whose numbers these are (its config)
        self._tokenizer: TokenizerStatus | None = None
        self._cost_ratio: CostRatio | None = None
        self._share: SharedSnapshots | None = None
        self._capture: Callable[[], CaptureStatus] | None = None
        self._server_processes = 1
        #: Where specscope's own failures are counted (``hub.health.count_error``); shown in every snapshot.
        self.health = HealthLog()
        self._pending = Flushers(self.health)
        log = RequestLog(max_requests, classes.max_classes() if max_classes is None else max_classes, ring_size,
                         classes.RANK_WINDOWS * window_s)
        #: Finished requests: writers add their parts here, listeners get each final record once.
        self.requests = RequestStore(log, self.health, clock, self._pending.flush)
        self._baseline = Baseline()
        self._gpu = GpuPoller(gpu_poll_s, self.health)

    # ----------------------------------------------------------------- configuration
    @property
    def window_s(self) -> float:
        """Length of the sliding window in seconds."""
        return self._window_s

    def set_window(self, seconds: float) -> None:
        """Change the sliding window's length; beyond the kept history (``history_s``) it starts empty. Traffic
        classes' traffic is ranked for rows over :data:`classes.RANK_WINDOWS` windows."""
        if seconds <= 0:
            raise ValueError("window must be positive")
        with self._lock:
            self._window_s = seconds
        self._streams.hold(seconds)
        self.requests.set_class_rank(classes.RANK_WINDOWS * seconds)

    def reset_window(self) -> None:
        """Forget the window's contents; lifetime totals are kept."""
        self._streams.clear()
        self.requests.clear_window()
        with self._lock:
            self._window_start = self._clock()

    def set_engine(self, info: EngineInfo) -> None:
        """Say which engine and models the numbers come from."""
        with self._lock:
            self._engine = info
        self._baseline.check(info.setup)

    def set_baseline(self, profile: StepProfile | None) -> None:
        """Give the same target's step times without speculation, which turn live step times into a measured c
        (see :class:`~specscope.state.baseline.Baseline`: one from another setup is not used, and ``baseline_problem``
        says why)."""
        self._baseline.set(profile, self._engine.setup)

    def claim(self, engine: object) -> bool:
        """Record ``engine`` (a vLLM engine's config, which names the engine) here: False where the hub holds another
        engine's numbers, which would mix with its own. The engine that recorded here may leave (uninstrumented, or
        moved to another hub) and come back; no other engine takes its place."""
        with self._lock:
            if self._recorded is None:
                try:
                    self._recorded = weakref.ref(engine)
                except TypeError:
                    self._recorded = lambda: engine
                return True
            return self._recorded() is engine

    def holds_other(self, engine: object | None = None) -> bool:
        """Whether the hub holds the numbers of an engine other than ``engine`` (of any engine, where None)."""
        with self._lock:
            return self._recorded is not None and (engine is None or self._recorded() is not engine)

    @property
    def clock(self) -> Callable[[], float]:
        """The hub's clock (``time.time`` unless a test gave another)."""
        return self._clock

    def add_pending_source(self, flush: Callable[[], None]) -> None:
        """A writer that keeps steps before adding them (the stat logger): ``flush`` (a bound method, held weakly)
        is called before every read, so that readers see every step recorded so far."""
        self._pending.add(flush)

    @property
    def engine(self) -> EngineInfo:
        """The engine description last set."""
        return self._engine

    def add_gpu_source(self, name: str, source: GpuSource) -> None:
        """Poll ``source`` for GPU memory every ``gpu_poll_s`` seconds, on a background thread; a source added under
        an existing name replaces it."""
        self._gpu.add(name, source)

    def attach_share(self, share: SharedSnapshots) -> None:
        """Merge the snapshots other API-server processes of this server publish (:mod:`specscope.engine.share`)."""
        self._share = share

    # The slots below are each written by one writer, named in its setter; every reader sees them in the snapshot.
    @property
    def tokenizer(self) -> TokenizerStatus | None:
        """The start-up tokenizer check's verdict, if one ran."""
        return self._tokenizer

    def set_tokenizer(self, status: TokenizerStatus | None) -> None:
        """Written by the start-up tokenizer check (:func:`specscope.core.tokenizer_check.record_verdict`)."""
        self._tokenizer = status

    @property
    def cost_ratio(self) -> CostRatio | None:
        """c estimated from the models' configs (the speedup estimate's c without a baseline), if known."""
        return self._cost_ratio

    def set_cost_ratio(self, ratio: CostRatio | None) -> None:
        """Written by the stat logger from the loaded configs (:func:`specscope.engine.vllm_config.cost_ratio`), or
        given by a user or test."""
        self._cost_ratio = ratio

    @property
    def server_processes(self) -> int:
        """The server's API-server processes, whether or not their numbers are shared."""
        return self._server_processes

    def set_server_processes(self, processes: int) -> None:
        """Written by :func:`specscope.engine.share.join` as vLLM starts this process."""
        self._server_processes = max(1, processes)

    def set_capture(self, status: Callable[[], CaptureStatus] | None) -> None:
        """The opt-in capture of this engine's traffic (:class:`specscope.engine.capture.Capture`, which attaches
        itself as it starts and detaches as it closes): the hub reads only its status, into every snapshot."""
        self._capture = status

    # ----------------------------------------------------------------- writers (engine path)
    def record_step(self, s: StepStats, engine_index: int = 0) -> None:
        """Add one step of the data-parallel engine ``engine_index`` (vLLM's ``engine_idx``; 0 without DP), now."""
        self.record_steps(engine_index, StepBatch.of([(self._clock(), s)]))

    def record_steps(self, engine_index: int, steps: StepBatch) -> None:
        """Add consecutive steps of one data-parallel engine, each with the hub-clock time it was reported at."""
        if not steps.times:
            return
        self._streams.add(engine_index, steps)
        if self._engine.num_speculative_tokens is None:
            k = next((k for k in steps.num_spec_tokens if k is not None), None)
            if k is not None:
                with self._lock:
                    self._engine = replace(self._engine, num_speculative_tokens=k)
        self.requests.release_expired(steps.times[-1])

    def record_forwards(self, engine_index: int, forwards: Sequence[tuple[int, int, int, float]],
                        decode_tokens: int) -> None:
        """Add one engine's target forwards timed since the last call: ``(requests, tokens, count, seconds)`` rows
        (:mod:`specscope.engine.forward_timer`); those of at most ``decode_tokens`` (K + 1) tokens a request
        are decode forwards."""
        if forwards:
            self._streams.add_forwards(engine_index, self._clock(), forwards, decode_tokens)

    # ----------------------------------------------------------------- readers
    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until every record so far (steps kept by a writer included) reached the listeners (for tests and
        shutdown)."""
        return self.requests.wait_idle(timeout)

    def snapshot(self, window_s: float | None = None) -> Snapshot:
        """The server's snapshot: this process's, merged with its other API-server processes' where shared.
        ``window_s``: the window's length (default: the hub's); beyond the kept history the window is all of it.
        Other processes' windows are the ones they published (their hubs' own)."""
        if self._share is None:
            return self.local_snapshot(window_s)
        return merge([self.local_snapshot(window_s, forwards_alone=True), *self._share.others()],
                     self.requests.max_requests, self.requests.max_classes)

    def local_snapshot(self, window_s: float | None = None, forwards_alone: bool = False) -> Snapshot:
        """An immutable view of everything this process recorded: the engines' sums, and each engine on its own
        (``window_s``: as in :meth:`snapshot`; ``forwards_alone``: for other API-server processes to merge, the
        batch sizes this one timed the target's forward at without getting their steps, as in
        :meth:`~specscope.core.counts.Counts.totals`)."""
        self._pending.flush()
        gpu, health, unavailable = self._gpu.last, self.health.freeze(), self.health.unavailable()
        baseline, baseline_problem = self._baseline.state
        with self._lock:
            now, info, window_start = self._clock(), self._engine, self._window_start
            span = self._window_s if window_s is None else min(window_s, self._streams.ring_size - 1)
        window_len = min(span, now - window_start)
        streams = self._streams.read(now, span, window_len, now - self._started, info, forwards_alone)
        engines = streams.engines
        return Snapshot(
            time=now,
            started_at=self._started,
            engine=info,
            lifetime=streams.lifetime,
            window=streams.window,
            window_seconds=span,
            running=sum_known(e.running for e in engines),
            waiting=sum_known(e.waiting for e in engines),
            kv=combine_kv(info, engines),
            gpu=gpu,
            tokenizer=self._tokenizer,
            cost_ratio=self._cost_ratio,
            baseline=baseline,
            baseline_problem=baseline_problem,
            decode_batch=streams.window.step_times.busiest() or next((e.decode_batch for e in engines
                                                                      if e.decode_batch), None),
            health=health,
            engines=engines,
            server_processes=self._server_processes,
            unavailable=unavailable,
            capture=self._capture() if self._capture is not None else None,
            **self.requests.snapshot_fields(now - window_len, info.num_speculative_tokens is not None),
        )


_default: Hub | None = None
_default_lock = threading.Lock()


def default_hub() -> Hub:
    """The process-wide hub that the vLLM plugin, the middleware and ``specscope.LLM`` share by default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Hub()
        return _default

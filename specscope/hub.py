"""The hub: one thread-safe, bounded store that every collector writes and every consumer reads.

Writers (the stat logger, the wrapper, the server middleware) call :meth:`Hub.record_step` and
:meth:`Hub.record_request` from the engine's path: these only add numbers under a lock and never raise.
Readers call :meth:`Hub.snapshot`. The work is shared out: one :class:`~specscope.counts.EngineStream` per engine
of a data-parallel server (counts, window, step timing, gauges, KV estimate, kept apart), a
:class:`~specscope.request_log.RequestLog` (request records), a GPU poller, and the listeners' dispatch thread.
Memory is bounded: lifetime totals are counters, windows are rings of one-second buckets, and only the last
``max_requests`` request records are kept.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from specscope import classes
from specscope.counts import Counts, EngineStream, StepBatch, StepStats
from specscope.merge import combine_kv
from specscope.model import (
    ClassCounts,
    CostRatio,
    EngineInfo,
    EngineView,
    GpuMemory,
    Health,
    KVCache,
    RequestRecord,
    Snapshot,
    StepProfile,
    TokenizerStatus,
    TrafficClass,
)
from specscope.request_log import PENDING_TIMEOUT_S, RequestLog

__all__ = ["GpuSource", "Hub", "Listener", "StepStats", "default_hub"]

log = logging.getLogger("specscope")

#: A finished-request consumer; runs on the hub's dispatch thread, never in the engine's.
Listener = Callable[[RequestRecord], None]
#: A finished request's per-step accepted and drafted token counts (vLLM's ``detailed`` metrics).
PerStep = tuple[Sequence[int], Sequence[int]]
#: A polled source of GPU memory readings (see :mod:`specscope.collectors`).
GpuSource = Callable[[], GpuMemory]

_NO_GPU = GpuMemory(status="not collected")


class _GpuPoller:
    """GPU sources polled every ``interval`` seconds on a background thread (NVML takes milliseconds, which no
    reader, least of all a server's event loop, should wait for); a snapshot takes the last reading."""

    def __init__(self, interval: float, count_error: Callable[[str, BaseException], None]) -> None:
        self.interval = interval
        self.sources: list[tuple[str, GpuSource]] = []
        self.last: GpuMemory = _NO_GPU
        self._count_error = count_error
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, source: GpuSource) -> None:
        self.sources = [(n, s) for n, s in self.sources if n != name] + [(name, source)]
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specscope-gpu", daemon=True)
            self._thread.start()
        self._wake.set()

    def poll(self) -> GpuMemory:
        """Ask every source once, the first that answers wins (what the thread does each interval)."""
        for name, source in list(self.sources):
            try:
                self.last = source()
                break
            except Exception as exc:
                self._count_error(f"gpu source {name}", exc)
        return self.last

    def _run(self) -> None:
        while True:
            self._wake.clear()
            self._wake.wait(max(self.interval, 0.01))
            self.poll()


class Hub:
    """Thread-safe telemetry store. See the module docstring."""

    #: Seconds a request record waits for its other part before listeners get it as it is.
    PENDING_TIMEOUT_S = PENDING_TIMEOUT_S

    def __init__(
        self,
        window_s: float = 60.0,
        max_requests: int = 1000,
        history_s: float = 900.0,
        gpu_poll_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_classes: int | None = None,
    ) -> None:
        if window_s <= 0 or max_requests <= 0 or history_s <= 0:
            raise ValueError("window_s, max_requests and history_s must be positive")
        self._clock = clock
        self._lock = threading.Lock()
        self._ring_size = int(max(history_s, window_s)) + 1
        self._streams: dict[int, EngineStream] = {}
        self._window_s = window_s
        self._started = clock()
        self._window_start = self._started
        self._engine = EngineInfo()
        self._tokenizer: TokenizerStatus | None = None
        self._cost_ratio: CostRatio | None = None
        self._baseline: StepProfile | None = None
        self._baseline_problem: str | None = None
        self._requests = RequestLog(max_requests, _max_classes() if max_classes is None else max_classes,
                                    self._ring_size)
        self._errors: dict[str, int] = {}
        self._unavailable: set[str] = set()
        self._last_error: str | None = None
        self._dropped = 0
        self._gpu = _GpuPoller(gpu_poll_s, self.count_error)
        self._listeners: list[Listener] = []
        self._queue: queue.Queue[RequestRecord] = queue.Queue(maxsize=10_000)
        self._dispatcher: threading.Thread | None = None
        self._share: Any = None
        self._pending_sources: list[weakref.WeakMethod[Callable[[], None]]] = []

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
        self._check_baseline()

    def set_tokenizer_status(self, status: TokenizerStatus) -> None:
        """Record the verdict of the start-up tokenizer check."""
        with self._lock:
            self._tokenizer = status

    def set_cost_ratio(self, cost: CostRatio | None) -> None:
        """Record c, the draft/target step-cost ratio the speedup estimate uses."""
        with self._lock:
            self._cost_ratio = cost

    def set_baseline(self, profile: StepProfile | None) -> None:
        """Give the same target's step times without speculation, which turn live step times into a measured c.

        A baseline measured on another setup (model architecture, dtype, device, vLLM version, max_num_seqs, ...)
        is kept but not used: the snapshot says why in ``baseline_problem``, and one warning is logged.
        """
        with self._lock:
            self._baseline = profile
            self._baseline_problem = None
        self._check_baseline()

    def _check_baseline(self) -> None:
        from specscope.diagnostics import baseline_problem

        with self._lock:
            if self._baseline is None or self._baseline_problem is not None:
                return
            self._baseline_problem = baseline_problem(self._baseline, self._engine.setup)
            if self._baseline_problem is None:
                return
        log.warning("specscope: baseline not used: %s; run `specscope calibrate` on this setup", self._baseline_problem)

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
                    self.count_error("stat logger flush", exc)

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
        """Poll ``source`` for GPU memory every ``gpu_poll_s`` seconds, on a background thread.

        A source added under an existing name replaces it.
        """
        with self._lock:
            self._gpu.add(name, source)
        self._gpu.poll()  # a first reading now; the thread keeps it fresh

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every finished request, on a background thread."""
        with self._lock:
            self._listeners.append(listener)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="specscope-dispatch", daemon=True)
                self._dispatcher.start()

    def attach_share(self, share: Any) -> None:
        """Merge the snapshots other API-server processes of this server publish (:mod:`specscope.share`)."""
        self._share = share

    @property
    def share(self) -> Any:
        """The attached :class:`~specscope.share.ProcessShare`, if any."""
        return self._share

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            self._listeners = [x for x in self._listeners if x != listener]

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
        self._publish(expired)

    def record_request(self, request_id: str, **fields: Any) -> None:
        """Add one source's part of a finished request (see :class:`RequestRecord` for the fields)."""
        now = self._clock()
        with self._lock:
            done = self._requests.add_part(request_id, now, fields)
        self._publish(done)

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
        self._publish(done)

    def record_draft_positions(self, per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> None:
        """Add one finished request's per-step draft counts (vLLM's ``detailed`` metrics) by output position."""
        with self._lock:
            self._requests.add_positions(per_step_accepted, per_step_drafted)

    def has_request(self, request_id: str) -> bool:
        """Whether a record for ``request_id`` is held."""
        self._flush_pending()
        with self._lock:
            return request_id in self._requests.recent

    def count_error(self, where: str, exc: BaseException) -> None:
        """Count a failure of specscope's own code; log it the first time it happens at ``where``."""
        with self._lock:
            n = self._errors.get(where, 0) + 1
            self._errors[where] = n
            self._last_error = f"{where}: {type(exc).__name__}: {exc}"
        if n == 1:
            log.warning("specscope: %s failed (%s: %s); counting further failures silently", where,
                        type(exc).__name__, exc)

    def count_missing(self, fields: Sequence[str], unavailable: Iterable[str] = ()) -> None:
        """Count numbers vLLM's stats no longer carry (a renamed field); log each field the first time. The
        snapshot's numbers they leave unknown (``unavailable``) are None in every snapshot from now on."""
        first = []
        with self._lock:
            self._unavailable.update(unavailable)
            for name in fields:
                key = f"vllm field {name}"
                n = self._errors.get(key, 0) + 1
                self._errors[key] = n
                if n == 1:
                    first.append(name)
                    self._last_error = f"{key}: missing from this vLLM's stats"
        for name in first:
            log.warning("specscope: vLLM's stats have no %s; that number is unavailable, the rest is recorded "
                        "(counting further misses silently)", name)

    # ----------------------------------------------------------------- readers
    def snapshot(self, window_s: float | None = None) -> Snapshot:
        """The server's snapshot: this process's, merged with its other API-server processes' where shared.
        ``window_s``: the window's length (default: the hub's); beyond the kept history the window is all of it.
        Other processes' windows are the ones they published (their hubs' own)."""
        own = self.local_snapshot(window_s)
        others = self._share.others() if self._share is not None else []
        if not others:
            return own
        from specscope.merge import merge

        return replace(merge([own, *others], self._requests.max_requests), processes=1 + len(others))

    def local_snapshot(self, window_s: float | None = None) -> Snapshot:
        """An immutable view of everything this process recorded: the engines' sums, and each engine on its own
        (``window_s``: as in :meth:`snapshot`)."""
        self._flush_pending()
        gpu = self._poll_gpu()
        with self._lock:
            now = self._clock()
            k = self._engine.num_speculative_tokens
            span = self._window_s if window_s is None else min(window_s, self._ring_size - 1)
            window_len = min(span, now - self._window_start)
            info = self._engine
            life, window = Counts(), Counts()
            engines = []
            for index, stream in sorted(self._streams.items()):
                w = stream.ring.sum(int(now), int(span))
                lifetime = stream.ring.lifetime()
                life.add(lifetime)
                window.add(w)
                window_totals = w.totals(window_len, k)
                engines.append(EngineView(
                    index=index, lifetime=lifetime.totals(now - self._started, k), window=window_totals,
                    running=stream.running, waiting=stream.waiting,
                    kv=_kv(info, stream.kv_usage, stream.live_tokens, window_totals.prefix_cache_hits > 0),
                    decode_batch=window_totals.step_times.busiest() or stream.decode_batch,
                    updated_at=stream.updated_at))
            requests = self._requests
            spec_on = k is not None
            fleet_window = window.totals(window_len, k)
            return Snapshot(
                time=now,
                started_at=self._started,
                engine=info,
                lifetime=life.totals(now - self._started, k),
                window=fleet_window,
                window_seconds=span,
                running=_sum(e.running for e in engines),
                waiting=_sum(e.waiting for e in engines),
                kv=combine_kv(info, engines) if engines else _kv(info, None, 0),
                gpu=gpu,
                requests=tuple(requests.recent.values()),
                request_acceptance_rate=requests.rate.freeze() if spec_on else None,
                request_acceptance_length=requests.length.freeze() if spec_on else None,
                request_duration=requests.e2e.freeze(),
                time_to_first_token=requests.ttft.freeze(),
                time_per_output_token=requests.tpot.freeze(),
                tokenizer=self._tokenizer,
                cost_ratio=self._cost_ratio,
                baseline=self._baseline,
                baseline_problem=self._baseline_problem,
                decode_batch=fleet_window.step_times.busiest()
                or next((e.decode_batch for e in engines if e.decode_batch), None),
                acceptance_by_output_position=requests.positions(),
                health=Health(
                    errors=tuple(sorted(self._errors.items())),
                    dropped_records=self._dropped,
                    last_error=self._last_error,
                ),
                engines=tuple(engines),
                attributed=requests.attribution(),
                unavailable=tuple(sorted(self._unavailable)),
                latency_by_operation=requests.latency_by_operation(),
                classes=_classes(requests, now - window_len),
                folded_classes=requests.folded_classes(),
            )

    # ----------------------------------------------------------------- internals
    def _publish(self, records: list[RequestRecord]) -> None:
        if not records or not self._listeners:
            return
        for rec in records:
            try:
                self._queue.put_nowait(rec)
            except queue.Full:
                with self._lock:
                    self._dropped += 1

    def _dispatch(self) -> None:
        while True:
            try:
                rec = self._queue.get(timeout=1.0)
            except queue.Empty:
                # Release records whose second part never came, even when the engine is idle.
                with self._lock:
                    expired = self._requests.release_expired(self._clock())
                self._publish(expired)
                continue
            for listener in list(self._listeners):
                try:
                    listener(rec)
                except Exception as exc:  # a consumer's failure must not stop the others
                    self.count_error(f"listener {getattr(listener, '__qualname__', listener)!s}", exc)
            self._queue.task_done()

    def _poll_gpu(self) -> GpuMemory:
        return self._gpu.last

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until every record so far (steps kept by a writer included) reached the listeners (for tests and
        shutdown)."""
        self._flush_pending()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False


def _sum(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


#: Why the KV token estimate is withheld while requests share cached prefix blocks.
SHARED_PREFIXES = ("not estimable while requests share prefix-cache blocks (vLLM counts a shared block once; "
                   "requests' token counts cannot tell which blocks they share)")


def _kv(info: EngineInfo, usage: float | None, live_tokens: int, shared: bool = False) -> KVCache:
    """One engine's KV cache; with prefix-cache hits in the window the token estimate is withheld, with why."""
    if shared:
        return KVCache(block_size=info.block_size, num_blocks=info.num_blocks, block_usage=usage,
                       not_estimable=SHARED_PREFIXES)
    return KVCache(block_size=info.block_size, num_blocks=info.num_blocks, block_usage=usage,
                   tokens_held=live_tokens if usage is not None else None)


_default: Hub | None = None
_default_lock = threading.Lock()


def default_hub() -> Hub:
    """The process-wide hub that the vLLM plugin, the middleware and ``specscope.LLM`` share by default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Hub()
        return _default


def _max_classes() -> int:
    """``SPECSCOPE_MAX_CLASSES`` (a positive integer), else :data:`classes.MAX_CLASSES`."""
    raw = os.environ.get("SPECSCOPE_MAX_CLASSES", "").strip()
    if not raw:
        return classes.MAX_CLASSES
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
    except ValueError:
        log.warning("specscope: SPECSCOPE_MAX_CLASSES=%r is not a positive integer; using %d", raw,
                    classes.MAX_CLASSES)
        return classes.MAX_CLASSES
    return value


def _classes(requests: RequestLog, since: float) -> tuple[TrafficClass, ...]:
    """Each class's lifetime counts, and its window's (the requests that finished since ``since``)."""
    lifetime = requests.class_totals()
    if not lifetime:
        return ()
    window, empty = requests.window_classes(since), ClassCounts()
    out = [TrafficClass(name, window.get(name, empty), life) for name, life in lifetime.items() if life.requests]
    return tuple(sorted(out, key=lambda c: (-c.lifetime.requests, c.name)))


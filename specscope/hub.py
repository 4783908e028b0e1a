"""The hub: one thread-safe, bounded store that every collector writes and every consumer reads.

Writers (the stat logger, the wrapper, the server middleware) call :meth:`Hub.record_step` and
:meth:`Hub.record_request` from the engine's path: these only add numbers under a lock and never raise.
Readers call :meth:`Hub.snapshot`. Memory is bounded: lifetime totals are counters, the sliding window is a
ring of one-second buckets, and only the last ``max_requests`` request records are kept.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from specscope.counts import Counts, Ring, StepStats, StepTimer, scalars
from specscope.model import (
    ACCEPTANCE_LENGTH_BOUNDS,
    ACCEPTANCE_RATE_BOUNDS,
    OUTPUT_POSITION_BOUNDS,
    REQUEST_DURATION_BOUNDS,
    TPOT_BOUNDS,
    TTFT_BOUNDS,
    CostRatio,
    EngineInfo,
    GpuMemory,
    Health,
    Histogram,
    KVCache,
    PositionAcceptance,
    RequestRecord,
    Snapshot,
    StepProfile,
    TokenizerStatus,
)

__all__ = ["GpuSource", "Hub", "Listener", "StepStats", "default_hub"]

log = logging.getLogger("specscope")

#: A finished-request consumer; runs on the hub's dispatch thread, never in the engine's.
Listener = Callable[[RequestRecord], None]
#: A polled source of GPU memory readings (see :mod:`specscope.collectors`).
GpuSource = Callable[[], GpuMemory]

_NO_GPU = GpuMemory(status="not collected")


class _Hist:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        i = 0
        while i < len(self.bounds) and v > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.total += v

    def freeze(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.total)


class Hub:
    """Thread-safe telemetry store. See the module docstring."""

    #: Seconds a request record waits for its other part before listeners get it as it is.
    PENDING_TIMEOUT_S = 2.0

    def __init__(
        self,
        window_s: float = 60.0,
        max_requests: int = 1000,
        history_s: float = 900.0,
        gpu_poll_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window_s <= 0 or max_requests <= 0 or history_s <= 0:
            raise ValueError("window_s, max_requests and history_s must be positive")
        self._clock = clock
        self._lock = threading.Lock()
        self._ring = Ring(int(max(history_s, window_s)) + 1)
        self._window_s = window_s
        self._max_requests = max_requests
        self._gpu_poll_s = gpu_poll_s
        self._started = clock()
        self._window_start = self._started
        self._engine = EngineInfo()
        self._tokenizer: TokenizerStatus | None = None
        self._cost_ratio: CostRatio | None = None
        self._baseline: StepProfile | None = None
        self._baseline_problem: str | None = None
        self._timer = StepTimer()
        self._decode_batch: int | None = None
        self._positions = [[0, 0] for _ in range(len(OUTPUT_POSITION_BOUNDS) + 1)]  # [drafted, accepted]
        self._positions_seen = False
        self._life = Counts()
        self._running: int | None = None
        self._waiting: int | None = None
        self._kv_usage: float | None = None
        self._live_tokens = 0
        self._recent: OrderedDict[str, RequestRecord] = OrderedDict()
        # Request records waiting for their second part, and since when.
        self._pending: OrderedDict[str, float] = OrderedDict()
        self._parts_expected = 1
        self._parts: dict[str, int] = {}
        self._seq = 0
        self._rate_hist = _Hist(ACCEPTANCE_RATE_BOUNDS)
        self._len_hist = _Hist(ACCEPTANCE_LENGTH_BOUNDS)
        self._e2e_hist = _Hist(REQUEST_DURATION_BOUNDS)
        self._ttft_hist = _Hist(TTFT_BOUNDS)
        self._tpot_hist = _Hist(TPOT_BOUNDS)
        self._errors: dict[str, int] = {}
        self._last_error: str | None = None
        self._dropped = 0
        self._gpu_sources: list[tuple[str, GpuSource]] = []
        self._gpu: GpuMemory = _NO_GPU
        self._gpu_at = float("-inf")
        self._listeners: list[Listener] = []
        self._queue: queue.Queue[RequestRecord] = queue.Queue(maxsize=10_000)
        self._dispatcher: threading.Thread | None = None

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
            if seconds >= self._ring.size:
                self._ring = Ring(int(seconds) + 1)  # a longer window starts empty

    def reset_window(self) -> None:
        """Forget the window's contents; lifetime totals are kept."""
        with self._lock:
            self._ring.clear()
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
    def engine(self) -> EngineInfo:
        """The engine description last set."""
        return self._engine

    def expect_request_parts(self, parts: int) -> None:
        """How many sources report each request (2 when timing and speculative numbers come separately)."""
        with self._lock:
            self._parts_expected = max(1, parts)

    def add_gpu_source(self, name: str, source: GpuSource) -> None:
        """Poll ``source`` for GPU memory at most every ``gpu_poll_s`` seconds, when a snapshot is taken.

        A source added under an existing name replaces it.
        """
        with self._lock:
            self._gpu_sources = [(n, s) for n, s in self._gpu_sources if n != name] + [(name, source)]
            self._gpu_at = float("-inf")

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every finished request, on a background thread."""
        with self._lock:
            self._listeners.append(listener)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="specscope-dispatch", daemon=True)
                self._dispatcher.start()

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            self._listeners = [x for x in self._listeners if x != listener]

    # ----------------------------------------------------------------- writers (engine path)
    def record_step(self, s: StepStats) -> None:
        """Add one engine step's numbers."""
        now = self._clock()
        second = int(now)
        values = scalars(s)
        with self._lock:
            timing = self._timer.time(now, s)
            if timing is not None and timing.decode_s is not None:
                self._decode_batch = timing.batch
            self._life.add_step(values, s, timing)
            self._ring.add_step(second, values, s, timing)
            if s.running is not None:
                self._running, self._waiting = s.running, s.waiting
            if s.kv_usage is not None:
                self._kv_usage = s.kv_usage
            self._live_tokens = max(0, self._live_tokens + s.prompt_tokens + s.generation_tokens - s.finished_tokens)
            if s.running == 0 and not s.waiting:
                self._live_tokens = 0
            if s.num_spec_tokens is not None and self._engine.num_speculative_tokens is None:
                self._engine = replace(self._engine, num_speculative_tokens=s.num_spec_tokens)
            expired = self._release_expired(now)
        self._publish(expired)

    def record_request(self, request_id: str, **fields: Any) -> None:
        """Add one source's part of a finished request (see :class:`RequestRecord` for the fields)."""
        now = self._clock()
        with self._lock:
            rec = self._recent.get(request_id)
            if rec is None:
                self._seq += 1
                rec = RequestRecord(request_id=request_id, seq=self._seq, finished_at=now, **fields)
                self._recent[request_id] = rec
                while len(self._recent) > self._max_requests:
                    old, _ = self._recent.popitem(last=False)
                    self._parts.pop(old, None)
                    self._pending.pop(old, None)
            else:
                rec = replace(rec, **fields)
                self._recent[request_id] = rec
            parts = self._parts.get(request_id, 0) + 1
            done = []
            if parts >= self._parts_expected:
                self._parts.pop(request_id, None)
                self._pending.pop(request_id, None)
                self._observe(rec)
                done.append(rec)
            else:
                self._parts[request_id] = parts
                self._pending[request_id] = now
            done += self._release_expired(now)
        self._publish(done)

    def record_draft_positions(self, per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> None:
        """Add one finished request's per-step draft counts (vLLM's ``detailed`` metrics) by output position."""
        bounds = OUTPUT_POSITION_BOUNDS
        with self._lock:
            self._positions_seen = True
            position = 1  # the first token comes from prefill
            for accepted, drafted in zip(per_step_accepted, per_step_drafted, strict=False):
                row = self._positions[bisect.bisect_right(bounds, position)]
                row[0] += drafted
                row[1] += accepted
                position += accepted + 1

    def has_request(self, request_id: str) -> bool:
        """Whether a record for ``request_id`` is held."""
        with self._lock:
            return request_id in self._recent

    def count_error(self, where: str, exc: BaseException) -> None:
        """Count a failure of specscope's own code; log it the first time it happens at ``where``."""
        with self._lock:
            n = self._errors.get(where, 0) + 1
            self._errors[where] = n
            self._last_error = f"{where}: {type(exc).__name__}: {exc}"
        if n == 1:
            log.warning("specscope: %s failed (%s: %s); counting further failures silently", where,
                        type(exc).__name__, exc)

    # ----------------------------------------------------------------- readers
    def snapshot(self) -> Snapshot:
        """An immutable view of everything recorded so far."""
        gpu = self._poll_gpu()
        with self._lock:
            now = self._clock()
            k = self._engine.num_speculative_tokens
            window = self._ring.sum(int(now), int(self._window_s))
            window_len = min(self._window_s, now - self._window_start)
            spec_on = k is not None
            return Snapshot(
                time=now,
                started_at=self._started,
                engine=self._engine,
                lifetime=self._life.totals(now - self._started, k),
                window=window.totals(window_len, k),
                window_seconds=self._window_s,
                running=self._running,
                waiting=self._waiting,
                kv=KVCache(
                    block_size=self._engine.block_size,
                    num_blocks=self._engine.num_blocks,
                    block_usage=self._kv_usage,
                    tokens_held=self._live_tokens if self._kv_usage is not None else None,
                ),
                gpu=gpu,
                requests=tuple(self._recent.values()),
                request_acceptance_rate=self._rate_hist.freeze() if spec_on else None,
                request_acceptance_length=self._len_hist.freeze() if spec_on else None,
                request_duration=self._e2e_hist.freeze(),
                time_to_first_token=self._ttft_hist.freeze(),
                time_per_output_token=self._tpot_hist.freeze(),
                tokenizer=self._tokenizer,
                cost_ratio=self._cost_ratio,
                baseline=self._baseline,
                baseline_problem=self._baseline_problem,
                decode_batch=self._decode_batch,
                acceptance_by_output_position=PositionAcceptance(
                    OUTPUT_POSITION_BOUNDS, tuple(d for d, _ in self._positions),
                    tuple(a for _, a in self._positions)) if self._positions_seen else None,
                health=Health(
                    errors=tuple(sorted(self._errors.items())),
                    dropped_records=self._dropped,
                    last_error=self._last_error,
                ),
            )

    # ----------------------------------------------------------------- internals
    def _observe(self, rec: RequestRecord) -> None:
        """Add a final request record to the lifetime histograms (under the lock, once per request)."""
        if rec.acceptance_rate is not None:
            self._rate_hist.observe(rec.acceptance_rate)
        if rec.mean_acceptance_length is not None:
            self._len_hist.observe(rec.mean_acceptance_length)
        if rec.e2e_s is not None:
            self._e2e_hist.observe(rec.e2e_s)
        if rec.ttft_s is not None:
            self._ttft_hist.observe(rec.ttft_s)
        if rec.tpot_s:
            self._tpot_hist.observe(rec.tpot_s)

    def _release_expired(self, now: float) -> list[RequestRecord]:
        """Finalize the records that waited too long for their second part (under the lock)."""
        out = []
        since = self._pending
        while since:
            rid, t = next(iter(since.items()))
            if now - t < self.PENDING_TIMEOUT_S:
                break
            since.popitem(last=False)
            self._parts.pop(rid, None)
            rec = self._recent.get(rid)
            if rec is not None:
                self._observe(rec)
                out.append(rec)
        return out

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
                rec = self._queue.get(timeout=self.PENDING_TIMEOUT_S / 2)
            except queue.Empty:
                # Release records whose second part never came, even when the engine is idle.
                with self._lock:
                    expired = self._release_expired(self._clock())
                self._publish(expired)
                continue
            for listener in list(self._listeners):
                try:
                    listener(rec)
                except Exception as exc:  # a consumer's failure must not stop the others
                    self.count_error(f"listener {getattr(listener, '__qualname__', listener)!s}", exc)
            self._queue.task_done()

    def _poll_gpu(self) -> GpuMemory:
        now = self._clock()
        if not self._gpu_sources or now - self._gpu_at < self._gpu_poll_s:
            return self._gpu
        self._gpu_at = now
        for name, source in self._gpu_sources:
            try:
                self._gpu = source()
                break
            except Exception as exc:
                self.count_error(f"gpu source {name}", exc)
        return self._gpu

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until every queued record reached the listeners (for tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False


_default: Hub | None = None
_default_lock = threading.Lock()


def default_hub() -> Hub:
    """The process-wide hub that the vLLM plugin, the middleware and ``specscope.LLM`` share by default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Hub()
        return _default

"""The hub: one thread-safe, bounded store that every collector writes and every consumer reads.

Writers (the stat logger, the wrapper, the server middleware) call :meth:`Hub.record_step` and
:meth:`Hub.record_request` from the engine's path: these only add numbers under a lock and never raise.
Readers call :meth:`Hub.snapshot`. Memory is bounded: lifetime totals are counters, the sliding window is a
ring of one-second buckets, and only the last ``max_requests`` request records are kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specscope.model import (
    ACCEPTANCE_LENGTH_BOUNDS,
    ACCEPTANCE_RATE_BOUNDS,
    REQUEST_DURATION_BOUNDS,
    TPOT_BOUNDS,
    TTFT_BOUNDS,
    CostRatio,
    EngineInfo,
    GpuMemory,
    Health,
    Histogram,
    KVCache,
    RequestRecord,
    Snapshot,
    SpecCounts,
    StepProfile,
    StepTime,
    TokenizerStatus,
    Totals,
)

log = logging.getLogger("specscope")

#: A finished-request consumer; runs on the hub's dispatch thread, never in the engine's.
Listener = Callable[[RequestRecord], None]
#: A polled source of GPU memory readings (see :mod:`specscope.collectors`).
GpuSource = Callable[[], GpuMemory]

_NO_GPU = GpuMemory(status="not collected")
#: Distinct batch sizes whose step times are kept (vLLM's max_num_seqs is 256 to 1024 in practice).
_MAX_BATCH_SIZES = 4096


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


#: The scalar counts of an interval, in the order the ring stores them.
_COUNTS = (
    "steps",
    "prompt_tokens",
    "generation_tokens",
    "requests",
    "preemptions",
    "pc_queries",
    "pc_hits",
    "drafts",
    "draft_tokens",
    "accepted",
)


class _Acc:
    """Mutable counts for one interval."""

    __slots__ = (*_COUNTS, "dt_per_pos", "per_pos")

    def __init__(self) -> None:
        self.steps = self.prompt_tokens = self.generation_tokens = self.requests = 0
        self.preemptions = self.pc_queries = self.pc_hits = 0
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos: list[int] = []
        self.dt_per_pos: list[int] = []

    def add_step(self, s: StepStats) -> None:
        self.steps += 1
        self.prompt_tokens += s.prompt_tokens
        self.generation_tokens += s.generation_tokens
        self.requests += s.finished
        self.preemptions += s.preemptions
        self.pc_queries += s.prefix_cache_queries
        self.pc_hits += s.prefix_cache_hits
        if s.drafts:
            self.drafts += s.drafts
            self.draft_tokens += s.draft_tokens
            self.accepted += s.accepted
            _add_into(self.per_pos, s.accepted_per_pos)
            _add_into(self.dt_per_pos, s.draft_tokens_per_pos)

    def add(self, o: _Acc) -> None:
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(o, name))
        _add_into(self.per_pos, o.per_pos)
        _add_into(self.dt_per_pos, o.dt_per_pos)

    def totals(self, seconds: float, k: int | None) -> Totals:
        spec = None
        if k is not None:
            spec = SpecCounts(
                num_spec_tokens=k,
                drafts=self.drafts,
                draft_tokens=self.draft_tokens,
                accepted=self.accepted,
                accepted_per_pos=_pad(self.per_pos, k),
                draft_tokens_per_pos=_pad(self.dt_per_pos, k),
            )
        return Totals(
            seconds=seconds,
            steps=self.steps,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            requests=self.requests,
            preemptions=self.preemptions,
            prefix_cache_queries=self.pc_queries,
            prefix_cache_hits=self.pc_hits,
            spec=spec,
        )


def _add_into(dst: list[int], src: Sequence[int]) -> None:
    if len(dst) < len(src):
        dst.extend([0] * (len(src) - len(dst)))
    for i, v in enumerate(src):
        dst[i] += v


def _pad(values: list[int], k: int) -> tuple[int, ...]:
    return tuple(values[:k]) + (0,) * max(0, k - len(values))


class _Ring:
    """One-second buckets in preallocated arrays of machine integers: memory is fixed at creation."""

    __slots__ = ("counts", "dpos", "k", "pos", "seconds", "size")
    _N = len(_COUNTS)

    def __init__(self, size: int) -> None:
        self.size = size
        self.seconds = array("q", [-1]) * size
        self.counts = array("q", [0]) * (size * self._N)
        self.k = 0
        self.pos = array("q")
        self.dpos = array("q")

    def add_step(self, second: int, s: StepStats) -> None:
        i = second % self.size
        n, k = self._N, self.k
        if self.seconds[i] != second:
            self.seconds[i] = second
            self.counts[i * n : (i + 1) * n] = array("q", [0]) * n
            if k:
                self.pos[i * k : (i + 1) * k] = array("q", [0]) * k
                self.dpos[i * k : (i + 1) * k] = array("q", [0]) * k
        c, b = self.counts, i * n
        c[b] += 1
        c[b + 1] += s.prompt_tokens
        c[b + 2] += s.generation_tokens
        c[b + 3] += s.finished
        c[b + 4] += s.preemptions
        c[b + 5] += s.prefix_cache_queries
        c[b + 6] += s.prefix_cache_hits
        if s.drafts:
            c[b + 7] += s.drafts
            c[b + 8] += s.draft_tokens
            c[b + 9] += s.accepted
            if len(s.accepted_per_pos) > k or len(s.draft_tokens_per_pos) > k:
                self._widen(max(len(s.accepted_per_pos), len(s.draft_tokens_per_pos)))
                k = self.k
            for j, v in enumerate(s.accepted_per_pos):
                self.pos[i * k + j] += v
            for j, v in enumerate(s.draft_tokens_per_pos):
                self.dpos[i * k + j] += v

    def _widen(self, k: int) -> None:
        """Make room for K draft positions (once, when speculation is first seen)."""
        old_k, old_pos, old_dpos = self.k, self.pos, self.dpos
        self.pos = array("q", [0]) * (self.size * k)
        self.dpos = array("q", [0]) * (self.size * k)
        for i in range(self.size):
            for j in range(old_k):
                self.pos[i * k + j] = old_pos[i * old_k + j]
                self.dpos[i * k + j] = old_dpos[i * old_k + j]
        self.k = k

    def sum(self, now: int, window: int) -> _Acc:
        total = _Acc()
        n, k = self._N, self.k
        for second in range(now - window + 1, now + 1):
            i = second % self.size
            if self.seconds[i] != second:
                continue
            row = self.counts[i * n : (i + 1) * n]
            for name, v in zip(_COUNTS, row, strict=True):
                setattr(total, name, getattr(total, name) + v)
            if k:
                _add_into(total.per_pos, self.pos[i * k : (i + 1) * k])
                _add_into(total.dt_per_pos, self.dpos[i * k : (i + 1) * k])
        return total

    def clear(self) -> None:
        self.seconds = array("q", [-1]) * self.size


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
        self._ring = _Ring(int(max(history_s, window_s)) + 1)
        self._window_s = window_s
        self._max_requests = max_requests
        self._gpu_poll_s = gpu_poll_s
        self._started = clock()
        self._window_start = self._started
        self._engine = EngineInfo()
        self._tokenizer: TokenizerStatus | None = None
        self._cost_ratio: CostRatio | None = None
        self._baseline: StepProfile | None = None
        # Decode-only step times by batch size: [steps, seconds]; bounded by the engine's maximum batch.
        self._step_times: dict[int, list[float]] = {}
        self._last_step_at: float | None = None
        self._decode_batch: int | None = None
        self._life = _Acc()
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
                self._ring = _Ring(int(seconds) + 1)  # a longer window starts empty

    def reset_window(self) -> None:
        """Forget the window's contents; lifetime totals are kept."""
        with self._lock:
            self._ring.clear()
            self._window_start = self._clock()

    def set_engine(self, info: EngineInfo) -> None:
        """Say which engine and models the numbers come from."""
        with self._lock:
            self._engine = info

    def set_tokenizer_status(self, status: TokenizerStatus) -> None:
        """Record the verdict of the start-up tokenizer check."""
        with self._lock:
            self._tokenizer = status

    def set_cost_ratio(self, cost: CostRatio | None) -> None:
        """Record c, the draft/target step-cost ratio the speedup estimate uses."""
        with self._lock:
            self._cost_ratio = cost

    def set_baseline(self, profile: StepProfile | None) -> None:
        """Give the same target's step times without speculation, which turn live step times into a measured c."""
        with self._lock:
            self._baseline = profile

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
        with self._lock:
            self._life.add_step(s)
            self._ring.add_step(second, s)
            self._time_step(now, s)
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
                step_times=StepProfile(
                    tuple(StepTime(b, int(n), t / n) for b, (n, t) in sorted(self._step_times.items()))),
                baseline=self._baseline,
                decode_batch=self._decode_batch,
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

    def _time_step(self, now: float, s: StepStats) -> None:
        """Time a decode-only step that followed a busy one (under the lock).

        The gap between two step reports of a busy engine is one step's wall time. Steps with prefill are left
        out, and so is the gap after an idle moment. The batch is the requests the step ran: those still running
        plus those it finished.
        """
        prev, self._last_step_at = self._last_step_at, now
        if prev is None or not self._running or s.prompt_tokens or not s.generation_tokens or s.running is None:
            return
        batch = s.running + s.finished
        self._decode_batch = batch
        acc = self._step_times.get(batch)
        if acc is None:
            if len(self._step_times) >= _MAX_BATCH_SIZES:
                return
            acc = self._step_times[batch] = [0, 0.0]
        acc[0] += 1
        acc[1] += now - prev

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

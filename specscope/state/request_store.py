"""Finished requests, thread-safe: the :class:`~specscope.state.request_log.RequestLog` behind a lock, and the
:class:`~specscope.state.background.Dispatcher` that hands final records to the listeners."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from specscope.core.health import HealthLog
from specscope.core.model import RequestRecord
from specscope.state.background import Dispatcher, Listener
from specscope.state.request_log import PENDING_TIMEOUT_S, RequestLog

#: A finished request's per-step accepted and drafted token counts (vLLM's ``detailed`` metrics).
PerStep = tuple[Sequence[int], Sequence[int]]


class RequestStore:
    """Where writers add request parts (``record``, ``record_finished``, ``record_positions``) and listeners get
    each final record once, on a background thread; nothing here raises into the writer."""

    #: Seconds a request record waits for its other part before listeners get it as it is.
    PENDING_TIMEOUT_S = PENDING_TIMEOUT_S

    def __init__(self, log: RequestLog, health: HealthLog, clock: Callable[[], float],
                 before_read: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._log = log
        self._clock = clock
        self._before_read = before_read  # writers that keep parts add them first (the stat logger's flush)
        self._dispatch = Dispatcher(health, lambda: self._take_expired(clock()))

    @property
    def max_requests(self) -> int:
        """How many records are kept."""
        return self._log.max_requests

    @property
    def max_classes(self) -> int:
        """How many traffic classes get rows of their own."""
        return self._log.max_classes

    def expect_parts(self, parts: int) -> None:
        """How many sources report each request (2 when timing and speculative numbers come separately)."""
        with self._lock:
            self._log.parts_expected = max(1, parts)

    def set_class_rank(self, seconds: float) -> None:
        """The time over which traffic classes' traffic is ranked for rows (a request's weight falls by e over it)."""
        with self._lock:
            self._log.class_rank_s = seconds

    def record(self, request_id: str, **fields: Any) -> None:
        """Add one source's part of a finished request (see :class:`RequestRecord` for the fields), now."""
        now = self._clock()
        with self._lock:
            done = self._log.add_part(request_id, now, fields)
        self._dispatch.publish(done)

    def record_finished(self, requests: Sequence[tuple[float, str, dict[str, Any], PerStep | None]]) -> None:
        """Add parts of requests that finished in the engine: ``(hub-clock time, request id, fields, per-step draft
        counts)``, the counts where vLLM kept them (see :meth:`record_positions`)."""
        done: list[RequestRecord] = []
        with self._lock:
            for now, request_id, fields, per_step in requests:
                done += self._log.add_part(request_id, now, fields)
                if per_step is not None:
                    self._log.add_positions(*per_step)
        self._dispatch.publish(done)

    def record_positions(self, per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> None:
        """Add one finished request's per-step draft counts (vLLM's ``detailed`` metrics) by output position."""
        with self._lock:
            self._log.add_positions(per_step_accepted, per_step_drafted)

    def release_expired(self, now: float) -> None:
        """Hand the listeners the records that waited too long for their other part (``now``: hub time)."""
        self._dispatch.publish(self._take_expired(now))

    def _take_expired(self, now: float) -> list[RequestRecord]:
        with self._lock:
            return self._log.release_expired(now)

    def has(self, request_id: str) -> bool:
        """Whether a record for ``request_id`` is held (parts a writer keeps included)."""
        self._before_read()
        with self._lock:
            return request_id in self._log.recent

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every final record, on a background thread."""
        self._dispatch.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._dispatch.remove(listener)

    def wait_idle(self, timeout: float) -> bool:
        """Block until every final record so far (parts a writer keeps included) reached the listeners; False after
        ``timeout`` seconds (for tests and shutdown)."""
        self._before_read()
        return self._dispatch.wait_idle(timeout)

    def clear_window(self) -> None:
        """Forget the classes' window; lifetimes are kept."""
        with self._lock:
            self._log.clear_class_window()

    def snapshot_fields(self, since: float, speculating: bool) -> dict[str, Any]:
        """The snapshot's request fields; classes' windows from ``since`` (hub time), acceptance histograms only
        when the engine speculates."""
        with self._lock:
            log = self._log
            return {
                "requests": tuple(log.recent.values()),
                "request_acceptance_rate": log.rate.freeze() if speculating else None,
                "request_acceptance_length": log.length.freeze() if speculating else None,
                "request_duration": log.e2e.freeze(),
                "time_to_first_token": log.ttft.freeze(),
                "time_per_output_token": log.tpot.freeze(),
                "acceptance_by_output_position": log.positions(),
                "attributed": log.attribution(),
                "latency_by_operation": log.latency_by_operation(),
                "classes": log.traffic_classes(since),
                "folded_classes": log.folded_classes(),
            }

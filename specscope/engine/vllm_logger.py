"""specscope's vLLM stat logger: the engine-step source of the telemetry model.

Registered under the ``vllm.stat_logger_plugins`` entry point as ``specscope``, so ``vllm serve`` loads it with
no code change (``VLLM_PLUGINS=specscope``); ``specscope.LLM`` and :func:`specscope.instrument` attach it to
an engine directly. Every call is guarded: a failure is counted in the hub's health, never raised into vLLM.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, NamedTuple

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from specscope.core.counts import StepBatch
from specscope.engine import capture, door, forward_timer, vllm_hook, vllm_stats
from specscope.engine.vllm_config import (
    api_server,
    cost_ratio,
    decode_tokens,
    engine_info,
    engine_version,
    model_name,
    per_request_metrics_off,
    token_budget,
)
from specscope.state.hub import Hub, default_hub
from specscope.state.request_log import PENDING_TIMEOUT_S

log = logging.getLogger("specscope")
_version_checked = False
#: The most steps, and seconds, the stat logger keeps before adding them to the hub (readers flush at once). The
#: seconds bound how late a finished request reaches the hub's listeners when nothing reads the hub: 5 s, the OTLP
#: span exporter's own batch delay and the alert loop's interval, and half the time a request record waits for its
#: other part (so the engine's part is never late for it).
BATCH_STEPS = 64
BATCH_S = PENDING_TIMEOUT_S / 2
#: A kept step's place for the front end's operation name when no request finished in it.
_NOT_FINISHED = object()


class _Kept(NamedTuple):
    """One engine step as ``record`` keeps it until the next flush: vLLM's stats objects, untouched."""

    time: float
    engine: int
    scheduler: Any
    iteration: Any
    #: The GenAI operation of the requests that finished in the step (``_NOT_FINISHED``: none finished).
    operation: Any


class SpecscopeStatLogger(AggregateStatLoggerBase):
    """Feeds every engine step and every finished request into a :class:`~specscope.state.hub.Hub`."""

    #: The hub subclasses made by :meth:`bound_to` write to; None (the plugin): the process's default hub.
    bound_hub: Hub | None = None

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        self.hub: Hub = type(self).bound_hub or default_hub()
        mine = self.hub.claim(vllm_config)
        if not mine:  # e.g. the plugin on a second engine in one process: kept out, in a hub nothing reads
            log.info("specscope: the stat logger's hub holds another engine's numbers; %s is not recorded there",
                     model_name(vllm_config, "this engine"))
            self.hub = Hub()
        self.vllm_config = vllm_config
        self._clock = self.hub.clock
        self._pending: deque[_Kept] = deque()
        self._flushing = threading.Lock()
        self.hub.add_pending_source(self.flush)
        self.engine_indexes = list(engine_indexes or [0])
        where = forward_timer.named() if not api_server(vllm_config)[0] else None
        #: Where the engines' forward times are read (None: nowhere), by one API-server process (its snapshots reach
        #: the others); kept when the engine moves to another hub (:func:`~.vllm_engine.instrument`).
        self.forwards = forward_timer.ForwardDeltas(where) if where is not None else None
        #: The most tokens a request runs in a decode forward (K + 1): forwards with more ran a prompt.
        self._decode_tokens = decode_tokens(vllm_config)
        self._hook_failures = vllm_hook.failures
        self._split: dict[int, vllm_stats.SplitSteps] = {}
        if vllm_hook.install():
            self.hub.requests.expect_parts(1)  # the engine's own records are complete
        try:
            self.hub.set_engine(engine_info(vllm_config))
            self.hub.set_cost_ratio(cost_ratio(vllm_config))
            if per_request_metrics_off(vllm_config):
                log.warning(
                    "specscope: per-request acceptance is off; start vLLM with "
                    "--per-request-spec-decode-metrics summary to record it"
                )
        except Exception as exc:
            self.hub.health.count_error("stat logger init", exc)
        _check_version_once()
        if not mine:
            return
        door.check_tokenizers_in_background(self.hub, vllm_config)
        if type(self).bound_hub is None:  # the vllm serve plugin: what the environment turns on (the caller's, else)
            door.served(self.hub, vllm_config)

    @classmethod
    def bound_to(cls, hub: Hub) -> type[SpecscopeStatLogger]:
        """A subclass writing to ``hub``, usable as a vLLM ``stat_loggers`` factory."""
        return type(cls.__name__, (cls,), {"bound_hub": hub})

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Called by vLLM after every engine step: the step's stats are kept as vLLM made them (new objects every
        step, never touched again) and added to the hub in batches (:meth:`flush`): every :data:`BATCH_STEPS`
        steps, :data:`BATCH_S` seconds after the first step kept, when the engine goes idle, and whenever the hub
        is read (a snapshot, an export, an alert evaluation)."""
        try:
            now = self._clock()
            pending = self._pending
            pending.append(_Kept(now, engine_idx, scheduler_stats, iteration_stats,
                                 vllm_hook.OPERATION.get() if getattr(iteration_stats, "finished_requests", None)
                                 else _NOT_FINISHED))
            try:
                oldest = pending[0].time
            except IndexError:  # a reader flushed them already
                return
            if (len(pending) >= BATCH_STEPS or now - oldest >= BATCH_S
                    or (scheduler_stats is not None and not (getattr(scheduler_stats, "num_running_reqs", 1)
                                                             or getattr(scheduler_stats, "num_waiting_reqs", 1)))):
                self.flush()
        except Exception as exc:
            self.hub.health.count_error("stat logger step", exc)

    def flush(self) -> None:
        """Add the steps recorded so far, and the engines' forwards timed since the last flush, to the hub (from
        vLLM's thread or a reader's; one at a time)."""
        with self._flushing:
            pending = self._pending
            rows = [pending.popleft() for _ in range(len(pending))]
            if rows:
                self._add(rows)
            if self.forwards is not None:  # also when this process got no steps: they may be another's
                try:
                    for engine in self.engine_indexes:
                        self.hub.record_forwards(engine, self.forwards.since(engine), self._decode_tokens)
                except Exception as exc:
                    self.hub.health.count_error("forward times", exc)

    def _add(self, rows: list[_Kept]) -> None:
        hub = self.hub
        # The finished requests' parts first: adding the steps releases the records whose other part is overdue
        # at the batch's last step, and these parts are not overdue.
        try:
            parts = []
            for now, engine, _, it, operation in [row for row in rows if row.operation is not _NOT_FINISHED]:
                for fin in vllm_stats.finished_requests(it):
                    fin.fields["engine"] = engine
                    if operation:
                        fin.fields["operation"] = operation
                    if fin.payload is not None and (held := capture.attached(hub)) is not None:
                        held.hold(fin.request_id, fin.payload)
                    parts.append((now, fin.request_id, fin.fields, fin.per_step))
            if parts:
                hub.requests.record_finished(parts)
        except Exception as exc:
            hub.health.count_error("stat logger requests", exc)
        missing: list[str] = []
        for engine in {row.engine for row in rows}:
            steps = [row for row in rows if row.engine == engine]
            try:
                batch = self._read(steps, missing)
                hub.record_steps(engine, batch)
            except Exception as exc:
                hub.health.count_error("stat logger step", exc)
        if missing:
            hub.health.count_missing(missing, vllm_stats.unavailable(missing))
        if vllm_hook.failures != self._hook_failures:
            self._hook_failures = vllm_hook.failures
            hub.health.count_error("request hook", RuntimeError("vLLM's request state changed shape"))

    def _read(self, rows: list[_Kept], missing: list[str]) -> StepBatch:
        """The steps of ``rows`` (one engine's); a step vLLM filled in a way this reader cannot read costs that step
        alone. With several API-server processes each holds only its own requests' part of a step, read step after
        step by the engine's :class:`~.vllm_stats.SplitSteps`."""
        split = self._split_steps(rows[0].engine) if self.hub.server_processes > 1 else None
        try:
            return vllm_stats.read_steps([r.time for r in rows], [r.scheduler for r in rows],
                                         [r.iteration for r in rows], missing, split)
        except Exception:
            readable = []
            for row in rows:
                try:  # only whether it reads: without ``split``, whose state each read carries on
                    vllm_stats.read_steps([row.time], [row.scheduler], [row.iteration])
                    readable.append(row)
                except Exception as exc:
                    self.hub.health.count_error("stat logger step", exc)
            return vllm_stats.read_steps([r.time for r in readable], [r.scheduler for r in readable],
                                         [r.iteration for r in readable], missing, split)

    def _split_steps(self, engine: int) -> vllm_stats.SplitSteps:
        """The engine's reader of split steps, made on its first (the scheduler's token budget from the config)."""
        split = self._split.get(engine)
        if split is None:
            split = self._split[engine] = vllm_stats.SplitSteps(*token_budget(self.vllm_config))
        return split

    def log_engine_initialized(self) -> None:
        """Re-read the configuration: the KV block count is known once the engine is up."""
        try:
            self.hub.set_engine(engine_info(self.vllm_config))
        except Exception as exc:
            self.hub.health.count_error("stat logger init", exc)


def _check_version_once() -> None:
    """Warn once per process when vLLM is outside the releases specscope was checked against."""
    global _version_checked
    if _version_checked:
        return
    _version_checked = True
    warning = vllm_stats.version_warning(engine_version())
    if warning:
        log.warning("specscope: %s", warning)

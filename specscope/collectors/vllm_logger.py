"""specscope's vLLM stat logger: the engine-step source of the telemetry model.

Registered under the ``vllm.stat_logger_plugins`` entry point as ``specscope``, so ``vllm serve`` loads it with
no code change (``VLLM_PLUGINS=specscope``); ``specscope.LLM`` and :func:`specscope.instrument` attach it to
an engine directly. Every call is guarded: a failure is counted in the hub's health, never raised into vLLM.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from specscope.collectors import vllm_reader
from specscope.hub import Hub, default_hub

log = logging.getLogger("specscope")
_exports_started = False


class SpecscopeStatLogger(AggregateStatLoggerBase):
    """Feeds every engine step and every finished request into a :class:`~specscope.hub.Hub`."""

    #: The hub written to; subclasses made by :meth:`bound_to` set it, the plugin uses the default hub.
    hub: Hub | None = None

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        self.target: Hub = type(self).hub or default_hub()
        self.vllm_config = vllm_config
        self.engine_indexes = list(engine_indexes or [0])
        try:
            self.target.set_engine(vllm_reader.engine_info(vllm_config))
            self.target.set_cost_ratio(vllm_reader.cost_ratio(vllm_config))
            baseline = os.environ.get("SPECSCOPE_BASELINE")
            if baseline and type(self).hub is None:
                from specscope.diagnostics import load_profile

                self.target.set_baseline(load_profile(baseline))
            obs = getattr(vllm_config, "observability_config", None)
            if (
                getattr(vllm_config, "speculative_config", None) is not None
                and getattr(obs, "per_request_spec_decode_metrics", "none") == "none"
            ):
                log.warning(
                    "specscope: per-request acceptance is off; start vLLM with "
                    "--per-request-spec-decode-metrics summary to record it"
                )
        except Exception as exc:
            self.target.count_error("stat logger init", exc)
        if type(self).hub is None:
            _start_exports_once(self.target)

    @classmethod
    def bound_to(cls, hub: Hub) -> type[SpecscopeStatLogger]:
        """A subclass writing to ``hub``, usable as a vLLM ``stat_loggers`` factory."""
        return type(cls.__name__, (cls,), {"hub": hub})

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Called by vLLM after every engine step."""
        hub = self.target
        try:
            hub.record_step(vllm_reader.read_step(scheduler_stats, iteration_stats))
        except Exception as exc:
            hub.count_error("stat logger step", exc)
        if iteration_stats is None or not getattr(iteration_stats, "finished_requests", None):
            return
        try:
            for rid, fields in vllm_reader.finished_requests(iteration_stats):
                hub.record_request(rid, **fields)
        except Exception as exc:
            hub.count_error("stat logger requests", exc)

    def log_engine_initialized(self) -> None:
        """Re-read the configuration: the KV block count is known once the engine is up."""
        try:
            self.target.set_engine(vllm_reader.engine_info(self.vllm_config))
        except Exception as exc:
            self.target.count_error("stat logger init", exc)


def _start_exports_once(hub: Hub) -> None:
    """As a ``vllm serve`` plugin: start the exports the environment asks for, once per process."""
    global _exports_started
    if _exports_started:
        return
    _exports_started = True
    from specscope import exports

    exports.from_env(hub)

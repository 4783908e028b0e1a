"""OTLP export through the official exporters, decoded by receivers inside the test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from specscope.core.model import CostRatio, DraftMemory, EngineInfo, TokenizerStatus
from specscope.engine.gpu_source import GpuCollector
from specscope.export import catalogue
from specscope.export.otel_export import OtelConfigError, OtelExporter, resolve_config
from specscope.state.hub import Hub, StepStats
from tests.engine.test_gpu import FakeNvml, GiB
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.state.test_hub import Clock

REQUESTS = [
    {"prompt_tokens": 30, "generation_tokens": 64, "e2e_s": 0.9, "ttft_s": 0.05, "tpot_s": 0.013,
     "finish_reason": "length", "num_spec_tokens": 4, "spec_steps": 20, "draft_tokens": 80, "accepted_tokens": 44,
     "acceptance_histogram": (4, 4, 4, 4, 4)},
    {"prompt_tokens": 12, "generation_tokens": 64, "e2e_s": 2.2, "ttft_s": 0.4, "tpot_s": 0.03,
     "finish_reason": "stop", "num_spec_tokens": 4, "spec_steps": 40, "draft_tokens": 160, "accepted_tokens": 24,
     "acceptance_histogram": (25, 10, 5, 0, 0)},
]


def filled_hub() -> Hub:
    hub = Hub(clock=Clock())
    hub.set_engine(EngineInfo(engine_version="0.32.0", model="tgt", draft_model="drf", method="draft_model",
                              num_speculative_tokens=4, block_size=16, num_blocks=101,
                              draft_memory=DraftMemory(GiB, 65536, 8192)))
    import os

    nvml = FakeNvml([{"name": "NVIDIA H100", "used": 30 * GiB, "total": 80 * GiB, "procs": [(os.getpid(), GiB)]}])
    hub.add_gpu_source("gpu", GpuCollector(nvml=nvml))
    hub.set_tokenizer(TokenizerStatus("identical", overlap=1.0))
    hub.set_cost_ratio(CostRatio(0.1, "estimated from parameter counts", 10_000, 1_000))
    for _ in range(3):
        hub.record_step(StepStats(running=2, waiting=1, kv_usage=0.25, num_spec_tokens=4, drafts=3, draft_tokens=12,
                                  accepted=7, accepted_per_pos=[3, 2, 1, 1], draft_tokens_per_pos=[3, 3, 3, 3],
                                  generation_tokens=10, prompt_tokens=40, prefix_cache_queries=40,
                                  prefix_cache_hits=0, preemptions=1))  # no hits: KV estimable
    return hub


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: Any) -> Iterator[Any]:
    r = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    r.protocol = request.param
    yield r
    r.close()


def points(m: Any) -> tuple[str, Any]:
    kind = m.WhichOneof("data")
    return kind, getattr(m, kind).data_points


def test_every_catalogue_metric_and_every_request_span_arrives(receiver: Any) -> None:
    hub = filled_hub()
    config = resolve_config(endpoint=receiver.endpoint, protocol=receiver.protocol, service_name="svc",
                            headers={"authorization": "Bearer s3cret"}, env={})
    exporter = OtelExporter(hub, config)
    for i, fields in enumerate(REQUESTS):
        hub.requests.record(f"req-{i}", **fields)
    hub.wait_idle()
    exporter.force_flush()
    snap = hub.snapshot()
    got = receiver.received.metrics()
    checked = 0
    for m in catalogue.METRICS:
        samples = list(m.read(snap))
        if not samples:
            assert m.name not in got
            continue
        checked += 1
        pm, resource = got[m.name]
        assert (pm.unit, pm.description) == (m.unit, m.description)
        kind, dps = points(pm)
        expected_kind = {"counter": "sum", "updowncounter": "sum", "gauge": "gauge", "histogram": "histogram"}
        assert kind == expected_kind[m.kind], m.name
        if m.kind in ("counter", "updowncounter"):
            assert pm.sum.is_monotonic == (m.kind == "counter")
        from tests.otlp_receiver import attrs

        if m.kind == "histogram":
            (dp,) = dps
            (_, h) = samples[0]
            assert list(dp.explicit_bounds) == list(m.buckets)
            assert dp.count == h.count and dp.sum == pytest.approx(h.total)
            assert list(dp.bucket_counts) == list(h.counts)
            assert attrs(dp.attributes) == samples[0][0]
        else:
            sent = {tuple(sorted(attrs(dp.attributes).items())): dp.as_double or dp.as_int for dp in dps}
            want = {tuple(sorted(a.items())): v for a, v in samples}
            assert sent == pytest.approx(want), m.name
    # Every metric but seven was sent and checked: the allocator (no CUDA in this process), errors (none), the
    # expected speedup's interval (two requests are fewer than it is drawn from) and the traffic speedup with its
    # interval (no baseline: nothing measured to weigh).
    assert checked == len(catalogue.METRICS) - 7
    assert resource["service.name"] == "svc"
    assert resource["specscope.core.model"] == "tgt" and resource["specscope.draft_model"] == "drf"
    assert resource["gen_ai.provider.name"] == "vllm" and resource["host.name"]
    assert any(h.get("authorization") == "Bearer s3cret" for h in receiver.received.headers)

    spans = {a["gen_ai.response.id"]: (s, a) for s, a in receiver.received.spans()}
    assert set(spans) == {"req-0", "req-1"}
    for rec in snap.requests:
        span, a = spans[rec.request_id]
        assert a["specscope.spec_decode.acceptance_rate"] == rec.acceptance_rate
        assert a["specscope.spec_decode.acceptance_length"] == rec.mean_acceptance_length
        assert a["specscope.traffic_class"] == rec.class_name is not None
        assert (a["specscope.spec_decode.steps"], a["specscope.spec_decode.draft_tokens"],
                a["specscope.spec_decode.accepted_tokens"]) == (rec.spec_steps, rec.draft_tokens, rec.accepted_tokens)
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
            rec.prompt_tokens, rec.generation_tokens)
        assert a["gen_ai.request.model"] == "tgt" and a["gen_ai.operation.name"] == "text_completion"
        assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 == pytest.approx(rec.e2e_s)
        assert not any("prompt" in k or "completion" in k for k in a)  # no text leaves the process
    exporter.shutdown()


def test_given_providers_get_the_metrics_and_spans_and_the_right_operation() -> None:
    """The application's providers (here the SDK's with in-memory readers) are used as given and left running."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    hub = filled_hub()
    reader, memory = InMemoryMetricReader(), InMemorySpanExporter()
    meters, tracers = MeterProvider(metric_readers=[reader]), TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(memory))
    from specscope.export import exports

    running = exports.start(hub, otlp=resolve_config(endpoint="http://127.0.0.1:9", env={}), meter_provider=meters,
                            tracer_provider=tracers)
    fields = {"e2e_s": 0.5, "generation_tokens": 8}
    hub.requests.record("chatcmpl-abc", **fields)  # vLLM's server: a chat completion's id
    hub.requests.record("cmpl-def-0", **fields)  # a completion's
    hub.requests.record("7", operation="chat", **fields)  # offline LLM.chat, said by the wrapper
    hub.wait_idle()
    ops = {s.attributes["gen_ai.response.id"]: (s.name, s.attributes["gen_ai.operation.name"])
           for s in memory.get_finished_spans() if s.attributes}
    assert ops == {"chatcmpl-abc": ("chat tgt", "chat"), "cmpl-def-0": ("text_completion tgt", "text_completion"),
                   "7": ("chat tgt", "chat")}
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"specscope.spec_decode.acceptance_rate", "specscope.spec_decode.draft_tokens"} <= set(metrics)
    # The GenAI latency metrics say each request's operation, as its span does: two chats, one completion.
    duration = {p.attributes["gen_ai.operation.name"]: p.count
                for p in metrics["gen_ai.server.request.duration"].data.data_points}
    assert duration == {"chat": 2, "text_completion": 1}
    from specscope.export.prometheus_export import SnapshotCollector

    scraped = {s.labels["gen_ai_operation_name"]: s.value for fam in SnapshotCollector(hub.snapshot).collect()
               for s in fam.samples if s.name == "gen_ai_server_request_duration_seconds_count"}
    assert scraped == {"chat": 2, "text_completion": 1}
    running.close()
    tracers.get_tracer("app").start_span("after").end()  # the application's provider still runs
    assert memory.get_finished_spans()[-1].name == "after"


@pytest.fixture
def down() -> Iterator[HttpReceiver]:
    """An OTLP/HTTP collector that refuses every export until its ``fail`` is set back."""
    receiver = HttpReceiver()
    receiver.fail = True
    yield receiver
    receiver.close()


def test_collector_down_counts_failures_and_recovers(down: HttpReceiver) -> None:
    hub = filled_hub()
    exporter = OtelExporter(hub, resolve_config(endpoint=down.endpoint, timeout_s=1, env={}))
    exporter.force_flush()
    errors = dict(hub.snapshot().health.errors)
    assert errors.get("otlp metrics export", 0) >= 1
    down.fail = False
    exporter.force_flush()
    assert "specscope.spec_decode.draft_tokens" in down.received.metrics()
    exporter.shutdown()


def test_shutdown_with_the_collector_down_tries_each_export_once(down: HttpReceiver) -> None:
    """Each export waits out its timeout with the collector down: shutdown tries once, not a flush and then again."""
    hub = filled_hub()
    exporter = OtelExporter(hub, resolve_config(endpoint=down.endpoint, timeout_s=0.5, env={}))
    hub.requests.record("req-9", e2e_s=0.5, generation_tokens=8)  # a span pending
    hub.wait_idle()
    exporter.shutdown()
    errors = dict(hub.snapshot().health.errors)
    assert errors.get("otlp metrics export") == 1 and errors.get("otlp traces export") == 1, errors


def test_disabled_sdk_exports_nothing() -> None:
    hub = filled_hub()
    exporter = OtelExporter(hub, resolve_config(env={"OTEL_SDK_DISABLED": "true"}))
    assert not exporter.enabled
    exporter.force_flush()
    exporter.shutdown()


def test_configuration_from_standard_variables_and_arguments() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc%3D,x-team=ml", "OTEL_METRIC_EXPORT_INTERVAL": "5000"}
    c = resolve_config(env=env)
    assert (c.endpoint, c.protocol, c.export_interval_ms, c.insecure) == ("https://otel.example:4318", "grpc", 5000,
                                                                          False)
    assert c.headers == {"api-key": "abc=", "x-team": "ml"}
    assert "abc=" not in repr(c)  # headers may be secrets: never in a log line
    c = resolve_config(endpoint="http://127.0.0.1:1", protocol="http/protobuf", export_interval_ms=100, env=env)
    assert (c.endpoint, c.protocol, c.export_interval_ms) == ("http://127.0.0.1:1", "http/protobuf", 100)
    assert resolve_config(env={}).endpoint == "http://localhost:4318"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"protocol": "http/json"}, "unsupported OTLP protocol 'http/json'"),
        ({"endpoint": "localhost:4318"}, "malformed OTLP endpoint"),
        ({"endpoint": "http://host:99999"}, "malformed OTLP endpoint"),
        ({"env": {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}}, "key=value"),
        ({"env": {"OTEL_METRIC_EXPORT_INTERVAL": "soon"}}, "milliseconds"),
    ],
)
def test_bad_configuration_is_one_clear_error(kw: dict[str, Any], message: str) -> None:
    kw.setdefault("env", {})
    with pytest.raises(OtelConfigError) as info:
        resolve_config(**kw)
    assert message in str(info.value) and "\n" not in str(info.value)

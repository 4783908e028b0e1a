"""OpenTelemetry export: the catalogue as OTLP metrics, and one span per request, through the official exporters.

Configured the standard way (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_SDK_DISABLED``) or by arguments, which win. Counters, gauges and
up-down counters are observable instruments read from one snapshot per collection; histograms and spans are fed
by the hub's listener thread. Nothing here runs in the engine's path: a collector that is down or slow costs
the engine nothing; failures are counted in the snapshot's health.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from specscope._version import __version__
from specscope.core.model import EngineInfo, RequestRecord, Snapshot
from specscope.export import catalogue
from specscope.state.hub import Hub

PROTOCOLS = ("http/protobuf", "grpc")
_DEFAULT_ENDPOINT = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}


class OtelConfigError(ValueError):
    """Bad OpenTelemetry configuration (the message is one line, fit for the user)."""


@dataclass(frozen=True)
class OtelConfig:
    """Resolved export settings."""

    endpoint: str
    protocol: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets: never logged
    service_name: str | None = None
    export_interval_ms: int = 60_000
    disabled: bool = False
    insecure: bool = True
    timeout_s: float = 10.0


def _parse_headers(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OtelConfigError("OTEL_EXPORTER_OTLP_HEADERS must be comma-separated key=value pairs")
        out[unquote(key.strip())] = unquote(value.strip())
    return out


def resolve_config(
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: dict[str, str] | None = None,
    service_name: str | None = None,
    export_interval_ms: int | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> OtelConfig:
    """Arguments, else the standard ``OTEL_*`` variables, else OpenTelemetry's defaults; raises on bad values."""
    env = dict(os.environ) if env is None else env
    protocol = protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise OtelConfigError(f"unsupported OTLP protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    endpoint = endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _DEFAULT_ENDPOINT[protocol]
    parts = urlsplit(endpoint)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise OtelConfigError(f"malformed OTLP endpoint {endpoint!r}; expected http(s)://host:port")
    if headers is None:
        headers = _parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    interval = export_interval_ms
    if interval is None:
        raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "60000")
        try:
            interval = int(raw)
        except ValueError:
            raise OtelConfigError(f"OTEL_METRIC_EXPORT_INTERVAL must be milliseconds, got {raw!r}") from None
    if interval <= 0:
        raise OtelConfigError("the metric export interval must be positive")
    return OtelConfig(
        endpoint=endpoint.rstrip("/"),
        protocol=protocol,
        headers=headers,
        service_name=service_name,
        export_interval_ms=interval,
        disabled=env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true",
        insecure=parts.scheme == "http",
        timeout_s=10.0 if timeout_s is None else timeout_s,
    )


def resource_attributes(info: EngineInfo, service_name: str | None) -> dict[str, str]:
    """Resource attributes naming the service, host, engine and models (OTEL_RESOURCE_ATTRIBUTES adds more)."""
    attrs = {
        "host.name": socket.gethostname(),
        "telemetry.distro.name": "specscope",
        "telemetry.distro.version": __version__,
        "gen_ai.provider.name": info.server,
        "specscope.engine.version": info.engine_version or "",
        "specscope.core.model": info.model or "",
        "specscope.draft_model": info.draft_model or "",
        "specscope.method": info.method or "",
    }
    if service_name:
        attrs["service.name"] = service_name
    return attrs


def static_attrs(metric: catalogue.Metric, info: EngineInfo, rec: RequestRecord) -> dict[str, str]:
    """The attributes a request's histogram observation carries: the server's, or the GenAI ones (with the
    request's operation)."""
    if metric.attributes == catalogue.GENAI_ATTRS:
        return catalogue.genai_attrs_of(info, rec.operation_name)
    return catalogue.server_attrs_of(info)


class _Snapshots:
    """One snapshot per collection, shared by every observable callback."""

    def __init__(self, hub: Hub, ttl_s: float = 0.5) -> None:
        self._hub, self._ttl, self._at = hub, ttl_s, 0.0
        self._snap: Snapshot | None = None
        self._lock = threading.Lock()

    def get(self) -> Snapshot:
        with self._lock:
            now = time.monotonic()
            if self._snap is None or now - self._at > self._ttl:
                self._snap, self._at = self._hub.snapshot(), now
            snap: Snapshot = self._snap
            return snap


def _parent(rec: RequestRecord) -> Any:
    """The context the request came with (its ``traceparent``), or None: a new trace."""
    if not rec.trace_context:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(dict(rec.trace_context))


def _links(rec: RequestRecord) -> list[Any] | None:
    """A link to vLLM's own span of the request, when vLLM traced it."""
    if not rec.vllm_span:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": rec.vllm_span}))
    span_context = ctx.get_span_context()
    return [trace.Link(span_context, {"specscope.link": "vllm.llm_request"})] if span_context.is_valid else None


def _flush(provider: Any, timeout_ms: int) -> None:
    """Export what ``provider`` holds, where it can (None and the API's no-op providers cannot)."""
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush(timeout_ms)


class OtelExporter:
    """Exports a hub's catalogue metrics and request spans over OTLP; :meth:`shutdown` flushes and stops."""

    def __init__(self, hub: Hub, config: OtelConfig | None = None, *, traces: bool = True,
                 meter_provider: Any = None, tracer_provider: Any = None) -> None:
        """``meter_provider`` / ``tracer_provider``: the application's own (for example the global ones, or the
        SDK's with in-memory readers in tests), used as given and left running by :meth:`shutdown`; without
        them specscope builds its own, exporting over OTLP as ``config`` says."""
        from opentelemetry.sdk.resources import Resource

        self.hub = hub
        self.config = config or resolve_config()
        self.enabled = not self.config.disabled
        self._tracer_provider: Any = None
        self._meter_provider: Any = None
        self._owned: list[Any] = []
        if not self.enabled:
            return
        resource = Resource.create(resource_attributes(hub.engine, self.config.service_name))
        if meter_provider is None:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            metric_exporter = self._metric_exporter()
            self._counted(metric_exporter, "otlp metrics export")
            reader = PeriodicExportingMetricReader(metric_exporter,
                                                   export_interval_millis=self.config.export_interval_ms)
            meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
            self._owned.append(meter_provider)
        self._meter_provider = meter_provider
        meter = meter_provider.get_meter("specscope", __version__)
        snapshots = _Snapshots(hub)
        self._histograms: list[tuple[catalogue.Metric, Any]] = []
        for m in catalogue.METRICS:
            if m.kind == "histogram":
                inst = meter.create_histogram(m.name, unit=m.unit, description=m.description,
                                              explicit_bucket_boundaries_advisory=list(m.buckets))
                self._histograms.append((m, inst))
                continue
            create = {
                "counter": meter.create_observable_counter,
                "gauge": meter.create_observable_gauge,
                "updowncounter": meter.create_observable_up_down_counter,
            }[m.kind]
            create(m.name, callbacks=[self._callback(m, snapshots)], unit=m.unit, description=m.description)
        if traces:
            if tracer_provider is None:
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import BatchSpanProcessor

                span_exporter = self._span_exporter()
                self._counted(span_exporter, "otlp traces export")
                tracer_provider = TracerProvider(resource=resource)
                tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
                self._owned.append(tracer_provider)
            self._tracer_provider = tracer_provider
            self._tracer = tracer_provider.get_tracer("specscope", __version__)
        hub.requests.add_listener(self._on_request)

    def _metric_exporter(self) -> Any:
        c = self.config
        if c.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

            return GrpcMetrics(**self._grpc_args())
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        return HttpMetrics(endpoint=f"{c.endpoint}/v1/metrics", headers=c.headers, timeout=c.timeout_s)

    def _span_exporter(self) -> Any:
        c = self.config
        if c.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

            return GrpcSpans(**self._grpc_args())
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

        return HttpSpans(endpoint=f"{c.endpoint}/v1/traces", headers=c.headers, timeout=c.timeout_s)

    def _grpc_args(self) -> dict[str, Any]:
        c = self.config
        return {"endpoint": urlsplit(c.endpoint).netloc, "insecure": c.insecure, "headers": c.headers or None,
                "timeout": c.timeout_s}

    def _counted(self, exporter: Any, where: str) -> None:
        """Count failed exports in the hub's health (the SDK only logs them)."""
        export = exporter.export

        def counted(batch: Any, *args: Any, **kwargs: Any) -> Any:
            result = export(batch, *args, **kwargs)
            if getattr(result, "name", "") == "FAILURE":
                self.hub.health.count_error(where, ConnectionError(f"export to {self.config.endpoint} failed"))
            return result

        exporter.export = counted

    @staticmethod
    def _callback(m: catalogue.Metric, snapshots: _Snapshots) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterable[Any]:
            return [Observation(v, attrs) for attrs, v in m.read(snapshots.get()) if isinstance(v, float)]

        return observe

    def _on_request(self, rec: RequestRecord) -> None:
        info = self.hub.engine
        for m, inst in self._histograms:
            value = m.per_request(rec) if m.per_request else None
            if value is not None:
                inst.record(value, static_attrs(m, info, rec))
        if self._tracer_provider is not None:
            self._span(rec, info)

    def _span(self, rec: RequestRecord, info: EngineInfo) -> None:
        from opentelemetry.trace import SpanKind

        end_ns = int(rec.finished_at * 1e9)
        start_ns = end_ns - int((rec.e2e_s or 0.0) * 1e9)
        attrs: dict[str, Any] = {
            **catalogue.genai_attrs_of(info, rec.operation_name),
            "gen_ai.response.id": rec.request_id,
            "specscope.draft_model": info.draft_model or "",
            "specscope.method": info.method or "",
        }
        optional: Sequence[tuple[str, Any]] = (
            ("gen_ai.usage.input_tokens", rec.prompt_tokens),
            ("gen_ai.usage.output_tokens", rec.generation_tokens),
            ("gen_ai.response.finish_reasons", [rec.finish_reason] if rec.finish_reason else None),
            ("specscope.request.ttft_s", rec.ttft_s),
            ("specscope.request.tpot_s", rec.tpot_s),
            ("specscope.spec_decode.steps", rec.spec_steps),
            ("specscope.spec_decode.draft_tokens", rec.draft_tokens),
            ("specscope.spec_decode.accepted_tokens", rec.accepted_tokens),
            ("specscope.spec_decode.acceptance_rate", rec.acceptance_rate),
            ("specscope.spec_decode.acceptance_length", rec.mean_acceptance_length),
            ("specscope.traffic_class", rec.class_name),
        )
        attrs.update({k: v for k, v in optional if v is not None})
        span = self._tracer.start_span(f"{rec.operation_name} {info.model or ''}".strip(), kind=SpanKind.SERVER,
                                       attributes=attrs, start_time=start_ns, context=_parent(rec),
                                       links=_links(rec))
        span.end(end_time=end_ns)

    def force_flush(self, timeout_ms: int = 10_000) -> None:
        """Export what is pending now (tests, shutdown)."""
        for provider in (self._meter_provider, self._tracer_provider):
            _flush(provider, timeout_ms)

    def shutdown(self) -> None:
        """Stop recording; flush the application's providers and stop (which flushes) the ones specscope built."""
        self.hub.requests.remove_listener(self._on_request)
        for provider in (self._meter_provider, self._tracer_provider):
            if provider in self._owned:
                provider.shutdown()  # flushes once: a flush before it would wait out the export timeout twice
            else:
                _flush(provider, 10_000)

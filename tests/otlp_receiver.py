"""OTLP receivers for tests: http/protobuf and gRPC, decoding with opentelemetry-proto."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value_of(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


class Received:
    """What a receiver got, decoded: metrics by name and spans."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.metric_requests: list[Any] = []
        self.trace_requests: list[Any] = []
        self.headers: list[dict[str, str]] = []

    def metrics(self) -> dict[str, Any]:
        """Latest data point set of each metric name, with the resource it came with."""
        out: dict[str, Any] = {}
        with self.lock:
            for req in self.metric_requests:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            out[m.name] = (m, attrs(rm.resource.attributes))
        return out

    def spans(self) -> list[tuple[Any, dict[str, Any]]]:
        with self.lock:
            return [(s, attrs(s.attributes)) for req in self.trace_requests for rs in req.resource_spans
                    for ss in rs.scope_spans for s in ss.spans]


class HttpReceiver:
    """POST /v1/metrics and /v1/traces; ``fail`` answers 503, ``delay_s`` answers late (a collector in trouble)."""

    def __init__(self) -> None:
        self.received = Received()
        self.fail = False
        self.delay_s = 0.0
        received = self.received
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server calls do_<METHOD>
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                if receiver.fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                with received.lock:
                    received.headers.append(dict(self.headers))
                    if self.path == "/v1/metrics":
                        received.metric_requests.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                        reply = metrics_service_pb2.ExportMetricsServiceResponse()
                    else:
                        received.trace_requests.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                        reply = trace_service_pb2.ExportTraceServiceResponse()
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """The OTLP gRPC MetricsService and TraceService on 127.0.0.1."""

    def __init__(self) -> None:
        import grpc

        self.received = received = Received()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with received.lock:
                    received.metric_requests.append(request)
                    received.headers.append(dict(context.invocation_metadata()))
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with received.lock:
                    received.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.stop(0)

"""A real OTLP receiver in a thread, over HTTP and over gRPC: it takes `POST /v1/traces`,
`/v1/metrics` and `/v1/logs` (and the gRPC TraceService, MetricsService and LogsService
`Export` calls) as
the OpenTelemetry Collector does and decodes each with the OpenTelemetry protos
(`opentelemetry-proto`), keeping every request with its headers (gRPC's metadata) under its
HTTP path.

Tests steer it: `status` answers every request with that HTTP status (401: a refused key),
`hold()` makes requests wait until `release()` (an endpoint that hangs), `redirect_to` answers
with a redirect there. gRPC answers a refusal with UNAUTHENTICATED.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

KINDS: dict[str, type[Message]] = {
    "/v1/traces": ExportTraceServiceRequest,
    "/v1/metrics": ExportMetricsServiceRequest,
    "/v1/logs": ExportLogsServiceRequest,
}


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    message: Any


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP `KeyValue`s as a dict of their values."""
    out: dict[str, Any] = {}
    for kv in pairs:
        assert isinstance(kv, KeyValue)
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value") or "string_value")
    return out


class OtlpReceiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        #: every export request that reached it (answered or refused)
        self.requests = 0
        self.status = 200
        #: when set, an HTTP request whose Authorization is not `Bearer <key>` is answered 401
        self.key: str | None = None
        #: answer every HTTP request with a 307 to this URL (a redirect no export may follow)
        self.redirect_to: str | None = None
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._httpd: ThreadingHTTPServer | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_port = 0

    @property
    def grpc_url(self) -> str:
        return f"http://127.0.0.1:{self._grpc_port}"

    @property
    def grpc_hostport(self) -> str:
        return f"127.0.0.1:{self._grpc_port}"

    def keep(self, path: str, headers: dict[str, str], message: Any) -> None:
        with self._lock:
            self.received.append(Received(path, headers, message))

    def reached(self) -> None:
        with self._lock:
            self.requests += 1

    def grpc_call(self, path: str, request: Any, context: grpc.ServicerContext) -> None:
        self.reached()
        self._open.wait()
        if self.status != 200:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "refused by the test receiver")
        self.keep(path, {k.lower(): str(v) for k, v in context.invocation_metadata()}, request)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def hostport(self) -> str:
        assert self._httpd is not None
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.reached()
                receiver._open.wait()
                kind = KINDS.get(self.path)
                if kind is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                if receiver.redirect_to is not None:
                    self.send_response(307)
                    self.send_header("Location", receiver.redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if receiver.key is not None and self.headers.get("Authorization") != (
                    f"Bearer {receiver.key}"
                ):
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if receiver.status == 200:
                    message = kind()
                    message.ParseFromString(body)
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.keep(self.path, headers, message)
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> ExportTraceServiceResponse:
                receiver.grpc_call("/v1/traces", request, context)
                return ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> ExportMetricsServiceResponse:
                receiver.grpc_call("/v1/metrics", request, context)
                return ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: Any) -> ExportLogsServiceResponse:
                receiver.grpc_call("/v1/logs", request, context)
                return ExportLogsServiceResponse()

        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=4))
        # the generated *_pb2_grpc modules have no annotations
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self._grpc)  # type: ignore[no-untyped-call]
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)  # type: ignore[no-untyped-call]
        self._grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        return self

    def stop(self) -> None:
        self.release()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._grpc is not None:
            self._grpc.stop(None)

    def of(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def spans(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of every span received."""
        for r in self.of("/v1/traces"):
            for rs in r.message.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        yield resource, span

    def log_records(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """(resource attributes, log record) of every log record received."""
        for r in self.of("/v1/logs"):
            for rl in r.message.resource_logs:
                resource = attributes(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for record in sl.log_records:
                        yield resource, record

    def metric_points(self, name: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """(resource attributes, data point) of every point of metric `name` received."""
        for r in self.of("/v1/metrics"):
            for rm in r.message.resource_metrics:
                resource = attributes(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name != name:
                            continue
                        data = metric.WhichOneof("data")
                        for point in getattr(metric, data).data_points:
                            yield resource, point

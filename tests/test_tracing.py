"""Optional OpenTelemetry tracing (docs/telemetry.md), seen through the SDK's in-memory
exporter: a server span per request, chart fetch and render spans under the request that
creates a helm function, unit spans under a reconcile pass; a real OTLP/HTTP export; and, when
off, no OpenTelemetry on any path."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from service.core.tracing import NO_SPAN, NO_TRACING, TracingMiddleware, traces_url
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V, dep_url, eventually, until_status, write_catalog
from tests.support.registry import RegistryServer

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    [parent] = [
        s for s in spans if s.context is not None and s.context.span_id == span.parent.span_id
    ]
    return parent


async def test_a_request_produces_a_server_span(
    client_factory: ClientFactory, exporter: InMemorySpanExporter
) -> None:
    client = await client_factory(span_exporter=exporter)
    assert client.app.state.telemetry.tracing.enabled
    resp = await client.get(f"{V}/functions/{'0' * 8}-0000-0000-0000-{'0' * 12}/versions")
    assert resp.status_code == 404
    [span] = exporter.get_finished_spans()
    assert span.name == "GET /v2/nvcf/functions/{functionId}/versions"
    assert span.kind is SpanKind.SERVER
    assert span.attributes is not None
    assert span.attributes["http.route"] == "/v2/nvcf/functions/{functionId}/versions"
    assert span.attributes["http.response.status_code"] == 404
    assert span.attributes["nvcf.request_id"] == resp.headers["x-request-id"]
    assert span.resource.attributes["service.name"] == "nvcf-server"

    # a caller's W3C trace context is continued
    exporter.clear()
    await client.get("/health", headers={"traceparent": TRACEPARENT})
    [span] = exporter.get_finished_spans()
    assert span.context is not None and span.parent is not None
    assert format(span.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert format(span.parent.span_id, "016x") == TRACEPARENT.split("-")[2]


@pytest.mark.registry
async def test_creating_a_helm_function_traces_the_fetch_and_the_render(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    exporter: InMemorySpanExporter,
) -> None:
    host = anon_registry.host
    client = await client_factory(
        registry_allowlist=host, insecure_registries=host, span_exporter=exporter
    )
    chart = push_corpus(anon_registry, "inference-ok")
    resp = await client.post(
        f"{V}/functions",
        json={
            "name": "traced",
            "inferenceUrl": "/infer",
            "inferencePort": 8000,
            "helmChart": chart.ref_url,
            "helmChartServiceName": "entrypoint",
        },
    )
    assert resp.status_code == 200, resp.text
    spans = exporter.get_finished_spans()
    [server] = named(spans, "POST /v2/nvcf/functions")
    [fetch] = named(spans, "chart.fetch")
    renders = named(spans, "chart.render")
    assert renders
    for child in (fetch, *renders):
        assert parent_of(child, spans) is server
        assert child.context is not None and server.context is not None
        assert child.context.trace_id == server.context.trace_id
    assert fetch.attributes is not None and fetch.attributes["nvcf.chart.cached"] is False
    assert renders[-1].attributes is not None
    assert renders[-1].attributes["nvcf.chart.helm_path"] in {"engine", "install"}


async def test_a_reconcile_pass_produces_unit_spans(
    client_factory: ClientFactory, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    client = await client_factory(
        clusters_file=write_catalog(tmp_path),
        reconcile_interval=0.05,
        span_exporter=exporter,
    )
    fn = await create_fn(client)
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "ACTIVE")

    async def units_and_their_passes() -> bool:  # a pass ends after its units
        spans = exporter.get_finished_spans()
        ended = {s.context.span_id for s in spans if s.context is not None}
        units = named(spans, "reconcile.unit")
        return bool(units) and all(u.parent and u.parent.span_id in ended for u in units)

    await eventually(units_and_their_passes)
    spans = exporter.get_finished_spans()
    units = named(spans, "reconcile.unit")
    for unit in units:
        parent = parent_of(unit, spans)
        assert parent.name == "reconcile.pass"
        assert parent.parent is None  # a pass starts its own trace, not a request's
        assert unit.attributes is not None
        deployments = unit.attributes["nvcf.deployments"]
        assert isinstance(deployments, int) and deployments >= 1


async def test_tracing_off_leaves_opentelemetry_off_every_path(client: AppClient) -> None:
    state = client.app.state
    tracing = state.telemetry.tracing
    assert tracing is NO_TRACING and not tracing.enabled and tracing.tracer is None
    # the one shared no-op, whatever the name: nothing is built per call
    assert tracing.span("a") is NO_SPAN and tracing.span("b", {"x": 1}) is NO_SPAN
    classes: list[object] = [m.cls for m in client.app.user_middleware]
    assert TracingMiddleware not in classes
    assert state.chart_pipeline.tracing is NO_TRACING
    assert state.reconciler is not None and state.reconciler.tracing is NO_TRACING
    assert (await client.get("/health")).status_code == 200


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """A minimal OTLP/HTTP collector on 127.0.0.1, recording what it is sent."""
    received: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


async def test_spans_are_exported_over_otlp_http(
    client_factory: ClientFactory, collector: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    endpoint, received = collector
    assert traces_url(endpoint) == endpoint + "/v1/traces"
    assert traces_url(endpoint + "/v1/traces/") == endpoint + "/v1/traces"
    client = await client_factory(otel_endpoint=endpoint, otel_service_name="nvcf-test")
    assert (await client.get("/health")).status_code == 200
    provider = client.app.state.telemetry.tracing.provider
    assert provider is not None
    assert await asyncio.to_thread(provider.force_flush)
    [(path, content_type, body)] = received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "nvcf-test"
    names = [s.name for scope in resource_spans.scope_spans for s in scope.spans]
    assert names == ["GET /health"]

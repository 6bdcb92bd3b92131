"""Optional OpenTelemetry tracing (docs/telemetry.md): off unless `NVCF_OTEL_ENDPOINT` is set.

One `Tracing` per application, with its own `TracerProvider` (never the process-global one,
so several apps in one process, as in the tests, each keep their spans). Code that wants a
span calls `tracing.span(name, attributes)` and uses it as a context manager; the span is the
current one inside it, so spans opened deeper (in the same task, or in threads started with
`asyncio.to_thread`, which copy the context) become its children.

Off, `span()` hands back one shared `nullcontext` (yielding None) and no request middleware is
installed: no tracer provider exists, this module never imports the SDK, and the hot path
does no tracing work at all. `Tracing.enabled` and `NO_SPAN` let tests tell which path answered.

On, requests get a SERVER span from `TracingMiddleware` (named `METHOD route-template`, W3C
`traceparent` honoured), and the chart pipeline and the reconciler open child spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.middleware import route_template

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from service.core.settings import Settings

#: attribute values a span takes (OpenTelemetry's `AttributeValue`, without importing it)
Attributes = Mapping[str, str | bool | int | float]

#: what `span()` returns when tracing is off: one shared, reusable no-op context manager
NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()
#: the traces path of an OTLP/HTTP collector
TRACES_PATH = "/v1/traces"
INSTRUMENTATION = "nvcf-server"


class Tracing:
    """Spans for one application; a no-op unless made with a tracer provider."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = (
            provider.get_tracer(INSTRUMENTATION) if provider is not None else None
        )

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def span(
        self, name: str, attributes: Attributes | None = None
    ) -> AbstractContextManager[Span | None]:
        """A span named `name` around the `with` block, current inside it (None when off).

        Exceptions leaving the block are recorded on the span and mark it as an error. Use it
        for any unit of work worth seeing in a trace (invocations included)."""
        if self.tracer is None:
            return NO_SPAN
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def shutdown(self) -> None:
        """Flush and stop the exporter (blocking: call it in a thread)."""
        if self.provider is not None:
            self.provider.shutdown()


#: tracing off (the default of code built without an application, e.g. in tests)
NO_TRACING = Tracing()


def traces_url(endpoint: str) -> str:
    """`<endpoint>/v1/traces`, unless the endpoint already names that path."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def tracing_from_settings(settings: Settings, exporter: SpanExporter | None = None) -> Tracing:
    """Off unless `NVCF_OTEL_ENDPOINT` is set (spans batched to its OTLP/HTTP collector) or an
    `exporter` is given (spans handed to it as each ends: tests pass an in-memory one)."""
    if exporter is None and settings.otel_endpoint is None:
        return NO_TRACING
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: settings.otel_service_name}),
        shutdown_on_exit=False,  # the app's lifespan shuts it down
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        assert settings.otel_endpoint is not None
        otlp = OTLPSpanExporter(endpoint=traces_url(settings.otel_endpoint))
        provider.add_span_processor(BatchSpanProcessor(otlp))
    return Tracing(provider)


class TracingMiddleware:
    """A SERVER span per HTTP request, named `METHOD route-template` once routed.

    Installed only when tracing is on, inside `RequestContextMiddleware` (so the request id and
    the org-alias rewrite are there). Only the path is recorded, never the query string."""

    def __init__(self, app: ASGIApp, *, tracing: Tracing) -> None:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        assert tracing.tracer is not None, "install only when tracing is on"
        self.app = app
        self.tracer = tracing.tracer
        self._extract = propagate.extract
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method: str = scope["method"]
        status = [0]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
        }
        request_id = scope.get("state", {}).get("request_id")
        if request_id:
            attributes["nvcf.request_id"] = request_id
        with self.tracer.start_as_current_span(
            method, context=self._extract(carrier), kind=self._server, attributes=attributes
        ) as span:
            try:
                await self.app(scope, receive, send_wrapper)
            finally:
                route = route_template(scope)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                if status[0]:
                    span.set_attribute("http.response.status_code", status[0])
                    if status[0] >= 500:
                        span.set_status(self._error)


__all__ = [
    "NO_SPAN",
    "NO_TRACING",
    "Tracing",
    "TracingMiddleware",
    "traces_url",
    "tracing_from_settings",
]

"""One telemetry's pipelines: the OpenTelemetry SDK's span batch processor and meter
provider and the log batcher, over the exporters of the telemetry's wire — OTLP over HTTP
or gRPC, Prometheus remote write, Datadog's intakes — each connection guarded
(endpoints.py)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import grpc
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from service.observability import logs, mtls
from service.observability.datadog import TEMPORALITY, DatadogMetricsExporter
from service.observability.endpoints import (
    Backlog,
    Drops,
    EndpointGuard,
    EndpointStatus,
    WatchedMetrics,
    WatchedSpans,
    guarded_session,
)
from service.observability.events import (
    Event,
    Invocation,
    Load,
    LoadSource,
    Logged,
    Phased,
    PhaseSource,
    TaskEnded,
    TaskLogged,
    TaskSource,
    Tokens,
)
from service.observability.models import Kind, Protocol, Provider, Telemetry
from service.observability.references import FIELDS
from service.observability.remote_write import RemoteWriteExporter
from service.observability.tasks import record_task, task_gauges, task_spans
from service.observability.wires import Target, Wire, target_of, wire_of

#: the largest request body an export sends (a larger batch is dropped, counted)
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: spans waiting in a telemetry's batch processor; more are dropped (counted)
SPAN_QUEUE = 2048
_IDS = RandomIdGenerator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
SCOPE = InstrumentationScope("nvcf.invocation")
#: the label of the replica that counted a series (`ExportSettings.replica`)
REPLICA = "nvcf.replica"


@dataclass(frozen=True)
class ExportSettings:
    queue_size: int = 10000
    #: seconds between two metric exports, and the longest a span waits in its batch
    interval: float = 30.0
    #: seconds of one export request (its retries included)
    timeout: float = 10.0
    allowlist: Collection[str] = ()
    #: this replica's id, the `nvcf.replica` label of the series each replica counts itself
    #: (several replicas' totals under one label set would read as one counter that resets)
    replica: str = ""
    #: the clock of the endpoints' backoffs (endpoints.py)
    clock: Callable[[], float] = time.monotonic


def _headers(provider: Provider, key: str) -> dict[str, str]:
    if mtls.of_key(key) is not None:  # client certificates authenticate, not a header
        return {}
    if provider is Provider.GRAFANA_CLOUD:
        return {"Authorization": "Basic " + base64.b64encode(key.encode()).decode()}
    return {"Authorization": f"Bearer {key}"}


@dataclass
class Pipeline:
    """One telemetry's OpenTelemetry SDK pipelines (those of its types this server sends)."""

    telemetry_id: uuid.UUID
    account: str
    updated_at: datetime
    status: EndpointStatus
    drops: Drops
    #: the SDK's batch processor of the telemetry's spans, its backlog, and their resource
    spans: BatchSpanProcessor | None = None
    backlog: Backlog = field(default_factory=lambda: Backlog(SPAN_QUEUE))
    resource: Resource = field(default_factory=Resource.get_empty)
    meter_provider: MeterProvider | None = None
    #: the invocation counter, the latency histogram, the token counter
    instruments: tuple[Any, Any, Any] | None = None
    logs: logs.LogBatcher | None = None
    loaded: float = field(default_factory=time.monotonic)
    replica: str = ""

    def counted(self, attributes: dict[str, str]) -> dict[str, str]:
        """`attributes` of a series this replica counts itself, labelled with the replica."""
        return {**attributes, REPLICA: self.replica} if self.replica else attributes

    def record(self, kinds: Collection[Kind], event: Event) -> None:
        """Record the event's signals of `kinds` for export; while the endpoint is failing
        (its backoff, endpoints.py) they are only counted as dropped: nothing is built."""
        if self.status.failing():
            self._skip(kinds, event)
            return
        if isinstance(event, TaskLogged | TaskEnded):
            record_task(self, kinds, event)
            return
        attributes = {
            "nvcf.account": event.account,
            "nvcf.function.id": event.function_id,
            "nvcf.function.version.id": event.version_id,
        }
        if isinstance(event, Logged):
            if Kind.LOGS in kinds and self.logs is not None:
                self.logs.add(event.lines)
            return
        if isinstance(event, Tokens):
            if Kind.METRICS in kinds and self.instruments is not None:
                tokens, attributes = self.instruments[2], self.counted(attributes)
                for token_type, n in (
                    ("input", event.input_tokens),
                    ("output", event.output_tokens),
                ):
                    labels = {**attributes, "model": event.model, "token_type": token_type}
                    tokens.add(n, labels)
            return
        if Kind.TRACES in kinds and self.spans is not None:
            spans = self._spans(event, attributes)
            if self.backlog.take(len(spans)):
                for span in spans:
                    self.spans.on_end(span)
            else:  # the processor's queue is full (a slow or dead endpoint)
                self.drops.add("queue_full", len(spans))
                self.status.lost(len(spans))
        if Kind.METRICS in kinds and self.instruments is not None:
            outcome = event.refusal or ("fulfilled" if event.fulfilled else "errored")
            invocations, latency, _ = self.instruments
            attributes = self.counted(attributes)
            invocations.add(1, {**attributes, "outcome": outcome})
            if event.refusal is None:  # the latency is of answered invocations, as on /metrics
                latency.record((event.end_ns - event.start_ns) / 1e9, attributes)

    def _skip(self, kinds: Collection[Kind], event: Event) -> None:
        """Count what the event would have sent: its lines, its spans, one for its metric
        points."""
        n = 0
        if isinstance(event, Logged | TaskLogged):
            n = len(event.lines) if Kind.LOGS in kinds and self.logs is not None else 0
        elif isinstance(event, TaskEnded):
            if Kind.TRACES in kinds and self.spans is not None:
                n = len(task_spans(event, self.resource))
        else:
            if Kind.METRICS in kinds and self.instruments is not None:
                n += 1
            if isinstance(event, Invocation) and Kind.TRACES in kinds and self.spans is not None:
                phases = 0 if event.queued_ns is None else 2 + (event.dispatched_ns is not None)
                n += 1 + phases
        if n:
            self.drops.skipped(self.status, n)

    def _spans(self, event: Invocation, attributes: dict[str, str]) -> list[ReadableSpan]:
        """The invocation's span and its children: admission, the wait for an instance and
        the worker's time (its id the one the worker got in `traceparent`). Made as finished
        spans with the ids chosen at admission: a tracer would choose its own ids, and costs
        several times as much on the event loop."""
        trace_id = event.trace.trace_id if event.trace is not None else _IDS.generate_trace_id()
        root = SpanContext(trace_id, _IDS.generate_span_id(), False, _SAMPLED)
        failed = Status(StatusCode.ERROR, event.refusal)
        spans = [
            self._span("invocation", root, None, attributes, event.start_ns, event.end_ns, event)
        ]
        if event.queued_ns is None:
            return spans
        waited = event.dispatched_ns if event.dispatched_ns is not None else event.end_ns
        phases = [
            ("admission", event.start_ns, event.queued_ns, _IDS.generate_span_id()),
            ("queue wait", event.queued_ns, waited, _IDS.generate_span_id()),
        ]
        if event.dispatched_ns is not None:
            worker = event.trace.worker_span_id if event.trace else _IDS.generate_span_id()
            phases.append(("worker", event.dispatched_ns, event.end_ns, worker))
        for name, start, end, span_id in phases:
            context = SpanContext(trace_id, span_id, False, _SAMPLED)
            spans.append(
                ReadableSpan(
                    name,
                    context,
                    root,
                    self.resource,
                    attributes,
                    kind=SpanKind.INTERNAL,
                    status=failed if name == "worker" and not event.fulfilled else _UNSET,
                    start_time=start,
                    end_time=end,
                    instrumentation_scope=SCOPE,
                )
            )
        return spans

    def _span(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, str],
        start: int,
        end: int,
        event: Invocation,
    ) -> ReadableSpan:
        return ReadableSpan(
            name,
            context,
            parent,
            self.resource,
            attributes,
            kind=SpanKind.SERVER,
            status=_UNSET if event.fulfilled else Status(StatusCode.ERROR, event.refusal),
            start_time=start,
            end_time=end,
            instrumentation_scope=SCOPE,
        )

    def flush(self, timeout_millis: int) -> None:
        if self.logs is not None:
            self.logs.flush()
        if self.spans is not None:
            self.spans.force_flush(timeout_millis)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if self.logs is not None:
            self.logs.shutdown()
        if self.spans is not None:
            self.spans.shutdown()  # type: ignore[no-untyped-call]
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


#: a wire's sender of log lines and what closes it
LogSender = tuple[logs.Send, Callable[[], None]]
#: a wire's exporters of spans and of metrics and its log sender (None: the wire does not
#: carry them)
Exporters = tuple[
    Callable[[], SpanExporter] | None,
    Callable[[], MetricExporter] | None,
    Callable[[], LogSender] | None,
]


def _http_exporters(
    account: str,
    target: Target,
    headers: dict[str, str],
    settings: ExportSettings,
    status: EndpointStatus,
) -> Exporters:
    """OTLP/HTTP: each connection through the guard (requests, pinned adapter)."""
    base = target.url.rstrip("/")
    guard = EndpointGuard(settings.allowlist, status)
    common: dict[str, Any] = {
        "headers": headers,
        "timeout": settings.timeout,
        "max_request_size": MAX_REQUEST_BYTES,
    }

    def log_sender() -> LogSender:
        session = guarded_session(guard, status)
        send = logs.otlp_http(
            account,
            base,
            headers,
            session,
            timeout=settings.timeout,
            max_bytes=MAX_REQUEST_BYTES,
        )
        return send, session.close

    return (
        lambda: OTLPSpanExporter(
            endpoint=f"{base}/v1/traces", session=guarded_session(guard, status), **common
        ),
        lambda: OTLPMetricExporter(
            endpoint=f"{base}/v1/metrics", session=guarded_session(guard, status), **common
        ),
        log_sender,
    )


def _remote_write_exporters(
    target: Target,
    headers: dict[str, str],
    settings: ExportSettings,
    status: EndpointStatus,
    client: mtls.ClientCertificate | None,
) -> Exporters:
    """Prometheus remote write: metrics only, each connection through the guard (presenting
    the telemetry's client certificate when its key is one)."""
    guard = EndpointGuard(settings.allowlist, status)
    tls = client.context() if client is not None else None
    return (
        None,
        lambda: RemoteWriteExporter(
            target.url,
            headers,
            settings.timeout,
            MAX_REQUEST_BYTES,
            guarded_session(guard, status, tls),
        ),
        None,
    )


def _datadog_exporters(
    target: Target, key: str, settings: ExportSettings, status: EndpointStatus
) -> Exporters:
    """Datadog's intake: metrics (series v2), logs (logs v2) and traces (its OTLP traces
    intake, protobuf over HTTP), each connection through the guard."""
    guard = EndpointGuard(settings.allowlist, status)
    # a site's logs and traces go to their intake hosts; an intake URL takes every path
    site = target.host.removeprefix("api.")
    logs_url = f"https://http-intake.logs.{site}" if target.site else target.url
    traces_url = f"https://otlp.{site}" if target.site else target.url.rstrip("/")

    def log_sender() -> LogSender:
        session = guarded_session(guard, status)
        send = logs.datadog(
            logs_url, key, session, timeout=settings.timeout, max_bytes=MAX_REQUEST_BYTES
        )
        return send, session.close

    return (
        lambda: OTLPSpanExporter(
            endpoint=f"{traces_url}/v1/traces",
            session=guarded_session(guard, status),
            headers={"dd-api-key": key, "dd-protocol": "otlp"},
            timeout=settings.timeout,
            max_request_size=MAX_REQUEST_BYTES,
        ),
        lambda: DatadogMetricsExporter(
            target.url, key, settings.timeout, MAX_REQUEST_BYTES, guarded_session(guard, status)
        ),
        log_sender,
    )


def _grpc_exporters(
    account: str,
    target: Target,
    headers: dict[str, str],
    settings: ExportSettings,
    status: EndpointStatus,
) -> Exporters:
    """OTLP/gRPC: the channel goes to the addresses checked now (gRPC would resolve the name
    again itself), under the endpoint's name for TLS and the authority; raises OSError when
    the host resolves to an address it may not contact."""
    status.unanswered = "the endpoint refused the gRPC export or did not answer in time"
    addresses = EndpointGuard(settings.allowlist, status).pinned(target.host, target.port)
    address = addresses[0]
    pinned = f"[{address}]:{target.port}" if ":" in address else f"{address}:{target.port}"
    scheme = urlsplit(target.url).scheme
    options: tuple[tuple[str, str], ...] = (("grpc.default_authority", target.host),)
    if scheme == "https":
        options += (("grpc.ssl_target_name_override", target.host),)
    common: dict[str, Any] = {
        "endpoint": pinned,
        "insecure": scheme == "http",
        "headers": {k.lower(): v for k, v in headers.items()},
        "timeout": settings.timeout,
        "channel_options": options,
    }

    def log_sender() -> LogSender:
        if scheme == "https":
            channel = grpc.secure_channel(pinned, grpc.ssl_channel_credentials(), options)
        else:
            channel = grpc.insecure_channel(pinned, options)
        send = logs.otlp_grpc(account, channel, common["headers"], settings.timeout)
        return send, channel.close

    return (
        lambda: GrpcSpanExporter(**common),
        lambda: GrpcMetricExporter(**common),
        log_sender,
    )


def build_pipeline(
    telemetry: Telemetry,
    key: str,
    settings: ExportSettings,
    drops: Drops,
    loads: LoadSource = tuple,
    phases: PhaseSource = tuple,
    tasks: TaskSource = tuple,
) -> Pipeline:
    """The telemetry's pipeline (blocking: it may resolve the endpoint's host). One with no
    wire, or whose endpoint is not a target, has no exporter, and its status says so."""
    provider, protocol = Provider(telemetry.provider), Protocol(telemetry.protocol)
    status = EndpointStatus(clock=settings.clock)
    pipeline = Pipeline(telemetry.id, telemetry.account_id, telemetry.updated_at, status, drops)
    pipeline.replica = settings.replica
    target, _ = target_of(provider, telemetry.endpoint)
    wire = wire_of(provider)
    if wire is None or target is None:  # refused at creation; a row from before is not sent
        status.failed(f"{provider.value} is not exported by this server")
        return pipeline
    headers = _headers(provider, key)
    try:
        account = telemetry.account_id
        exporters: Exporters
        if wire is Wire.REMOTE_WRITE:
            client = mtls.of_key(key)
            exporters = _remote_write_exporters(target, headers, settings, status, client)
        elif wire is Wire.DATADOG:
            exporters = _datadog_exporters(target, key, settings, status)
        elif protocol is Protocol.HTTP:
            exporters = _http_exporters(account, target, headers, settings, status)
        else:
            exporters = _grpc_exporters(account, target, headers, settings, status)
        make_spans, make_metrics, make_logs = exporters
    except OSError as exc:  # the guard's refusal, or a name that does not resolve
        status.failed(str(exc))
        return pipeline
    resource = Resource.create({"service.name": "nvcf", "nvcf.account": telemetry.account_id})
    if Kind.LOGS in telemetry.kinds and make_logs is not None:
        send, close = make_logs()
        pipeline.logs = logs.LogBatcher(send, status, drops, settings.interval, close)
    if Kind.TRACES in telemetry.kinds and make_spans is not None:
        pipeline.resource = resource
        pipeline.spans = BatchSpanProcessor(
            WatchedSpans(make_spans(), status, drops, pipeline.backlog),
            max_queue_size=SPAN_QUEUE,
            schedule_delay_millis=settings.interval * 1000,
            export_timeout_millis=settings.timeout * 1000,
        )
    if Kind.METRICS in telemetry.kinds and make_metrics is not None:
        reader = PeriodicExportingMetricReader(
            WatchedMetrics(
                make_metrics(), status, drops, TEMPORALITY if wire is Wire.DATADOG else None
            ),
            export_interval_millis=settings.interval * 1000,
            export_timeout_millis=settings.timeout * 1000,
        )
        pipeline.meter_provider = MeterProvider(
            metric_readers=[reader], resource=resource, shutdown_on_exit=False
        )
        meter = pipeline.meter_provider.get_meter("nvcf.invocation")
        pipeline.instruments = (
            meter.create_counter(
                "nvcf.function.invocations", unit="{invocation}", description="Invocations"
            ),
            meter.create_histogram(
                "nvcf.function.invocation.duration",
                unit="s",
                description="Invocation time from acceptance to the end of the worker's answer",
            ),
            meter.create_counter(
                "nvcf.function.tokens",
                unit="{token}",
                description="Tokens the LLM workers reported, by model and type (input, output)",
            ),
        )
        account, tid = telemetry.account_id, telemetry.id

        def observe(read: Callable[[Load], int]) -> Callable[[CallbackOptions], list[Observation]]:
            def callback(options: CallbackOptions) -> list[Observation]:
                return [
                    Observation(read(w.load), pipeline.counted(w.attributes()))
                    for w in loads()
                    if w.account == account and w.names(tid, Kind.METRICS)
                ]

            return callback

        meter.create_observable_gauge(
            "nvcf.function.queue_depth",
            [observe(lambda load: load.waiting)],
            unit="{invocation}",
            description="Invocations waiting for an instance (this replica)",
        )
        meter.create_observable_gauge(
            "nvcf.function.in_flight",
            [observe(lambda load: load.in_flight)],
            unit="{invocation}",
            description="Invocations on an instance now (this replica)",
        )

        def by_phase(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(n, {**_labels(p), "phase": phase})
                for p in phases()
                if p.account == account and _names(p.telemetries, tid)
                for phase, n in p.counts.items()
            ]

        meter.create_observable_gauge(
            "nvcf.function.instances",
            [by_phase],
            unit="{instance}",
            description="The function version's wanted instances, by phase",
        )
        task_gauges(meter, account, tid, tasks)
    return pipeline


def _labels(p: Phased) -> dict[str, str]:
    return {
        "nvcf.account": p.account,
        "nvcf.function.id": p.function_id,
        "nvcf.function.version.id": p.version_id,
    }


def _names(telemetries: Mapping[str, str], telemetry_id: uuid.UUID) -> bool:
    field = next(f for f, k in FIELDS.items() if k is Kind.METRICS)
    return str(telemetries.get(field, "")).lower() == str(telemetry_id)

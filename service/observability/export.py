"""In-process export of the platform's per-function signals to the tenant's telemetry endpoints
(the embedded default and the simulated clusters; on Kubernetes a collector sidecar does it).

For each answered invocation of a version that names telemetries, the invocation plane hands
an `Invocation` to `Exports.invocation`: a non-blocking put on a bounded queue (full: dropped
and counted). One task reads the queue, finds each named telemetry's `Pipeline` (loaded from
the database, the telemetry's account checked against the function's, the key decrypted) and
records the invocation there: a span on its traces endpoint, the counter and the latency
histogram on its metrics endpoint. The OpenTelemetry SDK's batch processor and periodic
reader export from their own threads through its OTLP exporters (HTTP or gRPC), so a slow or
dead endpoint never holds the event loop; their queues are bounded and a failed batch is
dropped (counted).

Every connection of an OTLP/HTTP export goes through `EndpointGuard` (endpoints.py): the host
is resolved and each address checked as at creation (charts/netguard.py pins the checked
addresses), redirects are not followed, and each request is bounded in time and size. A gRPC
channel goes only to the addresses checked when its pipeline was built (gRPC would otherwise
resolve again). Each telemetry's last success and last error (the endpoint's HTTP status, or
why nothing answered) are written back to it.

Nothing is done for a version that names no telemetry: the plane checks its target's
`telemetries` before calling here.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import typing
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.crypto import SecretBox
from service.observability import repository
from service.observability.datadog import TEMPORALITY, DatadogMetricsExporter
from service.observability.endpoints import (
    Drops,
    EndpointGuard,
    EndpointStatus,
    WatchedMetrics,
    WatchedSpans,
    guarded_session,
)
from service.observability.models import Kind, Protocol, Provider, Telemetry
from service.observability.references import FIELDS
from service.observability.remote_write import RemoteWriteExporter
from service.observability.service import key_of
from service.observability.wires import Target, Wire, target_of, wire_of

log = logging.getLogger("nvcf.observability")

#: the largest request body an export sends (a larger batch is dropped, counted)
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: how long a loaded pipeline is used before its telemetry is read again (a new key, deleted)
PIPELINE_TTL = 30.0


@dataclass(frozen=True)
class ExportSettings:
    queue_size: int = 10000
    #: seconds between two metric exports, and the longest a span waits in its batch
    interval: float = 30.0
    #: seconds of one export request (its retries included)
    timeout: float = 10.0
    allowlist: Collection[str] = ()


@dataclass(frozen=True)
class Invocation:
    """An answered invocation of a version naming telemetries (`telemetries` as stored)."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    fulfilled: bool
    start_ns: int
    end_ns: int
    #: why the platform refused it before a worker answered (`rate_limited`, `queue_full`)
    refusal: str | None = None


@dataclass(frozen=True)
class Tokens:
    """The tokens an LLM worker reported for one invocation of a version naming telemetries."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    model: str
    input_tokens: int
    output_tokens: int


#: what the export queue carries
Event = Invocation | Tokens


class Load(typing.Protocol):
    """A version's load on this replica (invocation/load.py's VersionLoad), read as it is."""

    in_flight: int
    waiting: int


@dataclass(frozen=True)
class Watched:
    """A version naming telemetries, and its load record."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    load: Load

    def attributes(self) -> dict[str, str]:
        return {
            "nvcf.account": self.account,
            "nvcf.function.id": self.function_id,
            "nvcf.function.version.id": self.version_id,
        }

    def names(self, telemetry_id: uuid.UUID, kind: Kind) -> bool:
        field = next(f for f, k in FIELDS.items() if k is kind)
        return str(self.telemetries.get(field, "")).lower() == str(telemetry_id)


#: the versions naming telemetries whose loads a pipeline's gauges read (snapshots)
LoadSource = Callable[[], Sequence[Watched]]


def _headers(provider: Provider, key: str) -> dict[str, str]:
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
    tracer_provider: TracerProvider | None = None
    tracer: Tracer | None = None
    meter_provider: MeterProvider | None = None
    #: the invocation counter, the latency histogram, the token counter
    instruments: tuple[Any, Any, Any] | None = None
    loaded: float = field(default_factory=time.monotonic)

    def record(self, kinds: Collection[Kind], event: Event) -> None:
        attributes = {
            "nvcf.account": event.account,
            "nvcf.function.id": event.function_id,
            "nvcf.function.version.id": event.version_id,
        }
        if isinstance(event, Tokens):
            if Kind.METRICS in kinds and self.instruments is not None:
                tokens = self.instruments[2]
                for token_type, n in (
                    ("input", event.input_tokens),
                    ("output", event.output_tokens),
                ):
                    labels = {**attributes, "model": event.model, "token_type": token_type}
                    tokens.add(n, labels)
            return
        if Kind.TRACES in kinds and self.tracer is not None:
            span = self.tracer.start_span(
                "invocation", kind=SpanKind.SERVER, attributes=attributes, start_time=event.start_ns
            )
            if not event.fulfilled:
                span.set_status(Status(StatusCode.ERROR, event.refusal))
            span.end(end_time=event.end_ns)
        if Kind.METRICS in kinds and self.instruments is not None:
            outcome = event.refusal or ("fulfilled" if event.fulfilled else "errored")
            invocations, latency, _ = self.instruments
            invocations.add(1, {**attributes, "outcome": outcome})
            if event.refusal is None:  # the latency is of answered invocations, as on /metrics
                latency.record((event.end_ns - event.start_ns) / 1e9, attributes)

    def flush(self, timeout_millis: int) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(timeout_millis)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


#: a wire's exporters of spans and of metrics (None: the wire does not carry them)
Exporters = tuple[Callable[[], SpanExporter] | None, Callable[[], MetricExporter] | None]


def _http_exporters(
    target: Target, headers: dict[str, str], settings: ExportSettings, status: EndpointStatus
) -> Exporters:
    """OTLP/HTTP: each connection through the guard (requests, pinned adapter)."""
    base = target.url.rstrip("/")
    guard = EndpointGuard(settings.allowlist, status)
    common: dict[str, Any] = {
        "headers": headers,
        "timeout": settings.timeout,
        "max_request_size": MAX_REQUEST_BYTES,
    }
    return (
        lambda: OTLPSpanExporter(
            endpoint=f"{base}/v1/traces", session=guarded_session(guard, status), **common
        ),
        lambda: OTLPMetricExporter(
            endpoint=f"{base}/v1/metrics", session=guarded_session(guard, status), **common
        ),
    )


def _remote_write_exporters(
    target: Target, headers: dict[str, str], settings: ExportSettings, status: EndpointStatus
) -> Exporters:
    """Prometheus remote write: metrics only, each connection through the guard."""
    guard = EndpointGuard(settings.allowlist, status)
    return None, lambda: RemoteWriteExporter(
        target.url, headers, settings.timeout, MAX_REQUEST_BYTES, guarded_session(guard, status)
    )


def _datadog_exporters(
    target: Target, key: str, settings: ExportSettings, status: EndpointStatus
) -> Exporters:
    """Datadog's intake: metrics (series v2), each connection through the guard."""
    guard = EndpointGuard(settings.allowlist, status)
    return None, lambda: DatadogMetricsExporter(
        target.url, key, settings.timeout, MAX_REQUEST_BYTES, guarded_session(guard, status)
    )


def _grpc_exporters(
    target: Target, headers: dict[str, str], settings: ExportSettings, status: EndpointStatus
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
    return (lambda: GrpcSpanExporter(**common), lambda: GrpcMetricExporter(**common))


def build_pipeline(
    telemetry: Telemetry,
    key: str,
    settings: ExportSettings,
    drops: Drops,
    loads: LoadSource = tuple,
) -> Pipeline:
    """The telemetry's pipeline (blocking: it may resolve the endpoint's host). One with no
    wire, or whose endpoint is not a target, has no exporter, and its status says so."""
    provider, protocol = Provider(telemetry.provider), Protocol(telemetry.protocol)
    status = EndpointStatus()
    pipeline = Pipeline(telemetry.id, telemetry.account_id, telemetry.updated_at, status)
    target, _ = target_of(provider, telemetry.endpoint)
    wire = wire_of(provider)
    if wire is None or target is None:  # refused at creation; a row from before is not sent
        status.failed(f"{provider.value} is not exported by this server")
        return pipeline
    headers = _headers(provider, key)
    try:
        if wire is Wire.REMOTE_WRITE:
            make_spans, make_metrics = _remote_write_exporters(target, headers, settings, status)
        elif wire is Wire.DATADOG:
            make_spans, make_metrics = _datadog_exporters(target, key, settings, status)
        elif protocol is Protocol.HTTP:
            make_spans, make_metrics = _http_exporters(target, headers, settings, status)
        else:
            make_spans, make_metrics = _grpc_exporters(target, headers, settings, status)
    except OSError as exc:  # the guard's refusal, or a name that does not resolve
        status.failed(str(exc))
        return pipeline
    resource = Resource.create({"service.name": "nvcf", "nvcf.account": telemetry.account_id})
    if Kind.TRACES in telemetry.kinds and make_spans is not None:
        # shut down by Exports (an atexit hook per pipeline would pile up over rebuilds)
        pipeline.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        pipeline.tracer_provider.add_span_processor(
            BatchSpanProcessor(
                WatchedSpans(make_spans(), status, drops),
                max_queue_size=2048,
                schedule_delay_millis=settings.interval * 1000,
                export_timeout_millis=settings.timeout * 1000,
            )
        )
        pipeline.tracer = pipeline.tracer_provider.get_tracer("nvcf.invocation")
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
                    Observation(read(w.load), w.attributes())
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
    return pipeline


def _each(pipelines: Sequence[Pipeline], action: Callable[[Pipeline], None]) -> None:
    for pipeline in pipelines:
        action(pipeline)


class Exports:
    """The process's export of per-function signals (one queue, one task)."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        box: SecretBox,
        settings: ExportSettings,
        drops: Drops,
    ) -> None:
        self._maker = maker
        self._box = box
        self.settings = settings
        self.drops = drops
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=settings.queue_size)
        #: telemetry id -> (when it was read, its pipeline or None)
        self._pipelines: dict[uuid.UUID, tuple[float, Pipeline | None]] = {}
        self._task: asyncio.Task[None] | None = None
        #: version id -> its load, for the gauges (a later record of a version replaces it)
        self._watched: dict[str, Watched] = {}

    def watch(self, watched: Watched) -> None:
        """Read a version's load in its telemetries' gauges (the load tracker's new record)."""
        self._watched[watched.version_id] = watched

    def _loads(self) -> Sequence[Watched]:
        # the SDK's reader thread takes a copy (the loop may add a record meanwhile)
        return list(self._watched.values())

    def invocation(self, event: Event) -> None:
        """Queue an invocation or its tokens; never blocks (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.drops.add("queue_full")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="telemetry-export")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        pipelines = self._live()
        self._pipelines.clear()
        await asyncio.to_thread(_each, pipelines, Pipeline.shutdown)
        await self._write_statuses(pipelines)

    async def flush(self) -> None:
        """Record what is queued and export what is recorded now, then write the statuses
        back (tests; shutdown does the same)."""
        await self._queue.join()
        pipelines = self._live()
        millis = int(self.settings.timeout * 1000)
        await asyncio.to_thread(_each, pipelines, lambda p: p.flush(millis))
        await self._write_statuses(pipelines)

    async def _run(self) -> None:
        period = min(self.settings.interval, 5.0)
        while True:
            try:
                event = await asyncio.wait_for(self._queue.get(), timeout=period)
            except TimeoutError:
                await self._write_statuses(self._live())
                continue
            try:
                await self._record(event)
            except Exception:  # one bad event never stops the export of the others
                log.exception("telemetry export: recording an invocation failed")
            finally:
                self._queue.task_done()

    async def _record(self, event: Event) -> None:
        by_id: dict[uuid.UUID, set[Kind]] = {}
        for name, value in event.telemetries.items():
            kind = FIELDS.get(name)
            if kind is not None:
                by_id.setdefault(uuid.UUID(str(value)), set()).add(kind)
        for telemetry_id, kinds in by_id.items():
            pipeline = await self._pipeline(telemetry_id)
            # nothing of one account ever goes to another's endpoint
            if pipeline is not None and pipeline.account == event.account:
                pipeline.record(kinds, event)

    async def _pipeline(self, telemetry_id: uuid.UUID) -> Pipeline | None:
        """The telemetry's pipeline, read again after PIPELINE_TTL (a new key rebuilds it; a
        deleted telemetry has none)."""
        loaded, known = self._pipelines.get(telemetry_id, (None, None))
        now = time.monotonic()
        if loaded is not None and now - loaded < PIPELINE_TTL:
            return known
        async with self._maker() as session:
            row = await repository.by_id(session, telemetry_id)
        if known is not None and row is not None and row.updated_at == known.updated_at:
            self._pipelines[telemetry_id] = (now, known)
            return known
        if known is not None:
            await asyncio.to_thread(known.shutdown)
        pipeline = None
        if row is not None:
            key = key_of(row, self._box)
            if key is not None:
                pipeline = await asyncio.to_thread(
                    build_pipeline, row, key, self.settings, self.drops, self._loads
                )
        self._pipelines[telemetry_id] = (now, pipeline)
        return pipeline

    def _live(self) -> list[Pipeline]:
        return [p for _, p in self._pipelines.values() if p is not None]

    async def _write_statuses(self, pipelines: Sequence[Pipeline]) -> None:
        changes = [(p.telemetry_id, s) for p in pipelines if (s := p.status.take()) is not None]
        if not changes:
            return
        async with self._maker() as session, session.begin():
            for telemetry_id, (success, error_at, error, dropped) in changes:
                await session.execute(
                    update(Telemetry)
                    .where(Telemetry.id == telemetry_id)
                    .values(
                        last_success_at=success,
                        last_error_at=error_at,
                        last_error=error,
                        dropped=Telemetry.dropped + dropped,
                    )
                )

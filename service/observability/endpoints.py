"""Each tenant endpoint's guarded connections, export outcomes and drop counts for export.py."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter

from service.charts.netguard import PinnedAdapter, forbidden_reason, resolve
from service.core.db import utcnow
from service.observability.service import clip_error
from service.observability.wires import allowed_by

#: after a failed export, an endpoint's signals are dropped (counted, reason `endpoint_failing`)
#: without being built, encoded or sent for FIRST_BACKOFF seconds, doubled at each failure of
#: the retry that follows, at most MAX_BACKOFF (as the OpenTelemetry exporters and Prometheus'
#: remote write back off). Then signals are recorded again until one export, the retry, is
#: under way; while it is, they are dropped too. Its success ends the backoff.
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0


#: the drop reason of signals an endpoint in backoff was not sent
FAILING = "endpoint_failing"


class Drops:
    """The operator's count of what was not exported, by reason (`/metrics`)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.counter = Counter(
            "nvcf_telemetry_dropped_total",
            "Signals for tenants' telemetry endpoints not exported, by reason.",
            ["reason"],
            registry=registry,
        )

    def add(self, reason: str, n: int = 1) -> None:
        self.counter.labels(reason).inc(n)

    def skipped(self, status: EndpointStatus, n: int) -> None:
        """`n` signals not sent to an endpoint in backoff (on the telemetry's count too)."""
        self.add(FAILING, n)
        status.lost(n)


@dataclass
class EndpointStatus:
    """A telemetry's export outcomes, written from the SDK's threads, read by the loop; and
    its backoff: while `failing()`, what would go to the endpoint is dropped unencoded."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    last_success_at: datetime | None = None
    last_error_at: datetime | None = None
    last_error: str | None = None
    #: signals dropped since the last write back
    dropped: int = 0
    #: set by an outcome, cleared when written back to the telemetry
    dirty: bool = False
    #: the last answer of the endpoint and the guard's last refusal (this export's reason)
    answer: str | None = None
    refusal: str | None = None
    #: the reason of a failure with neither (gRPC's status is not seen here)
    unanswered: str = "no answer: connection failed or timed out"
    #: failed exports in a row, until when (`clock`) the endpoint is not tried again, and
    #: whether the retry after that is under way
    failures: int = 0
    backoff_until: float = 0.0
    retrying: bool = False
    clock: Callable[[], float] = time.monotonic

    def failing(self) -> bool:
        """Whether the endpoint's last export failed and its backoff has not ended, or its
        retry is under way: what would go there now is dropped."""
        return self.failures > 0 and (self.retrying or self.backoff_until > self.clock())

    def attempt(self) -> bool:
        """Whether an export may be sent now (False: the endpoint is failing); an export
        after a backoff is its retry, and until it ends the endpoint is failing."""
        with self.lock:
            if self.failing():
                return False
            self.retrying = self.failures > 0
            return True

    def succeeded(self) -> None:
        with self.lock:
            self.last_success_at, self.dirty = utcnow(), True
            self.failures, self.backoff_until, self.retrying = 0, 0.0, False

    def failed(self, reason: str, dropped: int = 0) -> None:
        with self.lock:
            self.last_error_at, self.last_error, self.dirty = utcnow(), clip_error(reason), True
            self.dropped += dropped
            self.retrying = False
            now = self.clock()
            if self.backoff_until <= now:  # not an export begun before the last failure
                self.failures += 1
                delay = min(FIRST_BACKOFF * 2 ** min(self.failures - 1, 16), MAX_BACKOFF)
                self.backoff_until = now + delay

    def lost(self, dropped: int) -> None:
        """Signals dropped before they reached the endpoint (its queue was full, or it is
        failing)."""
        with self.lock:
            self.dropped, self.dirty = self.dropped + dropped, True

    def take(self) -> tuple[datetime | None, datetime | None, str | None, int] | None:
        """The outcomes to write back (the drops since the last take), or None."""
        with self.lock:
            if not self.dirty:
                return None
            self.dirty, dropped, self.dropped = False, self.dropped, 0
            return self.last_success_at, self.last_error_at, self.last_error, dropped


class EndpointGuard:
    """netguard's AddressBook for one endpoint: every connection resolves its host and
    connects only to addresses that are public, or to the operator's allowed endpoints."""

    def __init__(self, allowlist: Collection[str], status: EndpointStatus) -> None:
        self._allowlist = allowlist
        self._status = status

    def pinned(self, hostname: str, port: int) -> Sequence[str]:
        addresses = resolve(hostname, port)
        if allowed_by(self._allowlist, hostname, port):
            return addresses
        for address in addresses:
            reason = forbidden_reason(address)
            if reason is not None:
                refusal = f"refused to connect: {hostname} resolves to a {reason} address"
                self._status.refusal = refusal
                raise OSError(refusal)
        return addresses


class ClientTlsAdapter(PinnedAdapter):
    """A pinned adapter whose TLS connections use `context` (a client certificate)."""

    def __init__(self, book: EndpointGuard, context: ssl.SSLContext, **kwargs: Any) -> None:
        self.context = context  # before super().__init__, which builds the pool manager
        super().__init__(book, **kwargs)

    def init_poolmanager(
        self,
        connections: int,
        maxsize: int,
        block: bool = requests.adapters.DEFAULT_POOLBLOCK,
        **pool_kwargs: Any,
    ) -> None:
        super().init_poolmanager(
            connections, maxsize, block, **{**pool_kwargs, "ssl_context": self.context}
        )


def guarded_session(
    guard: EndpointGuard, status: EndpointStatus, tls: ssl.SSLContext | None = None
) -> requests.Session:
    """A session whose every connection goes through `guard` (and, with `tls`, presents its
    client certificate)."""
    session = requests.Session()
    session.trust_env = False  # no proxy: it would resolve the host out of the guard's reach
    session.max_redirects = 0
    adapter = (
        PinnedAdapter(guard, max_retries=0)
        if tls is None
        else ClientTlsAdapter(guard, tls, max_retries=0)
    )
    session.mount("https://", adapter)
    session.mount("http://", adapter)

    def answered(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if response.status_code >= 300:
            status.answer = f"the endpoint answered HTTP {response.status_code}" + (
                f" {response.reason}" if response.reason else ""
            )

    session.hooks["response"].append(answered)
    return session


def reason_of(status: EndpointStatus) -> str:
    """Why the last export failed (the endpoint's answer, the guard's refusal, or neither)."""
    reason = status.answer or status.refusal or status.unanswered
    status.answer = status.refusal = None
    return reason


class Backlog:
    """Spans handed to a batch processor and not yet through its exporter. The processor
    drops what overflows its queue without telling anyone; counting here, the pipeline drops
    (and counts) a span the queue has no room for before handing it over."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._pending = 0

    def take(self, n: int) -> bool:
        with self._lock:
            if self._pending + n > self.limit:
                return False
            self._pending += n
            return True

    def done(self, n: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - n)


class WatchedSpans(SpanExporter):
    def __init__(
        self,
        inner: SpanExporter,
        status: EndpointStatus,
        drops: Drops,
        backlog: Backlog | None = None,
    ) -> None:
        self._inner, self._status, self._drops = inner, status, drops
        self._backlog = backlog

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            if not self._status.attempt():  # neither encoded nor sent while failing
                self._drops.skipped(self._status, len(spans))
                return SpanExportResult.FAILURE
            result = SpanExportResult.FAILURE
            try:
                result = self._inner.export(spans)
            finally:  # an exporter that raised failed: its retry is over too
                if result is SpanExportResult.SUCCESS:
                    self._status.succeeded()
                else:
                    self._status.failed(reason_of(self._status), len(spans))
                    self._drops.add("export_failed", len(spans))
            return result
        finally:
            if self._backlog is not None:
                self._backlog.done(len(spans))

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class WatchedMetrics(MetricExporter):
    def __init__(
        self,
        inner: MetricExporter,
        status: EndpointStatus,
        drops: Drops,
        temporality: dict[type, AggregationTemporality] | None = None,
    ) -> None:
        # the reader asks this wrapper, not the inner exporter, which temporality to send
        super().__init__(preferred_temporality=temporality)
        self._inner, self._status, self._drops = inner, status, drops

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if not self._status.attempt():  # neither encoded nor sent while failing
            self._drops.skipped(self._status, 1)
            return MetricExportResult.FAILURE
        result = MetricExportResult.FAILURE
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis)
        finally:  # an exporter that raised failed: its retry is over too
            if result is MetricExportResult.SUCCESS:
                self._status.succeeded()
            else:
                self._status.failed(reason_of(self._status), 1)
                self._drops.add("export_failed")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)

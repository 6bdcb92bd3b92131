"""Instance log lines for a tenant's LOGS telemetry: encoded for its wire and sent in batches
from a thread of their own, so a slow or dead endpoint never holds the event loop.

- OTLP: an `ExportLogsServiceRequest` built with opentelemetry-proto's classes (the SDK's log
  exporter lives in private modules), POSTed to `<endpoint>/v1/logs` as protobuf, or sent
  with the collector's `LogsService/Export` over gRPC to the addresses checked when the
  pipeline was built;
- Datadog: its logs intake (`POST /api/v2/logs`, JSON, the key in `DD-API-KEY`) on the
  site's `http-intake.logs.<site>` host or the telemetry's intake URL.

A batcher holds at most `MAX_QUEUED` lines; beyond it lines are dropped and counted, as is
every line of a batch the endpoint refused or never answered.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import grpc
import requests
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from service.observability.endpoints import Drops, EndpointStatus, reason_of

#: lines waiting for their endpoint, per telemetry; more are dropped (counted)
MAX_QUEUED = 4096
#: lines per request (Datadog's intake takes at most 1000 entries a request)
MAX_BATCH = 1000
SCOPE = "nvcf.instance.logs"


@dataclass(frozen=True)
class Line:
    """One line an instance's container printed, masked and cut as the logs route shows it."""

    account: str
    function_id: str
    version_id: str
    instance_id: str
    pod: str
    container: str
    text: str
    time_ns: int

    def attributes(self) -> dict[str, str]:
        return {
            "nvcf.account": self.account,
            "nvcf.function.id": self.function_id,
            "nvcf.function.version.id": self.version_id,
            "nvcf.instance.id": self.instance_id,
            "k8s.pod.name": self.pod,
            "k8s.container.name": self.container,
        }


def time_of(stamp: str, default: int) -> int:
    """Nanoseconds since the epoch of an RFC 3339 stamp as the kubelet writes it (nanosecond
    digits, `Z`); `default` when there is none or it does not parse."""
    if not stamp:
        return default
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        seconds = datetime.fromisoformat(head + "+00:00").timestamp()
    except ValueError:
        return default
    digits = (frac + "000000000")[:9]
    return int(seconds) * 10**9 + (int(digits) if digits.isdigit() else 0)


def _pairs(values: Mapping[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items()]


def otlp_request(account: str, lines: Sequence[Line]) -> ExportLogsServiceRequest:
    """The lines as one OTLP logs request (the resource: `service.name`, the account)."""
    records = [
        LogRecord(
            time_unix_nano=line.time_ns,
            observed_time_unix_nano=line.time_ns,
            body=AnyValue(string_value=line.text),
            attributes=_pairs(line.attributes()),
        )
        for line in lines
    ]
    resource = Resource(attributes=_pairs({"service.name": "nvcf", "nvcf.account": account}))
    scope = ScopeLogs(scope=InstrumentationScope(name=SCOPE), log_records=records)
    return ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(resource=resource, scope_logs=[scope])]
    )


def datadog_body(lines: Sequence[Line]) -> bytes:
    """The lines as a Datadog logs intake body: a message each, tagged as the metrics are."""
    entries = [
        {
            "ddsource": "nvcf",
            "service": "nvcf",
            "hostname": line.pod,
            "message": line.text,
            "timestamp": line.time_ns // 10**6,
            "ddtags": ",".join(f"{k}:{v}" for k, v in line.attributes().items()),
        }
        for line in lines
    ]
    return json.dumps(entries, separators=(",", ":")).encode()


#: sends one batch (blocking), True when the endpoint took it
Send = Callable[[Sequence[Line]], bool]


def posted(
    url: str,
    headers: Mapping[str, str],
    encode: Callable[[Sequence[Line]], bytes],
    session: requests.Session,
    timeout: float,
    max_bytes: int,
) -> Send:
    """One POST a batch through the endpoint's guarded session (no redirect followed)."""

    def send(lines: Sequence[Line]) -> bool:
        body = encode(lines)
        if len(body) > max_bytes:
            return False
        try:
            response = session.post(
                url, data=body, headers=dict(headers), timeout=timeout, allow_redirects=False
            )
        except (requests.RequestException, OSError):
            return False
        return 200 <= response.status_code < 300

    return send


def otlp_http(
    account: str, base: str, headers: Mapping[str, str], session: requests.Session, **bounds: Any
) -> Send:
    def encode(lines: Sequence[Line]) -> bytes:
        body: bytes = otlp_request(account, lines).SerializeToString()
        return body

    wire = {**headers, "Content-Type": "application/x-protobuf"}
    return posted(base.rstrip("/") + "/v1/logs", wire, encode, session, **bounds)


def datadog(url: str, key: str, session: requests.Session, **bounds: Any) -> Send:
    headers = {"DD-API-KEY": key, "Content-Type": "application/json"}
    return posted(url.rstrip("/") + "/api/v2/logs", headers, datadog_body, session, **bounds)


def otlp_grpc(
    account: str, channel: grpc.Channel, headers: Mapping[str, str], timeout: float
) -> Send:
    stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
    metadata = tuple((k.lower(), v) for k, v in headers.items())

    def send(lines: Sequence[Line]) -> bool:
        try:
            stub.Export(otlp_request(account, lines), metadata=metadata, timeout=timeout)
        except grpc.RpcError:
            return False
        return True

    return send


class LogBatcher:
    """A telemetry's queue of lines and the thread that sends them, a batch at a time, every
    `interval` seconds or as soon as a batch is full."""

    def __init__(
        self,
        send: Send,
        status: EndpointStatus,
        drops: Drops,
        interval: float,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._send, self._status, self._drops = send, status, drops
        self._interval, self._close = interval, close
        self._queue: deque[Line] = deque()
        self._wake = threading.Condition()
        self._sending = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def add(self, lines: Sequence[Line]) -> None:
        """Queue lines; never blocks (beyond MAX_QUEUED they are dropped, counted)."""
        with self._wake:
            if self._stopped:
                return
            room = MAX_QUEUED - len(self._queue)
            if room < len(lines):
                self._drops.add("queue_full", len(lines) - max(room, 0))
                self._status.lost(len(lines) - max(room, 0))
            self._queue.extend(lines[: max(room, 0)])
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="telemetry-logs", daemon=True
                )
                self._thread.start()
            if len(self._queue) >= MAX_BATCH:
                self._wake.notify()

    def _take(self) -> list[Line]:
        with self._wake:
            n = min(MAX_BATCH, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._stopped and len(self._queue) < MAX_BATCH:
                    self._wake.wait(self._interval)
                if self._stopped:
                    return
            self.flush()

    def flush(self) -> None:
        """Send every queued line now (in this thread)."""
        with self._sending:
            while batch := self._take():
                if not self._status.attempt():  # neither encoded nor sent while failing
                    self._drops.skipped(self._status, len(batch))
                    continue
                sent = False
                try:
                    sent = self._send(batch)
                finally:  # a sender that raised failed: its retry is over too
                    if sent:
                        self._status.succeeded()
                    else:
                        self._status.failed(reason_of(self._status), len(batch))
                        self._drops.add("export_failed", len(batch))

    def shutdown(self) -> None:
        self.flush()
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._close()

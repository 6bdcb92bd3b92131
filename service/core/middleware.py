"""Pure-ASGI middleware: request id, body-size limit, Prometheus metrics, one log line per
request.

Written against ASGI directly (not BaseHTTPMiddleware) to keep per-request overhead small.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import DomainError, PayloadTooLarge, RequestTimeout, ValidationFailed
from service.core.http import query_errors
from service.core.logs import request_id_var
from service.core.numbers import natural
from service.core.problem import problem_body
from service.core.server import cut_response

log = logging.getLogger("nvcf.access")
log_errors = logging.getLogger("nvcf.errors")


#: nginx's "client closed request": counted, never reported as a server error
CLIENT_CLOSED = 499

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Metrics:
    """The HTTP request families, on the application's registry (service/telemetry.py).
    The label children of each (method, route, status) are looked up once and kept: an update
    is then prometheus_client's own `inc`/`observe` (bench/metrics_cost.py: about 1% of a
    pexec request's CPU, docs/architecture.md)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "nvcf_http_requests_total",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "nvcf_http_request_duration_seconds",
            "HTTP request latency by method and route template.",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def record(self, method: str, route: str, status: int, seconds: float) -> None:
        if method not in _METHODS:
            method = "OTHER"  # clients choose the method: keep label values bounded
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            counter = self.requests.labels(method, route, str(status))
            children = self._children[key] = (counter, self.latency.labels(method, route))
        children[0].inc()
        children[1].observe(seconds)


#: scope key a handler outside the router sets to name its requests in metrics and logs
ROUTE_LABEL = "nvcf.route_label"


def route_template(scope: Scope) -> str:
    """The matched route's path template, prefix included (label values stay bounded)."""
    label = scope.get(ROUTE_LABEL)
    if label:
        return str(label)
    route = scope.get("route")
    suffix = getattr(route, "path", None)
    if not suffix:
        return "<unmatched>"
    path_segments = scope.get("path", "").rstrip("/").split("/")
    route_segments = suffix.rstrip("/").split("/")
    extra = len(path_segments) - len(route_segments)
    if extra <= 0:
        return str(suffix)
    params = {str(v): k for k, v in scope.get("path_params", {}).items()}
    prefix = [f"{{{params[s]}}}" if s in params else s for s in path_segments[: extra + 1]]
    return "/".join(prefix) + suffix if suffix != "/" else "/".join(prefix)


def _valid_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        max_body_bytes: int,
        json_logs: bool,
        body_limit: Callable[[Scope], int | None] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.json_logs = json_logs
        #: a larger (or smaller) body limit for some requests (e.g. invocations); None: default
        self.body_limit = body_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        incoming = declared = None
        for name, value in scope["headers"]:  # the first of each
            if name == b"x-request-id":
                if incoming is None:
                    incoming = value.decode("latin-1")
            elif name == b"content-length" and declared is None:
                declared = value
        request_id = incoming if incoming and _valid_uuid(incoming) else str(uuid.uuid4())
        state = scope["state"]  # the request's own (`normalize`)
        state["request_id"] = request_id
        rid_token = request_id_var.set(request_id)
        status_holder = [500]
        started = [False]
        rid_header = (b"x-request-id", request_id.encode())
        gone = [False]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status_holder[0] = message["status"]
                message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        limit = self.max_body
        if self.body_limit is not None:
            limit = self.body_limit(scope) or limit
        length = None if declared is None else natural(declared)
        too_large = length is not None and length > limit
        # Checked once for every route, before any reads them: no parameter may carry a NUL
        # or a lone surrogate (PostgreSQL refuses NUL in text; neither is valid in any field).
        bad_query = query_errors(scope.get("query_string", b""))
        try:
            if too_large:
                await self._reject_too_large(scope, send_wrapper, request_id, limit)
            elif bad_query:
                refusal = ValidationFailed.of(bad_query, "query")
                await self._send_problem(send_wrapper, refusal, scope, request_id)
            else:
                await self.app(scope, self._limited(receive, gone, limit), send_wrapper)
        except Exception as exc:
            if gone[0] or isinstance(exc, ClientDisconnect | ConnectionResetError):
                # The client went away (e.g. mid-body): nothing to answer, nothing failed here.
                if not started[0]:
                    status_holder[0] = CLIENT_CLOSED
                log.info("client disconnected during %s %s", scope["method"], scope.get("path"))
                if started[0]:  # the rest cannot follow: closed now, not left to flush
                    await cut_response(scope)
                return
            if isinstance(exc, RequestTimeout) and not started[0]:
                # A late body read outside a route: answered like one read in a route.
                await self._send_problem(send_wrapper, exc, scope, request_id)
                return
            log_errors.exception("unhandled error on %s %s", scope["method"], scope.get("path"))
            if started[0]:
                raise
            err = DomainError(detail="an unexpected error occurred; quote the requestId")
            await self._send_problem(send_wrapper, err, scope, request_id)
        finally:
            elapsed = time.perf_counter() - start
            template = route_template(scope)
            method = scope["method"]
            status = status_holder[0]
            self.metrics.record(method, template, status, elapsed)
            self._log(scope, state, method, status, elapsed, request_id)
            request_id_var.reset(rid_token)

    @staticmethod
    def _limited(receive: Receive, gone: list[bool], limit: int) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.disconnect":
                gone[0] = True
            elif message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(detail=f"request body exceeds {limit} bytes")
            return message

        return wrapped

    async def _reject_too_large(
        self, scope: Scope, send: Send, request_id: str, limit: int
    ) -> None:
        err = PayloadTooLarge(detail=f"request body exceeds {limit} bytes")
        await self._send_problem(send, err, scope, request_id)

    async def _send_problem(
        self, send: Send, err: DomainError, scope: Scope, request_id: str
    ) -> None:
        path = scope.get("state", {}).get("original_path") or scope.get("path", "")
        body = json.dumps(problem_body(err, path, request_id)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": err.status,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _log(
        self,
        scope: Scope,
        state: dict[str, Any],
        method: str,
        status: int,
        elapsed: float,
        request_id: str,
    ) -> None:
        # Only the path is logged: query strings and bodies may carry secrets.
        path = state.get("original_path") or scope.get("path", "")
        access_line(
            method,
            path,
            status,
            elapsed,
            request_id,
            state.get("account_id"),
            json_logs=self.json_logs,
        )


def access_line(
    method: str,
    path: str,
    status: int,
    elapsed: float,
    request_id: str,
    account: str | None,
    *,
    json_logs: bool,
) -> None:
    """The access log's line of one request."""
    if not log.isEnabledFor(logging.INFO):
        return
    duration_ms = round(elapsed * 1000, 2)
    # The fields go on the record too: a JSON line carries each (requestId comes from
    # the request-id filter of service/core/logs.py).
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "durationMs": duration_ms,
        "account": account,
    }
    if json_logs:
        log.info("%s %s %s %.2fms", method, path, status, duration_ms, extra=fields)
    else:
        log.info(
            "%s %s %s %.2fms account=%s requestId=%s",
            method,
            path,
            status,
            duration_ms,
            account,
            request_id,
            extra=fields,
        )

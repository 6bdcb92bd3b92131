"""Reaching an instance's inference worker: where it listens (`WorkerPort`, from the function
version), the address an adapter hands back for it (`WorkerEndpoint`), and what a call returns.

The invocation plane never builds a URL itself: it asks the instance's adapter for the endpoint
(backends/protocol.py: `BackendAdapter.endpoint`) and sends through it. Endpoints: plain HTTP
workers through a lean keep-alive HTTP/1.1 client (http1.py), HTTPS ones and the Kubernetes
API server's service proxy through httpx (`HttpxEndpoint`), the built-in simulated worker
in process (simulated/worker.py). Every endpoint sorts failures into two kinds:

- `WorkerUnreachable`: nothing reached the worker (connection refused, no endpoint behind the
  Service); the caller may send the same request to another instance;
- `WorkerFailed`: anything after that (reset mid-request, protocol error); never retried.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

#: headers that describe one connection, not the message (RFC 9110 §7.6.1); never forwarded
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

#: how long establishing a connection to a worker may take, in seconds
CONNECT_TIMEOUT = 10.0


class WorkerUnreachable(Exception):
    """Nothing was sent to the worker; `reason` says why (another instance may do)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerFailed(Exception):
    """The call failed after the request was (maybe partly) sent; `reason` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class WorkerPort:
    """Where a function's inference worker listens inside its instance namespace.

    `service` is the Service in front of it: `helmChartServiceName` for helm functions, the
    generated `entrypoint` for container functions (deployments/workload.py); `port` is the
    function's `inferencePort`. The health check is the function's `health` (uri and port).
    """

    service: str
    port: int
    inference_path: str = "/"
    health_path: str | None = None
    health_port: int | None = None


def connection_headers(headers: Sequence[tuple[str, str]]) -> frozenset[str]:
    """Hop-by-hop header names: the fixed set plus those a `Connection` header lists."""
    extra = [
        p.strip(" \t").lower()
        for name, value in headers
        if name.lower() == "connection"
        for p in value.split(",")
        if p.strip(" \t")
    ]
    return HOP_BY_HOP.union(extra) if extra else HOP_BY_HOP


def header_lines(headers: Sequence[tuple[str, str]], skip: Collection[str] = frozenset()) -> bytes:
    """HTTP header lines, each ending in CRLF; none whose lower-cased name is in `skip`."""
    return "".join(
        [f"{name}: {value}\r\n" for name, value in headers if name.lower() not in skip]
    ).encode("latin-1")


#: `HOP_BY_HOP` as bytes
HOP_BY_HOP_BYTES = frozenset(name.encode() for name in HOP_BY_HOP)


def connection_header_names(headers: Sequence[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """`connection_headers` of headers kept as bytes (names lower-cased). Both strip only
    HTTP's optional white space (space, tab), so the two forms name the same headers."""
    extra = [
        p.strip(b" \t").lower()
        for name, value in headers
        if name.lower() == b"connection"
        for p in value.split(b",")
        if p.strip(b" \t")
    ]
    return HOP_BY_HOP_BYTES.union(extra) if extra else HOP_BY_HOP_BYTES


class WorkerResponse:
    """A worker's answer: status and headers at once, the body as it arrives."""

    status: int
    headers: list[tuple[str, str]]

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers as bytes (as they came, for a client that keeps them so)."""
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]

    def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body chunks as they arrive (content encodings untouched); `WorkerFailed`."""
        raise NotImplementedError

    async def read(self, limit: int) -> bytes:
        """The whole body; `WorkerFailed` when it is larger than `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise WorkerFailed(f"the worker's response exceeds {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back (or close it when the body was not read to the end)."""
        return None

    def complete_body(self) -> bytes | None:
        """The whole body when it has already arrived (taken: the response is then read to
        its end), else None; never waits. A caller may then answer in one write."""
        return None


class WorkerEndpoint:
    """One instance's worker: `base_url` + a path is where requests go; `health_url` is its
    health check. `send` raises `WorkerUnreachable` (nothing sent) or `WorkerFailed`."""

    base_url: str
    health_url: str | None

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    async def send(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> WorkerResponse:
        """Send one request; the response's body is still to be read (`iter_bytes`/`read`)."""
        raise NotImplementedError

    async def health(self) -> int:
        """The status of a GET of the health endpoint."""
        raise NotImplementedError

    async def h2_url(self) -> str:
        """Where the worker takes HTTP/2 (gRPC) calls: `http://host:port` (h2c) or
        `https://host:port` (TLS); `WorkerUnreachable` when nowhere."""
        return self.base_url


class _HttpxResponse(WorkerResponse):
    def __init__(
        self, status: int, headers: list[tuple[str, str]], response: Any, failed: type[Exception]
    ) -> None:
        self.status = status
        self.headers = headers
        self._response = response
        self._errors = failed

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                if chunk:
                    yield chunk
        except self._errors as exc:
            raise WorkerFailed(_describe(exc, "reading the response")) from exc

    async def aclose(self) -> None:
        with contextlib.suppress(self._errors):
            await self._response.aclose()


class HttpxEndpoint(WorkerEndpoint):
    """A worker reached through an httpx-compatible async client (httpx, or lightkube's
    httpx2 for the API server's service proxy: `proxied`, whose own refusals are Status
    bodies). `unreachable` lists the client's exception types that mean nothing was sent,
    `failed` every exception type it raises."""

    def __init__(
        self,
        base_url: str,
        client: Any,
        *,
        health_url: str | None = None,
        unreachable: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout),
        failed: type[Exception] = httpx.HTTPError,
        proxied: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.health_url = health_url
        self._client = client
        self._unreachable = unreachable
        self._failed = failed
        self._proxied = proxied

    async def send(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> WorkerResponse:
        url = self.url(path)
        request = self._client.build_request(method, url, headers=list(headers), content=body)
        try:
            response = await self._client.send(request, stream=True)
        except self._unreachable as exc:
            raise WorkerUnreachable(_describe(exc, "connecting")) from exc
        except self._failed as exc:
            raise WorkerFailed(_describe(exc, "sending the request")) from exc
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
        if self._proxied and response.status_code in (404, 502, 503):
            refusal = await _proxy_refusal(response, self._failed)
            if refusal is not None:
                raise WorkerUnreachable(refusal)
            return _HttpxResponse(
                response.status_code, raw, _Replay(response.content), self._failed
            )
        return _HttpxResponse(response.status_code, raw, response, self._failed)

    async def h2_url(self) -> str:
        if self._proxied:
            raise WorkerUnreachable(
                "the Kubernetes API server's service proxy cannot carry gRPC (HTTP/2 with "
                "trailers): the cluster's workers must be reachable by cluster DNS"
            )
        return self.base_url

    async def health(self) -> int:
        if self.health_url is None:
            raise WorkerFailed("the function declares no health endpoint")
        try:
            response = await self._client.get(self.health_url)
        except self._unreachable as exc:
            raise WorkerUnreachable(_describe(exc, "connecting")) from exc
        except self._failed as exc:
            raise WorkerFailed(_describe(exc, "checking health")) from exc
        return int(response.status_code)


class _Replay:
    """A response body already read (a proxy answer inspected for a refusal)."""

    def __init__(self, content: bytes) -> None:
        self._content = content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield self._content

    async def aclose(self) -> None:
        return None


#: how the Kubernetes API server's proxy words "no pod took the connection" (or no Service)
_PROXY_REFUSALS = ("no endpoints available", "connection refused", 'services "')


async def _proxy_refusal(response: Any, failed: type[Exception]) -> str | None:
    """The API server's own message when its service proxy reached no worker, else None."""
    content_type = response.headers.get("content-type", "")
    try:
        await response.aread()
    except failed:
        return None
    if not content_type.startswith("application/json"):
        return None
    try:
        status = json.loads(response.content)
    except ValueError:
        return None
    if not isinstance(status, dict) or status.get("kind") != "Status":
        return None
    message = str(status.get("message") or "")
    if any(m in message.lower() for m in _PROXY_REFUSALS):
        return f"the Kubernetes API server's service proxy: {message}"
    return None


def _describe(exc: Exception, doing: str) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__} while {doing}" + (f": {text}" if text else "")


def network_client(max_connections: int = 1000) -> httpx.AsyncClient:
    """The client for workers reached over the network: pooled keep-alive connections, no
    read timeout (a request's own deadline bounds it) and no proxy from the environment."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=CONNECT_TIMEOUT, read=None, write=60.0, pool=None),
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        trust_env=False,
        follow_redirects=False,
    )


__all__ = [
    "HOP_BY_HOP",
    "HttpxEndpoint",
    "WorkerEndpoint",
    "WorkerFailed",
    "WorkerPort",
    "WorkerResponse",
    "WorkerUnreachable",
    "connection_headers",
    "network_client",
]

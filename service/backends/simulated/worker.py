"""The built-in simulated inference worker: what answers at a simulated instance's endpoint.

Served in process through an httpx transport (no socket), one per simulated cluster. Every
request to `http://<service>.<namespace>:<port>/<path>` of an instance the cluster runs is
answered with JSON

    {"echo": <request body, parsed when it is JSON, else text>, "path": "<path?query>",
     "instanceId": "<instance>", "headers": {<the NVCF-* request headers>}}

Request headers steer it: `X-Sim-Delay-Ms: N` answers after N ms, `X-Sim-Status: NNN` answers
with that status. `Accept: text/event-stream` answers with `X-Sim-Events` (default 3) server-sent
events, each `data: {"index": i, ...the echo...}`, `X-Sim-Delay-Ms` apart. A GET of the
function's health path answers `{"status": "ok"}`. An instance the cluster does not run (never
applied, or deleted) refuses the connection, as a real address with nobody listening would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

DELAY_HEADER = "x-sim-delay-ms"
STATUS_HEADER = "x-sim-status"
EVENTS_HEADER = "x-sim-events"
#: bounds of what a request may ask of the simulated worker
MAX_DELAY_MS = 3_600_000
MAX_EVENTS = 10_000
DEFAULT_EVENTS = 3


def _int_header(request: httpx.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.headers.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        return default
    return max(low, min(high, value))


def _echo_body(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", errors="replace")


class SimulatedWorkerTransport(httpx.AsyncBaseTransport):
    """Answers requests for the instances `running(namespace)` says the cluster runs.

    Hosts are `<service>.<namespace>`; `health_paths` maps a namespace to its health path.
    """

    def __init__(self, running: Callable[[str], bool]) -> None:
        self._running = running
        self.health_paths: dict[str, str] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        namespace = host.split(".", 1)[1] if "." in host else host
        if not self._running(namespace):
            raise httpx.ConnectError(
                f"connection refused: no simulated worker runs in namespace {namespace}",
                request=request,
            )
        content = await request.aread()
        path = request.url.raw_path.decode("ascii", errors="replace")
        health = self.health_paths.get(namespace)
        if request.method == "GET" and health is not None and request.url.path == health:
            return _json(200, {"status": "ok"})
        status = _int_header(request, STATUS_HEADER, 200, 100, 599)
        delay = _int_header(request, DELAY_HEADER, 0, 0, MAX_DELAY_MS) / 1000
        instance_id = namespace.removeprefix("sr-")
        echo = {
            "echo": _echo_body(content),
            "path": path,
            "instanceId": instance_id,
            "headers": {
                k.decode("latin-1"): v.decode("latin-1")
                for k, v in request.headers.raw
                if k.lower().startswith(b"nvcf-")
            },
        }
        if "text/event-stream" in request.headers.get("accept", ""):
            events = _int_header(request, EVENTS_HEADER, DEFAULT_EVENTS, 0, MAX_EVENTS)
            return httpx.Response(
                status,
                headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
                stream=_EventStream(echo, events, delay),
            )
        if delay:
            await asyncio.sleep(delay)
        return _json(status, echo)


def _json(status: int, body: Any) -> httpx.Response:
    data = json.dumps(body).encode()
    return httpx.Response(
        status,
        headers={"content-type": "application/json", "content-length": str(len(data))},
        stream=_Body(data),
    )


class _Body(httpx.AsyncByteStream):
    """A body read as a stream (httpx reads a plain `content=` body at once, and a stream can
    then not be read raw)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


class _EventStream(httpx.AsyncByteStream):
    def __init__(self, echo: dict[str, Any], events: int, delay: float) -> None:
        self._echo = echo
        self._events = events
        self._delay = delay

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index in range(self._events):
            if self._delay:
                await asyncio.sleep(self._delay)
            yield f"data: {json.dumps({'index': index, **self._echo})}\n\n".encode()


__all__ = ["DELAY_HEADER", "EVENTS_HEADER", "STATUS_HEADER", "SimulatedWorkerTransport"]

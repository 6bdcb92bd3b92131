"""The built-in simulated inference worker: what answers at a simulated instance's endpoint.

In process, with no socket and no HTTP client: the invocation plane's request is answered
directly. Every request to an instance the cluster runs is answered with JSON

    {"echo": <request body, parsed when it is JSON, else text>, "path": "<path?query>",
     "instanceId": "<instance>", "headers": {<the NVCF-* request headers, `traceparent`>},
     "secrets": [<names in the /var/secrets/secrets.json its pods mount, never values>]}

A POST to `/v1/chat/completions`, `/v1/responses` or `/v1/embeddings` (after any base path) is
answered by a tiny deterministic model in OpenAI's shapes, streamed when the body asks
(simulated/llm.py), with the instance in `X-Sim-Instance-Id`. Request headers steer it: `X-Sim-
Delay-Ms: N` answers after N ms (and puts N ms between streamed events), `X-Sim-Status: NNN`
answers with that status. `Accept: text/event-stream` answers with `X-Sim-Events` (default 3)
server-sent events, each `data: {"index": i, ...the echo...}`, `X-Sim-Delay-Ms` apart. A GET of
the function's health path answers `{"status": "ok"}`.

Like a container written for NVCF it uses the directories the invocation engine gives it
(docs/assets.md): with `NVCF-ASSET-DIR` the echo has `"assets": {<id>: {"size", "sha256"}}` of
the files there; `X-Sim-Output-Bytes: N` writes N bytes to `output.bin` in
`NVCF-LARGE-OUTPUT-DIR` (a large result); `X-Sim-Progress: 0,50,100` writes those percentages
to its `progress` file, `X-Sim-Delay-Ms` spread between them, before answering.

Every other request is logged (the worker's log, backends/simulated/logs.py) as served;
`X-Sim-Log: text` makes the worker print `text` first (as a careless worker might print a
secret). An instance the cluster does not run (never
applied, or deleted) refuses the connection, as a real address with nobody listening would; a
delayed answer whose instance is torn down meanwhile fails (the connection is reset).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from service.backends.simulated import llm
from service.backends.simulated.grpc_echo import GrpcEcho
from service.backends.worker import (
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
)
from service.core.kube import SECRETS_DIR, SECRETS_FILE
from service.health.observed import ObjectRef

DELAY_HEADER = "x-sim-delay-ms"
STATUS_HEADER = "x-sim-status"
EVENTS_HEADER = "x-sim-events"
LOG_HEADER = "x-sim-log"
#: echoed as a worker propagating W3C Trace Context would see it
_TRACED = frozenset({"traceparent", "tracestate"})
#: the instance that answered, on the tiny model's answers (which have no echo to say it)
INSTANCE_HEADER = "x-sim-instance-id"
OUTPUT_HEADER = "x-sim-output-bytes"
PROGRESS_HEADER = "x-sim-progress"
#: the most a request may ask the simulated worker to write
MAX_OUTPUT_BYTES = 1024 * 1024 * 1024
MAX_PROGRESS_STEPS = 100
#: bounds of what a request may ask of the simulated worker
MAX_DELAY_MS = 3_600_000
MAX_EVENTS = 10_000
DEFAULT_EVENTS = 3

TORN_DOWN = "connection reset: the simulated instance was torn down mid-request"


def _int_header(headers: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = headers.get(name)
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


class _Pod(Protocol):
    spec: dict[str, Any]


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _secret_file(volume: Mapping[str, Any]) -> tuple[str, str] | None:
    """(Secret name, key) that a secret volume shows as `secrets.json`, if any."""
    source = _map(volume.get("secret"))
    name = source.get("secretName")
    if not isinstance(name, str):
        return None
    items = _list(source.get("items"))
    if not items:
        return name, SECRETS_FILE
    for item in items:
        if _map(item).get("path") == SECRETS_FILE and isinstance(_map(item).get("key"), str):
            return name, str(item["key"])
    return None


def mounted_secret_names(
    objects: Mapping[ObjectRef, Mapping[str, Any]], pods: Iterable[_Pod]
) -> list[str]:
    """The names in the `secrets.json` the pods mount at /var/secrets (from the Secret of
    the namespace the volume names), sorted; never the values."""
    names: set[str] = set()
    for pod in pods:
        volumes = {str(v.get("name")): v for v in map(_map, _list(pod.spec.get("volumes")))}
        containers = [
            *_list(pod.spec.get("containers")),
            *_list(pod.spec.get("initContainers")),
        ]
        for container in containers:
            for mount in map(_map, _list(_map(container).get("volumeMounts"))):
                if str(mount.get("mountPath", "")).rstrip("/") != SECRETS_DIR:
                    continue
                found = _secret_file(volumes.get(str(mount.get("name")), {}))
                if found is None:
                    continue
                secret = objects.get(ObjectRef("Secret", found[0]), {})
                raw = _map(secret.get("data")).get(found[1])
                try:
                    content = json.loads(base64.b64decode(str(raw), validate=True))
                except (binascii.Error, ValueError):
                    continue
                if isinstance(content, dict):
                    names.update(str(k) for k in content)
    return sorted(names)


class _Answer(WorkerResponse):
    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self._body = body

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body


class _Events(WorkerResponse):
    def __init__(self, status: int, echo: dict[str, Any], events: int, delay: float) -> None:
        self.status = status
        self.headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        self._echo = echo
        self._events = events
        self._delay = delay

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        for index in range(self._events):
            if self._delay:
                await asyncio.sleep(self._delay)
            yield f"data: {json.dumps({'index': index, **self._echo})}\n\n".encode()


class _LlmEvents(WorkerResponse):
    """A streamed OpenAI answer of the tiny model (simulated/llm.py), `delay` between
    events."""

    def __init__(self, events: Iterable[bytes], delay: float) -> None:
        self.status = 200
        self.headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        self._events = events
        self._delay = delay

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        for index, event in enumerate(self._events):
            if self._delay and index:
                await asyncio.sleep(self._delay)
            yield event


def _llm_answer(path: str, body: bytes, delay: float) -> WorkerResponse | None:
    """The tiny model's answer to an OpenAI route (None for any other path)."""
    route = next((p for p in llm.PATHS if path.split("?", 1)[0].endswith(p)), None)
    if route is None:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        return _json(400, llm.error_body("the body must be a JSON object"))
    whole, events = llm.answer(route, request)
    if events is not None:
        return _LlmEvents(events, delay)
    return _json(200, whole)


def _json(status: int, body: Any) -> _Answer:
    data = json.dumps(body).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    return _Answer(status, headers, data)


def _asset_report(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file of the asset directory."""
    report: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        return report
    for path in sorted(folder.iterdir()):
        digest = hashlib.sha256()
        size = 0
        with path.open("rb") as fh:
            while chunk := fh.read(1024 * 1024):
                digest.update(chunk)
                size += len(chunk)
        report[path.name] = {"size": size, "sha256": digest.hexdigest()}
    return report


def _progress_steps(raw: str | None) -> list[int]:
    steps: list[int] = []
    for part in (raw or "").split(",")[:MAX_PROGRESS_STEPS]:
        if part.strip().isdigit() and int(part) <= 100:
            steps.append(int(part))
    return steps


def _write_progress(folder: Path, request_id: str, percent: int) -> None:
    """The progress file as NVCF's worker utilities read it, replaced whole."""
    report = {"id": request_id, "progress": percent, "partialResponse": {"percent": percent}}
    tmp = folder / ".progress.tmp"
    tmp.write_text(json.dumps(report))
    os.replace(tmp, folder / "progress")


def _write_output(path: Path, size: int) -> None:
    block = hashlib.sha256(str(size).encode()).digest() * 2048  # 64 KiB
    with path.open("wb") as fh:
        left = size
        while left > 0:
            fh.write(block[: min(left, len(block))])
            left -= len(block)


class SimulatedWorkers:
    """The workers of one simulated cluster: those of the namespaces `running` accepts."""

    def __init__(
        self,
        running: Callable[[str], bool],
        secrets: Callable[[str], list[str]] = lambda _namespace: [],
        printer: Callable[[str, str], None] | None = None,
    ) -> None:
        self._running = running
        self._secrets = secrets
        #: (namespace, text): what the worker prints to its log
        self._print = printer or (lambda _namespace, _text: None)
        self.health_paths: dict[str, str] = {}
        #: the gRPC functions' worker, shared by every instance
        self.grpc_echo = GrpcEcho()
        #: per namespace, the requests taking their time (done when it is torn down)
        self._working: dict[str, set[asyncio.Future[None]]] = {}

    async def _work(self, namespace: str, seconds: float) -> None:
        """Take `seconds` answering, as a pod does: cut short when the instance is torn down
        (its pod killed: the connection reset at once, not when the work would have ended)."""
        torn = asyncio.get_running_loop().create_future()
        working = self._working.setdefault(namespace, set())
        working.add(torn)
        try:
            done, _ = await asyncio.wait((torn,), timeout=seconds)
        finally:
            working.discard(torn)
            if not working and self._working.get(namespace) is working:
                del self._working[namespace]
        if done:
            raise WorkerFailed(TORN_DOWN)

    def torn_down(self, namespace: str) -> None:
        """The instance of `namespace` is gone: requests it was working on fail at once."""
        for torn in self._working.pop(namespace, ()):
            if not torn.done():
                torn.set_result(None)

    def check_running(self, namespace: str) -> None:
        """`WorkerUnreachable` unless the cluster runs a worker in `namespace`."""
        if not self._running(namespace):
            raise WorkerUnreachable(
                f"connection refused: no simulated worker runs in namespace {namespace}"
            )

    async def answer(
        self,
        namespace: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> WorkerResponse:
        self.check_running(namespace)
        lowered = {k.lower(): v for k, v in headers}
        health = self.health_paths.get(namespace)
        if method == "GET" and health is not None and path.split("?", 1)[0] == health:
            return _json(200, {"status": "ok"})
        status = _int_header(lowered, STATUS_HEADER, 200, 100, 599)
        if LOG_HEADER in lowered:
            self._print(namespace, lowered[LOG_HEADER])
        request_id = lowered.get("nvcf-reqid", "-")
        delay = _int_header(lowered, DELAY_HEADER, 0, 0, MAX_DELAY_MS) / 1000
        echo = {
            "echo": _echo_body(body),
            "path": path,
            "instanceId": namespace.removeprefix("sr-"),
            "headers": {
                k: v for k, v in headers if k.lower().startswith("nvcf-") or k.lower() in _TRACED
            },
            "secrets": self._secrets(namespace),
        }
        if method == "POST" and status == 200:
            model = _llm_answer(path, body, delay)
            if model is not None:
                self._print(namespace, f'INFO     "{method} {path}" 200 (model) {request_id}')
                model.headers.append((INSTANCE_HEADER, namespace.removeprefix("sr-")))
                return model
        asset_dir = lowered.get("nvcf-asset-dir")
        if asset_dir:
            echo["assets"] = await asyncio.to_thread(_asset_report, Path(asset_dir))
        out = lowered.get("nvcf-large-output-dir")
        if "text/event-stream" in lowered.get("accept", ""):
            events = _int_header(lowered, EVENTS_HEADER, DEFAULT_EVENTS, 0, MAX_EVENTS)
            self._print(namespace, f'INFO     "{method} {path}" {status} (stream) {request_id}')
            return _Events(status, echo, events, delay)
        steps = _progress_steps(lowered.get(PROGRESS_HEADER)) if out else []
        for percent in steps:
            await asyncio.to_thread(_write_progress, Path(out or ""), request_id, percent)
            await asyncio.sleep(delay / len(steps))
        if delay and not steps:
            await self._work(namespace, delay)
        if delay and not self._running(namespace):
            raise WorkerFailed(TORN_DOWN)
        size = _int_header(lowered, OUTPUT_HEADER, 0, 0, MAX_OUTPUT_BYTES)
        if size and out:
            await asyncio.to_thread(_write_output, Path(out) / "output.bin", size)
        self._print(namespace, f'INFO     "{method} {path}" {status} {request_id}')
        return _json(status, echo)


class SimulatedEndpoint(WorkerEndpoint):
    """One simulated instance's worker (`base_url` names it as a Service address would)."""

    def __init__(
        self,
        workers: SimulatedWorkers,
        namespace: str,
        base_url: str,
        health_url: str | None = None,
        health_path: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.health_url = health_url
        self._workers = workers
        self._namespace = namespace
        self._health_path = health_path

    async def send(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> WorkerResponse:
        return await self._workers.answer(self._namespace, method, path, headers, body)

    async def health(self) -> int:
        response = await self._workers.answer(
            self._namespace, "GET", self._health_path or "/", [], b""
        )
        return response.status

    async def h2_url(self) -> str:
        """The cluster's gRPC echo (simulated/grpc_echo.py), for an instance it runs."""
        self._workers.check_running(self._namespace)
        return await self._workers.grpc_echo.url()


__all__ = [
    "DELAY_HEADER",
    "EVENTS_HEADER",
    "INSTANCE_HEADER",
    "LOG_HEADER",
    "OUTPUT_HEADER",
    "PROGRESS_HEADER",
    "STATUS_HEADER",
    "SimulatedEndpoint",
    "SimulatedWorkers",
    "mounted_secret_names",
]

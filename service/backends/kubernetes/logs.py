"""Reading an instance's logs from a real cluster: the pods' `log` subresource.

For each pod of the instance namespace and each of its containers (init containers first),
`GET /api/v1/namespaces/<ns>/pods/<pod>/log` with `container`, `previous`, `follow`,
`tailLines`, `sinceSeconds`, `timestamps` and `limitBytes`, sent by lightkube's HTTP client
(configured from the adapter's kubeconfig). lightkube's `AsyncClient.log` cannot ask for
`previous` nor `limitBytes` and reads a non-followed log whole; here every log is streamed,
each line bounded as it arrives (logs.lines_of). Several containers are read at once and
interleaved as their lines arrive.

When several containers are read, one that has not started yet (or has no previous run, for
`previous`) is skipped, as `kubectl logs --all-containers` does; read alone, the API server's
own 400 is the answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx2

from service.backends.logs import LogLine, LogRequest, lines_of, merge
from service.backends.protocol import AdapterError

Pods = Callable[[], Awaitable[list[dict[str, Any]]]]
#: (the exception, what was being done) -> the adapter's error
Translate = Callable[[Exception, str], AdapterError]


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def containers_of(pod: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(name, restart count) of the pod's init containers then its containers."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    restarts = {
        str(_map(s).get("name")): int(_map(s).get("restartCount") or 0)
        for key in ("initContainerStatuses", "containerStatuses")
        for s in _list(status.get(key))
    }
    return [
        (name, restarts.get(name, 0))
        for key in ("initContainers", "containers")
        for c in _list(spec.get(key))
        if (name := str(_map(c).get("name", "")))
    ]


def _params(container: str, request: LogRequest) -> dict[str, str]:
    params = {"container": container}
    if request.previous:
        params["previous"] = "true"
    if request.follow:
        params["follow"] = "true"
    if request.timestamps:
        params["timestamps"] = "true"
    if request.tail_lines is not None:
        params["tailLines"] = str(request.tail_lines)
    if request.since_seconds is not None:
        params["sinceSeconds"] = str(request.since_seconds)
    if request.limit_bytes is not None:
        params["limitBytes"] = str(request.limit_bytes)
    return params


def _status_message(code: int, body: bytes) -> str:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else f"{code} {body[:300].decode(errors='replace')}"


class KubeLogReader:
    """The log of one instance namespace, read through `client` (the API server's base URL)."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        pods: Pods,
        translate: Translate,
        *,
        timeout: float,
    ) -> None:
        self._client = client
        self._pods = pods
        self._translate = translate
        self._timeout = timeout

    async def read(self, namespace: str, request: LogRequest) -> AsyncIterator[LogLine]:
        pods = sorted(
            await self._pods(), key=lambda p: str(_map(p.get("metadata")).get("name", ""))
        )
        chosen: list[tuple[str, str]] = []
        for pod in pods:
            name = str(_map(pod.get("metadata")).get("name", ""))
            for container, restarts in containers_of(pod):
                if request.container is not None and container != request.container:
                    continue
                if request.previous and restarts == 0 and request.container is None:
                    continue  # never restarted: it has no previous run
                chosen.append((name, container))
        if request.container is not None and not chosen and pods:
            raise AdapterError(
                f'container "{request.container}" is not valid for the pods of this instance',
                retryable=False,
                status=400,
            )
        alone = len(chosen) == 1
        streams = [self._stream(namespace, p, c, request, alone=alone) for p, c in chosen]
        async for line in merge(streams):
            yield line

    async def _stream(
        self, namespace: str, pod: str, container: str, request: LogRequest, *, alone: bool
    ) -> AsyncIterator[LogLine]:
        what = f"reading the log of container {container} of pod {pod}"
        timeout = httpx2.Timeout(self._timeout, read=None if request.follow else self._timeout)
        try:
            async with self._client.stream(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                params=_params(container, request),
                timeout=timeout,
            ) as response:
                if response.status_code >= 400:
                    code = response.status_code
                    message = _status_message(code, await response.aread())
                    if code in (400, 404) and not alone:
                        return  # not started, no previous run, or gone meanwhile: skipped
                    raise AdapterError(message, retryable=code >= 500, status=code)
                async for raw in lines_of(response.aiter_bytes()):
                    stamp, text = "", raw
                    if request.timestamps:
                        stamp, _, text = raw.partition(" ")
                    yield LogLine(pod, container, text, stamp)
        except AdapterError:
            raise
        except httpx2.HTTPError as exc:
            raise self._translate(exc, what) from exc


__all__ = ["KubeLogReader", "containers_of"]

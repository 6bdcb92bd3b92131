"""A task's files on Kubernetes (the `TaskFiles` capability, docs/kubernetes.md §7): read from
the worker-utils sidecar of the task's pod (worker_utils_pod.py) through the API server's pod
proxy (`/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/...`, with the adapter's credentials).

A result comes as a tar stream, written to a file in the destination, bounded in bytes before
it is unpacked, then unpacked with the standard library's `data` filter (no absolute paths, no
`..`, no links, no special files) after its members were counted against the bounds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx2

from service.backends.kubernetes.api import KubeApi
from service.backends.kubernetes.capacity import as_map
from service.backends.kubernetes.kinds import JOB, POD
from service.backends.protocol import AdapterError, InstanceSpec
from service.backends.worker_utils_pod import (
    CONTAINER_NAME,
    PORT_NAME,
    PROGRESS_PATH,
    RELEASE_PATH,
    RESULT_NAME,
    RESULT_NAME_MAX,
    RESULT_NAME_RULE,
    RESULTS_PATH,
    RESULTS_PREFIX,
)

#: what a tar stream adds to its files' bytes: a header per member (PAX headers for long
#: names), and the closing blocks with the padding of the last record (`RECORDSIZE`)
_TAR_OVERHEAD = 4 * tarfile.BLOCKSIZE
#: what is read of an answer that is not the file asked for (a refusal's JSON)
_ANSWER_BYTES = 16 * 1024
_CHUNK = 1024 * 1024


def _refused(message: str) -> AdapterError:
    return AdapterError(message, retryable=False)


def sidecar_port(pod_spec: dict[str, Any]) -> int | None:
    """The port of the worker-utils sidecar of a pod (spec), when it has one."""
    for container in pod_spec.get("initContainers") or []:
        container = as_map(container)
        if container.get("name") != CONTAINER_NAME:
            continue
        for port in container.get("ports") or []:
            port = as_map(port)
            if port.get("name") == PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def _sidecar_running(pod: dict[str, Any]) -> bool:
    for status in as_map(pod.get("status")).get("initContainerStatuses") or []:
        status = as_map(status)
        if status.get("name") == CONTAINER_NAME:
            return "running" in as_map(status.get("state"))
    return False


class TaskFilesReader:
    """Reads a task's progress file and results from its pod's sidecar."""

    def __init__(
        self,
        api: KubeApi,
        client: Callable[[], httpx2.AsyncClient],
        *,
        timeout: float,
        result_timeout: float,
    ) -> None:
        self.api = api
        self.client = client
        self.timeout = timeout
        self.result_timeout = result_timeout

    async def sidecar(self, instance: InstanceSpec, *, stopping: bool = False) -> str | None:
        """The pod proxy URL of the running sidecar of the task's pod (with `stopping`, of a
        pod being deleted too); None while there is none (an AdapterError when the task's
        pods and Jobs have no sidecar at all)."""
        pods = await self.api.list_objects(POD, instance.namespace)
        pods.sort(key=lambda p: str(as_map(p.get("metadata")).get("creationTimestamp", "")))
        for pod in pods:
            port = sidecar_port(as_map(pod.get("spec")))
            metadata = as_map(pod.get("metadata"))
            deleted = bool(metadata.get("deletionTimestamp")) and not stopping
            if port is None or deleted or not _sidecar_running(pod):
                continue
            server = str(self.client().base_url).rstrip("/")
            return (
                f"{server}/api/v1/namespaces/{instance.namespace}/pods/"
                f"{metadata.get('name')}:{port}/proxy"
            )
        jobs = await self.api.list_objects(JOB, instance.namespace)
        specs = [as_map(p.get("spec")) for p in pods] + [
            as_map(as_map(as_map(j.get("spec")).get("template")).get("spec")) for j in jobs
        ]
        if specs and all(sidecar_port(spec) is None for spec in specs):
            raise _refused(
                f"the pods of task {instance.instance_id} have no worker-utils sidecar "
                "(NVCF_WORKER_UTILS_IMAGE empty, or no container names NVCT_PROGRESS_FILE_PATH "
                "and NVCT_RESULTS_DIR): its files cannot be read"
            )
        return None

    async def progress(self, instance: InstanceSpec, max_bytes: int) -> bytes | None:
        base = await self.sidecar(instance)
        if base is None:
            return None
        url = f"{base}{PROGRESS_PATH}"
        what = f"reading the progress file of task {instance.instance_id}"
        try:
            async with asyncio.timeout(self.timeout):
                async with self.client().stream(
                    "GET", url, params={"maxBytes": max_bytes}
                ) as response:
                    body = await _bounded(response, max_bytes + _ANSWER_BYTES)
        except TimeoutError:
            raise AdapterError(f"{what}: no answer within {self.timeout:g} s") from None
        except httpx2.HTTPError as exc:
            raise self.api.failure(exc, what) from exc
        if response.status_code == 204:
            return None
        if response.status_code == 200 and len(body) <= max_bytes:
            return body
        raise _answer(response.status_code, body, what)

    async def result_names(self, instance: InstanceSpec, max_names: int) -> list[str]:
        """The result directories the sidecar lists, oldest first; none while no pod runs."""
        base = await self.sidecar(instance)
        if base is None:
            return []
        what = f"listing the results of task {instance.instance_id}"
        # a JSON list of names of at most RESULT_NAME_MAX characters each
        limit = max_names * (RESULT_NAME_MAX + 4) + 2
        try:
            async with asyncio.timeout(self.timeout):
                async with self.client().stream(
                    "GET", f"{base}{RESULTS_PATH}", params={"maxNames": max_names}
                ) as response:
                    body = await _bounded(response, max(limit, _ANSWER_BYTES) + 1)
        except TimeoutError:
            raise AdapterError(f"{what}: no answer within {self.timeout:g} s") from None
        except httpx2.HTTPError as exc:
            raise self.api.failure(exc, what) from exc
        if response.status_code != 200:
            raise _answer(response.status_code, body, what)
        try:
            names = json.loads(body) if len(body) <= limit else None
        except ValueError:
            names = None
        if (
            not isinstance(names, list)
            or len(names) > max_names
            or not all(isinstance(n, str) and RESULT_NAME.fullmatch(n) for n in names)
        ):
            raise _refused(
                f"{what}: the sidecar's answer is not a list of at most {max_names} result names"
            )
        return names

    async def fetch(
        self, instance: InstanceSpec, name: str, into: Path, max_bytes: int, max_files: int
    ) -> None:
        what = f"fetching result {name!r} of task {instance.instance_id}"
        if not RESULT_NAME.fullmatch(name):
            raise _refused(f"{what}: the name is not a result's name ({RESULT_NAME_RULE})")
        base = await self.sidecar(instance)
        if base is None:
            raise AdapterError(f"{what}: the task's pod is not running")
        url = f"{base}{RESULTS_PREFIX}{quote(name, safe='')}"
        params = {"maxBytes": max_bytes, "maxFiles": max_files}
        limit = max_bytes + (max_files + 1) * _TAR_OVERHEAD + tarfile.RECORDSIZE
        try:
            archive = await anyio.to_thread.run_sync(_scratch, into)
        except OSError as exc:
            raise _refused(f"{what}: cannot write into {into}: {exc}") from exc
        try:
            async with asyncio.timeout(self.result_timeout):
                async with self.client().stream("GET", url, params=params) as response:
                    if response.status_code != 200:
                        body = await _bounded(response, _ANSWER_BYTES)
                        raise _answer(response.status_code, body, what)
                    size = 0
                    async with await anyio.open_file(archive, "wb") as fh:
                        async for chunk in response.aiter_bytes(_CHUNK):
                            size += len(chunk)
                            if size > limit:
                                raise _refused(f"{what}: the stream passes {limit} bytes")
                            await fh.write(chunk)
            await anyio.to_thread.run_sync(
                _unpack, archive, into, name, (max_bytes, max_files), what
            )
        except TimeoutError:
            raise AdapterError(f"{what}: not complete within {self.result_timeout:g} s") from None
        except httpx2.HTTPError as exc:
            raise self.api.failure(exc, what) from exc
        except OSError as exc:  # writing the stream (e.g. the disk is full)
            raise AdapterError(f"{what}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(archive)

    async def release(self, instance: InstanceSpec) -> None:
        """Tell the sidecar the platform needs the files no more, so that its pod stops
        without lingering (best effort: the pod goes anyway, at the latest when its `preStop`
        hook's linger or the pod's grace period ends)."""
        with contextlib.suppress(AdapterError, httpx2.HTTPError, TimeoutError):
            base = await self.sidecar(instance, stopping=True)
            if base is not None:
                async with asyncio.timeout(self.timeout):
                    await self.client().post(f"{base}{RELEASE_PATH}")


async def _bounded(response: httpx2.Response, limit: int) -> bytes:
    """The answer's body, at most `limit` bytes of it (more are not read)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: limit - len(body)]
        if len(body) >= limit:
            break
    return bytes(body)


def _answer(code: int, body: bytes, what: str) -> AdapterError:
    """The sidecar's refusal (`detail`) or the API server's (a Status `message`), as worded."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    detail = data.get("detail") or data.get("message") if isinstance(data, dict) else None
    if not isinstance(detail, str) or not detail:
        detail = body.decode("utf-8", "replace").strip()[:500] or "(no body)"
    return AdapterError(
        f"{what}: {code} {detail}", retryable=code >= 500 or code in (404, 408, 429), status=code
    )


def _scratch(into: Path) -> Path:
    """A new file beside `into` (made) for the stream: never one of the result's names."""
    into.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".nvct-result-", suffix=".tar", dir=into.parent)
    os.close(fd)
    return Path(name)


def _unpack(archive: Path, into: Path, name: str, bounds: tuple[int, int], what: str) -> None:
    max_bytes, max_files = bounds
    try:
        with tarfile.open(archive, mode="r:") as tar:
            members = tar.getmembers()
            files = [m for m in members if m.isfile()]
            if len(files) > max_files:
                raise _refused(f"{what}: more than {max_files} files")
            if sum(m.size for m in files) > max_bytes:
                raise _refused(f"{what}: more than {max_bytes} bytes")
            for member in members:
                # the sidecar sends `<name>/...`: the result's own directory is the root here
                if member.name != name and not member.name.startswith(f"{name}/"):
                    raise _refused(f"{what}: the stream holds {member.name!r}, not in {name!r}")
                member.name = member.name.removeprefix(f"{name}/") if member.name != name else "."
            tar.extractall(into, members=[m for m in members if m.name != "."], filter="data")
    except tarfile.FilterError as exc:
        raise _refused(f"{what}: the stream holds a member the platform refuses: {exc}") from exc
    except (tarfile.TarError, OSError) as exc:
        raise AdapterError(f"{what}: the result's stream is not a whole tar: {exc}") from exc

"""`nvcf-server worker-utils`: the sidecar beside a worker the server cannot reach the files
of (a Kubernetes pod, docs/kubernetes.md §6), doing there what the engine does in process for
a worker on the server's machine, with the same functions (files.py, results.py) — only the
transport differs: assets come through signed download URLs, a large result goes to a signed
upload URL, progress is asked for over HTTP.

It listens on the port the pod's Service targets and forwards every request to the worker on
`127.0.0.1:<worker port>`. The platform speaks to it in three headers (never passed on):

- `NVCF-WORKER-UTILS` (request): base64url JSON `{"requestId", "assets": {id: url},
  "upload": url}`. The sidecar fetches each asset into `<mount>/assets/<requestId>/<id>`,
  makes `<mount>/output/<requestId>`, and forwards with `NVCF-ASSET-DIR`,
  `NVCF-LARGE-OUTPUT-DIR` and `NVCF-FUNCTION-ASSET-IDS`. A large answer (NVCF's rule: an
  output file, or a body over `NVCF-MAX-RESPONSE-SIZE-BYTES`) is zipped and PUT to `upload`;
  the directories are removed when the request is over.
- `NVCF-WORKER-UTILS-RESULT` (answer, on every answer to a request carrying the first):
  `passed` (the worker's answer as it came), `stored` (302, the large result was uploaded) or
  `refused` (the status and a JSON `{"detail"}` saying why: an asset could not be fetched, the
  result passes a bound, the upload failed).
- `NVCF-WORKER-UTILS-PROGRESS: <requestId>` (request): answered by the sidecar itself, 200 with
  the request's `progress` file as it is (NVCF's format), or 204 when there is none.

A request without these is forwarded as it is. Bounds: asset and result bytes, result files,
the request body, the header, and the time of each fetch and upload.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from service.assets.files import (
    PROGRESS_MAX_BYTES,
    RequestFiles,
    TooManyOutputs,
    progress_bytes,
)
from service.assets.results import ResultTooLarge, zipped_result
from service.assets.storage import MissingObject
from service.backends.http1 import Http1Endpoint, Http1Pool
from service.backends.worker import (
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
    connection_headers,
)
from service.backends.worker_utils_pod import DEFAULT_PORT, FILES_MOUNT
from service.core.errors import DomainError

log = logging.getLogger("nvcf.worker_utils")

CONTROL_HEADER = "NVCF-WORKER-UTILS"
RESULT_HEADER = "NVCF-WORKER-UTILS-RESULT"
PROGRESS_HEADER = "NVCF-WORKER-UTILS-PROGRESS"
MAX_SIZE_HEADER = "NVCF-MAX-RESPONSE-SIZE-BYTES"
PASSED, STORED, REFUSED = "passed", "stored", "refused"
#: the longest control header taken (32 signed URLs of a few hundred bytes each fit)
MAX_CONTROL_BYTES = 192 * 1024
#: headers a caller or a worker never passes through the sidecar
_OWN = frozenset(
    {
        CONTROL_HEADER.lower(),
        RESULT_HEADER.lower(),
        PROGRESS_HEADER.lower(),
        "nvcf-asset-dir",
        "nvcf-large-output-dir",
        "nvcf-function-asset-ids",
    }
)
_CHUNK = 1024 * 1024
#: the per-request directories are the worker's too, and it may run as another user: only
#: the pod's two containers mount the volume
SHARED_MODE = 0o777

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BadControl(ValueError):
    """The control header is not what the platform sends."""


@dataclass(frozen=True)
class Instructions:
    """What the platform asks of the sidecar for one request (the control header)."""

    request_id: uuid.UUID
    assets: dict[uuid.UUID, str]
    upload: str

    def encode(self) -> str:
        data = {
            "requestId": str(self.request_id),
            "assets": {str(k): v for k, v in self.assets.items()},
            "upload": self.upload,
        }
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, value: str, max_assets: int) -> Instructions:
        if len(value) > MAX_CONTROL_BYTES:
            raise BadControl(f"the {CONTROL_HEADER} header passes {MAX_CONTROL_BYTES} bytes")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            data = json.loads(raw)
        except (ValueError, binascii.Error):
            raise BadControl(f"the {CONTROL_HEADER} header is not base64url JSON") from None
        if not isinstance(data, dict):
            raise BadControl(f"the {CONTROL_HEADER} header is not a JSON object")
        assets, upload = data.get("assets"), data.get("upload")
        if not isinstance(assets, dict) or len(assets) > max_assets:
            raise BadControl(f"the {CONTROL_HEADER} header's assets: at most {max_assets}")
        urls = [upload, *assets.values()]
        if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise BadControl(f"the {CONTROL_HEADER} header's URLs must be http(s) URLs")
        try:
            return cls(
                uuid.UUID(str(data.get("requestId"))),
                {uuid.UUID(str(k)): str(v) for k, v in assets.items()},
                str(upload),
            )
        except ValueError:
            raise BadControl(f"the {CONTROL_HEADER} header's ids must be UUIDs") from None


@dataclass(frozen=True)
class Limits:
    max_asset_bytes: int
    max_result_bytes: int
    max_result_files: int
    #: seconds one asset fetch or one result upload may take
    timeout: float
    #: seconds the worker may take to start its answer
    worker_timeout: float = 3600.0
    max_assets: int = 1000
    max_body_bytes: int = 1024 * 1024 * 1024


class WorkerUtils:
    """The sidecar's ASGI application."""

    def __init__(self, worker_url: str, mount: Path, limits: Limits) -> None:
        self.mount = mount
        self.limits = limits
        self._pool = Http1Pool()
        self.worker = Http1Endpoint(worker_url, self._pool)
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """For the signed URLs (the object store, or the server's own `/storage`)."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.limits.timeout, connect=10.0),
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    async def start(self) -> None:
        """What a crashed run left is removed (the emptyDir outlives a container restart)."""
        for sub in ("assets", "output", "results"):
            await anyio.to_thread.run_sync(shutil.rmtree, self.mount / sub, True)

    async def aclose(self) -> None:
        await self._pool.aclose()
        if self._client is not None:
            await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        lowered = {k.lower(): v for k, v in headers}
        if PROGRESS_HEADER.lower() in lowered:
            await self._progress(lowered[PROGRESS_HEADER.lower()], send)
            return
        control = lowered.get(CONTROL_HEADER.lower())
        try:
            body = await _body(receive, self.limits.max_body_bytes)
        except _TooLarge:
            await _refuse(send, 413, f"the request body passes {self.limits.max_body_bytes} bytes")
            return
        path = scope.get("raw_path") or scope["path"].encode()
        target = path.decode("latin-1") + (
            "?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else ""
        )
        hop = connection_headers(headers)
        forward = [(k, v) for k, v in headers if k.lower() not in _OWN | hop | {"host"}]
        if control is None:
            await self._pass(scope["method"], target, forward, body, send, None)
            return
        try:
            ins = Instructions.decode(control, self.limits.max_assets)
        except BadControl as exc:
            await _refuse(send, 400, str(exc))
            return
        try:
            files = await RequestFiles.fetched(
                self._fetcher(ins), self.mount, ins.request_id, list(ins.assets), mode=SHARED_MODE
            )
        except DomainError as exc:
            await _refuse(send, exc.status, exc.detail or exc.title)
            return
        except OSError as exc:  # e.g. the directories of a request with the same id remain
            await _refuse(send, 503, f"the request's directories could not be made: {exc}")
            return
        try:
            await self._pass(
                scope["method"], target, forward + files.worker_headers(), body, send, (ins, files)
            )
        finally:
            await files.remove()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _progress(self, raw_id: str, send: Send) -> None:
        try:
            request_id = uuid.UUID(raw_id.strip())
        except ValueError:
            await _refuse(send, 400, f"{PROGRESS_HEADER} must be a request id")
            return
        folder = self.mount / "output" / str(request_id)
        raw = await anyio.to_thread.run_sync(progress_bytes, folder)
        if raw is None or len(raw) > PROGRESS_MAX_BYTES:
            await _answer(send, 204, [], b"")
        else:
            await _answer(send, 200, [(b"content-type", b"application/json")], raw)

    def _fetcher(self, ins: Instructions) -> Callable[[uuid.UUID, Path], Awaitable[None]]:
        limit = self.limits.max_asset_bytes

        async def fetch(asset_id: uuid.UUID, dest: Path) -> None:
            with anyio.fail_after(self.limits.timeout):
                async with self.client.stream("GET", ins.assets[asset_id]) as response:
                    if response.status_code == 404:
                        raise MissingObject(str(asset_id))
                    if response.status_code != 200:
                        raise OSError(f"HTTP {response.status_code} fetching asset {asset_id}")
                    size = 0
                    async with await anyio.open_file(dest, "xb") as fh:
                        async for chunk in response.aiter_bytes(_CHUNK):
                            size += len(chunk)
                            if size > limit:
                                raise OSError(f"asset {asset_id} passes {limit} bytes")
                            await fh.write(chunk)

        return fetch

    async def _pass(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
        send: Send,
        request: tuple[Instructions, RequestFiles] | None,
    ) -> None:
        try:
            with anyio.fail_after(self.limits.worker_timeout):
                response = await self.worker.send(method, target, headers, body)
        except TimeoutError:
            detail = f"the worker did not answer within {self.limits.worker_timeout:g} s"
            if request is None:
                await _answer(send, 504, [], detail.encode())
            else:
                await _refuse(send, 504, detail)
            return
        except (WorkerUnreachable, WorkerFailed) as exc:
            if request is None:
                await _answer(send, 502, [], f"the worker failed: {exc.reason}".encode())
            else:
                await _refuse(send, 502, f"the worker failed: {exc.reason}")
            return
        try:
            if request is not None and response.status < 400:
                ins, files = request
                try:
                    large = await self._large(headers, response, files)
                except TooManyOutputs as exc:
                    await _refuse(send, 502, f"the worker's large result was refused: {exc}")
                    return
                if large:
                    await self._store(ins, files, response, send)
                    return
            await self._stream(response, send, None if request is None else PASSED)
        finally:
            await response.aclose()

    async def _large(
        self, headers: list[tuple[str, str]], response: WorkerResponse, files: RequestFiles
    ) -> bool:
        """NVCF's rule (the engine's for a local worker): whether the answer is a large
        result (output files, or a body known to pass the request's max size); raises
        TooManyOutputs. A body of unknown length flows on: the engine bounds it."""
        max_size = self.limits.max_result_bytes
        for k, v in headers:
            if k.lower() == MAX_SIZE_HEADER.lower() and v.strip().isdigit():
                max_size = min(max_size, int(v))
        outputs = await files.outputs(self.limits.max_result_files, self.limits.max_result_bytes)
        length = next(
            (int(v) for k, v in response.headers if k.lower() == "content-length" and v.isdigit()),
            None,
        )
        return bool(outputs) or (length is not None and length > max_size)

    async def _store(
        self,
        ins: Instructions,
        files: RequestFiles,
        response: WorkerResponse,
        send: Send,
    ) -> None:
        try:
            async with zipped_result(
                self.mount / "results",
                ins.request_id,
                response.iter_bytes(),
                files,
                max_bytes=self.limits.max_result_bytes,
                max_files=self.limits.max_result_files,
            ) as archive:
                await self._upload(ins.upload, archive)
        except ResultTooLarge as exc:
            await _refuse(send, 502, f"the worker's large result was refused: {exc}")
            return
        except (OSError, httpx.HTTPError, TimeoutError, WorkerFailed) as exc:
            await _refuse(send, 502, f"uploading the large result failed: {_words(exc)}")
            return
        await _answer(send, 302, [(RESULT_HEADER.encode(), STORED.encode())], b"")

    async def _upload(self, url: str, archive: Path) -> None:
        size = (await anyio.Path(archive).stat()).st_size

        async def chunks() -> AsyncIterator[bytes]:
            async with await anyio.open_file(archive, "rb") as fh:
                while chunk := await fh.read(_CHUNK):
                    yield chunk

        with anyio.fail_after(self.limits.timeout):
            response = await self.client.put(
                url, content=chunks(), headers={"Content-Length": str(size)}
            )
        if response.status_code >= 300:
            raise OSError(f"the store answered HTTP {response.status_code}")

    async def _stream(self, response: WorkerResponse, send: Send, result: str | None) -> None:
        hop = connection_headers(response.headers)
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers
            if k.lower() not in hop and k.lower() not in _OWN
        ]
        if result is not None:
            out.append((RESULT_HEADER.encode(), result.encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        async for chunk in response.iter_bytes():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class _TooLarge(Exception):
    pass


async def _body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        parts.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, status: int, detail: str) -> None:
    log.warning("request refused (%d): %s", status, detail)
    await _answer(
        send,
        status,
        [(b"content-type", b"application/json"), (RESULT_HEADER.encode(), REFUSED.encode())],
        json.dumps({"detail": detail}).encode(),
    )


def _words(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = reason if isinstance(reason, str) else str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run(
    *,
    host: str,
    port: int,
    worker_port: int,
    mount: Path,
    limits: Limits,
) -> None:
    """Serve until stopped (the `worker-utils` command)."""
    import os

    import uvicorn

    os.umask(0)  # what it writes there is the worker's to read (SHARED_MODE)

    app = WorkerUtils(f"http://127.0.0.1:{worker_port}", mount, limits)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        http="h11",
        access_log=False,
        log_level="info",
        h11_max_incomplete_event_size=MAX_CONTROL_BYTES + 64 * 1024,
        timeout_graceful_shutdown=30,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()


__all__ = [
    "CONTROL_HEADER",
    "DEFAULT_PORT",
    "FILES_MOUNT",
    "PASSED",
    "PROGRESS_HEADER",
    "REFUSED",
    "RESULT_HEADER",
    "STORED",
    "Instructions",
    "Limits",
    "WorkerUtils",
    "run",
]

"""The HTTP answers of the invocation routes. Every one carries `NVCF-REQID` and
`NVCF-STATUS` (`fulfilled` for < 400, `pending-evaluation` for a first 202, `in-progress` for a
202 of a status poll, `errored` for everything else, problems included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from service.backends.worker import WorkerFailed
from service.core.errors import (
    BadGateway,
    DomainError,
    GatewayTimeout,
    ServiceUnavailable,
)
from service.core.problem import PROBLEM, problem_body
from service.invocation.store import Outcome

if TYPE_CHECKING:
    from service.assets.files import Progress
    from service.invocation.engine import Streamed

FULFILLED = "fulfilled"
PENDING = "pending-evaluation"
IN_PROGRESS = "in-progress"
ERRORED = "errored"


def status_word(status: int) -> str:
    if status == 202:
        return IN_PROGRESS
    return FULFILLED if status < 400 else ERRORED


def reqid_value(request_id: uuid.UUID | str) -> bytes:
    """`NVCF-REQID`'s value: an id as text; any other text (the id of a status route that is
    no id) percent-encoded, so that no byte of it can break the header (at most 64 bytes)."""
    return quote(str(request_id), safe="")[:64].encode("ascii")


def nvcf_headers(request_id: uuid.UUID | str, word: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"nvcf-reqid", reqid_value(request_id)),
        (b"nvcf-status", word.encode()),
        (b"access-control-expose-headers", b"nvcf-reqid, nvcf-status"),
    ]


def encode_headers(headers: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def problem_message(
    err: DomainError, path: str, context_id: str, request_id: uuid.UUID | str
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of a problem+json answer with the invocation headers;
    `context_id` is the request-context id the problem body quotes."""
    body = json.dumps(problem_body(err, path, context_id)).encode()
    headers = [
        (b"content-type", PROBLEM.encode()),
        (b"content-length", str(len(body)).encode()),
        *encode_headers(list(err.headers.items())),
        *nvcf_headers(request_id, ERRORED),
    ]
    return err.status, headers, body


def problem(request: Request, err: DomainError, request_id: uuid.UUID | str) -> Response:
    """A problem+json answer with the invocation headers."""
    path = getattr(request.state, "original_path", None) or request.url.path
    context_id = str(getattr(request.state, "request_id", ""))
    status, headers, body = problem_message(err, path, context_id, request_id)
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


def large_result_url(outcome: Outcome | None) -> str | None:
    """The signed URL of a large result (the engine's 302 outcome), else None."""
    if outcome is None or outcome.status != 302 or outcome.error is not None:
        return None
    for name, value in outcome.headers:
        if name == b"location":
            return value.decode("latin-1")
    return None


def failure_error(outcome: Outcome) -> DomainError:
    """The problem of a request the invocation plane could not complete."""
    reason = outcome.error or "the request failed"
    if outcome.status == 504:
        return GatewayTimeout(detail=reason)
    if outcome.status == 503:
        return ServiceUnavailable(detail=reason)
    return BadGateway(detail=reason)


def outcome_response(request: Request, request_id: uuid.UUID, outcome: Outcome) -> Response:
    """The pass-through answer of a finished request: the worker's status, headers and body,
    or the problem that says why there was none."""
    if outcome.error is not None:
        return problem(request, failure_error(outcome), request_id)
    response = Response(outcome.body, status_code=outcome.status)
    response.raw_headers = [
        *outcome.headers,
        (b"content-length", str(len(outcome.body)).encode()),
        *nvcf_headers(request_id, status_word(outcome.status)),
    ]
    return response


def pending_response(
    request_id: uuid.UUID, word: str, progress: Progress | None = None
) -> Response:
    """A 202; with the worker's progress report, as NVCF's worker utilities answer it: its
    partial output as the body and `NVCF-PERCENT-COMPLETE`."""
    if progress is None:
        body = json.dumps({"reqId": str(request_id), "status": word}).encode()
    else:
        body = progress.partial
    response = Response(body, status_code=202, media_type="application/json")
    response.raw_headers += nvcf_headers(request_id, word)
    if progress is not None:
        response.raw_headers.append((b"nvcf-percent-complete", str(progress.percent).encode()))
    return response


def _worker_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")


def exec_response(
    request: Request,
    request_id: uuid.UUID,
    outcome: Outcome | None,
    word: str = PENDING,
    progress: Progress | None = None,
) -> Response:
    """The wrapped (`exec`) answer: `{reqId, status, percentComplete?, errorCode?, response?,
    responseReference?}` with the worker's status as the HTTP status (202 while pending; 200
    with `responseReference`, the signed URL, for a large result)."""
    content: dict[str, Any] = {"reqId": str(request_id)}
    location = large_result_url(outcome)
    if outcome is None:
        status, content["status"] = 202, word
        if progress is not None:
            content["percentComplete"] = progress.percent
            content["response"] = _worker_json(progress.partial)
    elif location is not None:
        status = 200
        content.update(status=FULFILLED, percentComplete=100, responseReference=location)
    elif outcome.error is not None:
        err = failure_error(outcome)
        path = getattr(request.state, "original_path", None) or request.url.path
        rid = str(getattr(request.state, "request_id", ""))
        status = err.status
        content.update(status=ERRORED, errorCode=err.status, response=problem_body(err, path, rid))
    else:
        status = outcome.status
        content["status"] = status_word(outcome.status)
        if outcome.status < 400:
            content["percentComplete"] = 100
        else:
            content["errorCode"] = outcome.status
        worker = _worker_json(outcome.body)
        if worker is not None:
            content["response"] = worker
    response = JSONResponse(content, status_code=status)
    response.raw_headers += nvcf_headers(request_id, content["status"])
    return response


async def whole(answer: Streamed, limit: int) -> Outcome:
    """The whole of a streamed answer (the wrapped form), bounded by `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    error: str | None = None
    try:
        async for chunk in answer.chunks():
            size += len(chunk)
            if size > limit:
                error = f"the worker's response exceeds {limit} bytes"
                break
            parts.append(chunk)
    except WorkerFailed as exc:
        error = exc.reason
    finally:
        await answer.close(error)
    if error is not None:
        return Outcome.failure(502, f"the worker failed: {error}")
    headers = list(answer.headers)
    return Outcome(answer.status, tuple(headers), b"".join(parts))


async def relay(answer: Streamed, receive: Receive, send: Send) -> str | None:
    """Stream the worker's body to the caller; why it stopped short, or None. An answer
    without a length (server-sent events, chunked answers) may never end: it also stops when
    the caller disconnects."""
    if answer.length is not None:
        return await _stream(answer, send)
    stream = asyncio.ensure_future(_stream(answer, send))
    heard = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({stream, heard}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stream, heard):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if stream in done and not stream.cancelled():
        return stream.result()
    return "the caller disconnected"


async def _stream(answer: Streamed, send: Send) -> str | None:
    left = answer.length
    if left == 0:
        await send({"type": "http.response.body", "body": b""})
        return None
    try:
        async for chunk in answer.chunks():
            if left is not None:
                left -= len(chunk)
                if left < 0:
                    return "the worker's answer is longer than its Content-Length"
                if left == 0:  # the last of it: one message ends the answer
                    await send({"type": "http.response.body", "body": chunk})
                    return None
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except WorkerFailed as exc:
        return exc.reason  # the connection is closed without completing the answer
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return None


class WorkerStream(Response):
    """The worker's answer streamed through as it arrives; the answer is always closed
    (the instance's slot is held until then)."""

    def __init__(self, answer: Streamed) -> None:
        self.status_code = answer.status
        self.background = None
        self._answer = answer
        headers = answer.headers
        if answer.length is not None and answer.status not in (204, 304):
            headers = [*headers, (b"content-length", str(answer.length).encode())]
        self.raw_headers = headers + nvcf_headers(answer.request_id, status_word(answer.status))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error: str | None = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            error = await relay(self._answer, receive, send)
        except BaseException as exc:
            error = f"{type(exc).__name__} while streaming the answer"
            raise
        finally:
            await self._answer.close(error)


async def _disconnected(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return

"""The HTTP answers of the invocation routes. Every one carries `NVCF-REQID` and
`NVCF-STATUS` (`fulfilled` for < 400, `pending-evaluation` for a first 202, `in-progress` for a
202 of a status poll, `errored` for everything else, problems included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from service.backends.worker import WorkerFailed
from service.core.errors import (
    BadGateway,
    DomainError,
    GatewayTimeout,
    ServiceUnavailable,
)
from service.core.http import NotJson, RefusedJson, load_json
from service.core.problem import PROBLEM, problem_body
from service.core.server import cut_response
from service.invocation.store import Outcome

if TYPE_CHECKING:
    from service.assets.files import Progress
    from service.invocation.run import Streamed

log = logging.getLogger("nvcf.invocation")

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
    if isinstance(request_id, uuid.UUID):
        return str(request_id).encode("ascii")
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
    err: DomainError, path: str, context_id: str, request_id: uuid.UUID | str | None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of a problem+json answer, with the invocation headers when it
    answers a request (`request_id`); `context_id` is the request-context id the body quotes."""
    body = json.dumps(problem_body(err, path, context_id)).encode()
    headers = [(b"content-type", PROBLEM.encode()), *encode_headers(list(err.headers.items()))]
    if request_id is not None:
        headers += nvcf_headers(request_id, ERRORED)
    return err.status, headers, body


def _where(scope: Scope) -> tuple[str, str]:
    """(the path as the client sent it, the request-context id) of a request."""
    state = scope.get("state") or {}
    path = state.get("original_path") or scope.get("path", "")
    return str(path), str(state.get("request_id", ""))


async def send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """An answer of known length, in one head and one body message."""
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_problem(
    send: Send, scope: Scope, err: DomainError, request_id: uuid.UUID | str | None
) -> None:
    status, headers, body = problem_message(err, *_where(scope), request_id)
    await send_whole(send, status, headers, body)


def failure_error(outcome: Outcome) -> DomainError:
    """The problem of a request the invocation plane could not complete."""
    reason = outcome.error or "the request failed"
    if outcome.status == 504:
        return GatewayTimeout(detail=reason)
    if outcome.status == 503:
        return ServiceUnavailable(detail=reason)
    return BadGateway(detail=reason)


async def send_outcome(send: Send, scope: Scope, request_id: uuid.UUID, outcome: Outcome) -> None:
    """The pass-through answer of a finished request: the worker's status, headers and body,
    or the problem that says why there was none."""
    if outcome.error is not None:
        await send_problem(send, scope, failure_error(outcome), request_id)
        return
    headers = [*outcome.headers, *nvcf_headers(request_id, status_word(outcome.status))]
    await send_whole(send, outcome.status, headers, outcome.body)


async def send_pending(
    send: Send, request_id: uuid.UUID, word: str, progress: Progress | None = None
) -> None:
    """A 202; with the worker's progress report, as NVCF's worker utilities answer it: its
    partial output as the body and `NVCF-PERCENT-COMPLETE`."""
    headers = [(b"content-type", b"application/json"), *nvcf_headers(request_id, word)]
    if progress is None:
        body = json.dumps({"reqId": str(request_id), "status": word}).encode()
    else:
        body = progress.partial
        headers.append((b"nvcf-percent-complete", b"%d" % progress.percent))
    await send_whole(send, 202, headers, body)


def large_result_url(outcome: Outcome | None) -> str | None:
    """The URL of a 302 answer (the engine's large result, or the worker's own redirect),
    which exec answers as `responseReference` (NVCF's mapping), else None."""
    if outcome is None or outcome.status != 302 or outcome.error is not None:
        return None
    for name, value in outcome.headers:
        if name == b"location":
            return value.decode("latin-1")
    return None


def _worker_json(body: bytes) -> Any:
    """The worker's body as exec's `response`: its JSON, else its text; `RefusedJson` for
    JSON that cannot be encoded again (NaN, nesting past the bound, a lone surrogate…)."""
    if not body:
        return None
    try:
        return load_json(body, root="response")
    except NotJson:
        return body.decode("utf-8", errors="replace")


async def send_exec(
    send: Send,
    scope: Scope,
    request_id: uuid.UUID,
    outcome: Outcome | None,
    word: str = PENDING,
    progress: Progress | None = None,
) -> None:
    """The wrapped (`exec`) answer: `{reqId, status, percentComplete?, errorCode?, response?,
    responseReference?}` with the worker's status as the HTTP status (202 while pending, with
    the worker's progress when it reports one; 200 with `responseReference`, the signed URL,
    for a large result)."""
    content: dict[str, Any] = {"reqId": str(request_id)}
    worker: Any = None
    if outcome is not None and outcome.error is None:
        try:
            worker = _worker_json(outcome.body)
        except RefusedJson as exc:
            outcome = Outcome.failure(502, f"the worker's answer cannot be relayed: {exc}")
    location = large_result_url(outcome)
    if outcome is None:
        status, content["status"] = 202, word
        if progress is not None:
            content["percentComplete"] = progress.percent
            content["response"] = _worker_json(progress.partial)  # load_json's already
    elif location is not None:
        status = 200
        content.update(status=FULFILLED, percentComplete=100, responseReference=location)
    elif outcome.error is not None:
        err = failure_error(outcome)
        status = err.status
        content.update(
            status=ERRORED, errorCode=err.status, response=problem_body(err, *_where(scope))
        )
    else:
        status = outcome.status
        content["status"] = status_word(outcome.status)
        if outcome.status < 400:
            content["percentComplete"] = 100
        else:
            content["errorCode"] = outcome.status
        if worker is not None:
            content["response"] = worker
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    headers = [(b"content-type", b"application/json"), *nvcf_headers(request_id, content["status"])]
    await send_whole(send, status, headers, body.encode())


async def whole(answer: Streamed, limit: int) -> Outcome:
    """The whole of a streamed answer (the wrapped form), bounded by `limit` bytes."""
    body, error = await answer.read(limit)
    if error is not None:
        return Outcome.failure(502, f"the worker failed: {error}")
    return Outcome(answer.status, tuple(answer.headers), body)


class Body(Protocol):
    """What `relay` streams: an engine's `Streamed`, or an entry's view of one."""

    @property
    def length(self) -> int | None: ...

    def chunks(self) -> AsyncIterator[bytes]: ...


class CallerGone(ClientDisconnect):
    """The caller disconnected while its answer was being made or sent (`Attended`)."""


class Attended:
    """The block in which a caller waits for its answer (`async with Attended(receive, send)
    as send:`, the answer sent with that `send`): when the caller disconnects (ASGI
    `http.disconnect`) before the answer is complete, the block is cancelled and `CallerGone`
    raised from it. Every answer path runs in one (the wait for the worker, reading its answer
    whole or storing it, streaming it) and releases the instance's slot on the way out
    (`Streamed.close`, the engine's `Run.finish`): a hang-up frees the slot at once, whatever
    the answer. The request's body must have been read first: nothing else may call `receive`
    inside."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._task: asyncio.Task[Any] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._cancelling = 0
        #: the answer's last message is sent: a disconnect from now on is no hang-up (servers
        #: say `http.disconnect` once the response is complete)
        self._answered = False
        self._gone = False

    async def __aenter__(self) -> Send:
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cancelling = task, task.cancelling()
        self._listener = asyncio.get_running_loop().create_task(self._listen(task))
        return self.send

    async def send(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._answered = True

    async def _listen(self, task: asyncio.Task[Any]) -> None:
        with contextlib.suppress(Exception):  # a receive that fails: nothing to hear
            while (await self._receive())["type"] != "http.disconnect":
                pass
            if not self._answered:
                self._gone = True
                task.cancel()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        assert self._listener is not None and self._task is not None
        self._listener.cancel()  # no-op once it heard the disconnect
        if not self._gone:
            return
        # as asyncio.timeout: the cancellation is ours unless another was asked for too
        if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise CallerGone() from exc


async def relay(answer: Body, scope: Scope, send: Send) -> str | None:
    """Stream the worker's body to the caller; why it stopped short, or None. (An answer
    without a length, which may never end, ends with its caller's hang-up: `Attended`.) An
    answer that broke off on the worker's side cannot be framed for the caller any other way:
    the caller's connection is closed (`cut_response`)."""
    error = await _stream(answer, send)
    if error is not None:
        log.warning(
            "the worker's answer broke off after its head went out (%s): "
            "the caller's connection is closed",
            error,
        )
        await cut_response(scope)
    return error


async def _stream(answer: Body, send: Send) -> str | None:
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


async def stream(answer: Streamed, scope: Scope, send: Send) -> None:
    """The worker's answer streamed through as it arrives; the answer is always closed (the
    instance's slot is held until then)."""
    error: str | None = None
    try:
        headers = answer.headers
        if answer.length is not None and answer.status not in (204, 304):
            headers = [*headers, (b"content-length", b"%d" % answer.length)]
        headers += nvcf_headers(answer.request_id, status_word(answer.status))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        error = await relay(answer, scope, send)
    except BaseException as exc:
        error = f"{type(exc).__name__} while streaming the answer"
        raise
    finally:
        await answer.close(error)

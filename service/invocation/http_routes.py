"""The invocation routes of the HTTP entry (http.py): `pexec` and `exec` with their status
polls, and the queue routes, each a thin adapter over the engine (engine.py) or the lookup:
parse, authenticate, call, render (answers.py). Their OpenAPI declarations are
http_openapi.py's."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from starlette.requests import Request

from service.assets.files import REFERENCES_HEADER
from service.assets.service import parse_references
from service.auth import scopes
from service.core.errors import DomainError
from service.core.http import parse_uuid, parse_uuids
from service.invocation import answers
from service.invocation.engine import Call, Detached, Finished
from service.invocation.forward import POLL_HEADER, poll_seconds
from service.invocation.http import Exchange, Operation
from service.invocation.schemas import QueueList, QueueOut, QueuePosition, parse_exec

#: the input-asset header as the ASGI scope spells it (every value is read)
_REFERENCES = REFERENCES_HEADER.lower().encode()


async def _invoke(
    ex: Exchange,
    function_id: str,
    version_id: str | None,
    *,
    wrapped: bool = False,
    path: str | None = None,
    swap: bool = False,
) -> None:
    """Accept one invocation and answer it: at once when the worker answers within the poll
    time, else 202."""
    request_id = uuid.uuid4()
    scope, send = ex.scope, ex.send
    try:
        plane = ex.entry.plane()
        principal = await ex.entry.caller(ex, scopes.INVOKE_FUNCTION)
        if version_id is None:
            fid, vid = parse_uuid(function_id, "functionId"), None
        else:
            fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
        poll = poll_seconds(ex.header(POLL_HEADER.encode()))
        body = await ex.body()
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        references = [v.decode("latin-1") for k, v in headers if k == _REFERENCES]
        field = REFERENCES_HEADER
        if wrapped:
            body, exec_poll, exec_references = parse_exec(body)
            poll = exec_poll or poll
            if exec_references:
                references, field = exec_references, "requestHeader.inputAssetReferences"
            headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            headers.append((b"content-type", b"application/json"))
        asset_ids = (
            parse_references(references, field, plane.engine.max_references) if references else ()
        )
    except DomainError as err:
        await answers.send_problem(send, scope, err, request_id)
        return
    call = Call(
        principal=principal,
        function_id=fid,
        version_id=vid,
        method=scope["method"],
        path=path,
        headers=headers,
        body=body,
        request_id=request_id,
        poll_seconds=poll,
        swap_ids=swap,
        asset_ids=asset_ids,
        asset_field=field,
        base_url=lambda: str(Request(scope).base_url),
    )
    # a hang-up ends the request (and frees its slot) wherever it is
    async with answers.Attended(ex.receive, ex.send) as send:
        try:
            answer = await plane.engine.invoke(call)
        except DomainError as err:
            await answers.send_problem(send, scope, err, request_id)
            return
        if isinstance(answer, Detached):
            if wrapped:
                await answers.send_exec(send, scope, request_id, None, answers.PENDING)
            else:
                await answers.send_pending(send, request_id, answers.PENDING)
        elif isinstance(answer, Finished):
            if wrapped:
                await answers.send_exec(send, scope, request_id, answer.outcome)
            else:
                await answers.send_outcome(send, scope, request_id, answer.outcome)
        elif wrapped:
            outcome = await answers.whole(answer, plane.engine.result_max)
            await answers.send_exec(send, scope, request_id, outcome)
        else:
            await answers.stream(answer, scope, send)


async def _poll(ex: Exchange, *, wrapped: bool) -> None:
    scope, send = ex.scope, ex.send
    raw_id = ex.params["requestId"]
    try:
        rid = parse_uuid(raw_id, "requestId")
    except DomainError as err:
        await answers.send_problem(send, scope, err, raw_id)
        return
    try:
        plane = ex.entry.plane()
        principal = await ex.entry.caller(ex, scopes.INVOKE_FUNCTION)
        poll = poll_seconds(ex.header(POLL_HEADER.encode()))
        answer = await plane.lookup.poll(principal, rid, poll)
    except DomainError as err:
        await answers.send_problem(send, scope, err, rid)
        return
    if wrapped:
        await answers.send_exec(
            send, scope, rid, answer.outcome, answers.IN_PROGRESS, answer.progress
        )
    elif answer.outcome is None:
        await answers.send_pending(send, rid, answers.IN_PROGRESS, answer.progress)
    else:
        await answers.send_outcome(send, scope, rid, answer.outcome)


async def _pexec(ex: Exchange) -> None:
    await _invoke(ex, ex.params["functionId"], ex.params.get("functionVersionId"))


async def _exec(ex: Exchange) -> None:
    await _invoke(ex, ex.params["functionId"], ex.params.get("functionVersionId"), wrapped=True)


async def _pexec_status(ex: Exchange) -> None:
    await _poll(ex, wrapped=False)


async def _exec_status(ex: Exchange) -> None:
    await _poll(ex, wrapped=True)


# ---------------------------------------------------------------------------- queues


async def _queues(ex: Exchange) -> None:
    async def read() -> BaseModel:
        principal = await ex.entry.caller(ex, scopes.QUEUE_DETAILS)
        function_id, version_id = ex.params["functionId"], ex.params.get("functionVersionId")
        if version_id is None:
            fid, vid = parse_uuid(function_id, "functionId"), None
        else:
            fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
        plane = ex.entry.plane()
        async with ex.entry.sessions()() as session:
            infos = await plane.lookup.queues(session, principal, fid, vid)
        return QueueList(
            function_id=fid,
            queues=[
                QueueOut(
                    function_version_id=q.version_id,
                    function_name=q.name,
                    function_status=q.status,
                    queue_depth=q.depth,
                )
                for q in infos
            ],
        )

    await _answer_model(ex, read)


async def _position(ex: Exchange) -> None:
    async def read() -> BaseModel:
        principal = await ex.entry.caller(ex, scopes.QUEUE_DETAILS)
        rid = parse_uuid(ex.params["requestId"], "requestId")
        fid, vid, position = await ex.entry.plane().lookup.position(principal, rid)
        return QueuePosition(function_id=fid, function_version_id=vid, position_in_queue=position)

    await _answer_model(ex, read)


async def _answer_model(ex: Exchange, read: Callable[[], Awaitable[BaseModel]]) -> None:
    try:
        model = await read()
    except DomainError as err:
        await answers.send_problem(ex.send, ex.scope, err, None)
        return
    body = model.model_dump_json(by_alias=True).encode()
    await answers.send_whole(ex.send, 200, [(b"content-type", b"application/json")], body)


async def transparent(
    ex: Exchange, function_id: str, version_id: str | None, path: str, swap: bool
) -> None:
    """A transparent-mode request: the worker gets its own path."""
    await _invoke(ex, function_id, version_id, path=path, swap=swap)


_FUNCTION = "/pexec/functions/{functionId}"
_VERSION = "/pexec/functions/{functionId}/versions/{functionVersionId}"

#: the routes, in the order the router tries them
OPERATIONS: tuple[Operation, ...] = (
    Operation("POST", _FUNCTION, _pexec, "pexec_function"),
    Operation("POST", _VERSION, _pexec, "pexec_version"),
    Operation("GET", "/pexec/status/{requestId}", _pexec_status, "pexec_status"),
    Operation("POST", "/exec/functions/{functionId}", _exec, "exec_function"),
    Operation(
        "POST", "/exec/functions/{functionId}/versions/{functionVersionId}", _exec, "exec_version"
    ),
    Operation("GET", "/exec/status/{requestId}", _exec_status, "exec_status"),
    Operation("GET", "/queues/functions/{functionId}", _queues, "queues_of_function"),
    Operation(
        "GET",
        "/queues/functions/{functionId}/versions/{functionVersionId}",
        _queues,
        "queues_of_version",
    ),
    Operation("GET", "/queues/{requestId}/position", _position, "queue_position"),
)

"""HTTP routes of invocation (api.md §6): `pexec` (pass-through), `exec` (wrapped), their
status polls, and the queue routes. Transparent mode (Host or routing headers) enters through
transparent.py and shares `invoke`.

Invocation routes authenticate without the per-account API rate limit: a function's own
`rateLimit` governs its invocations (ratelimit.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.assets.files import REFERENCES_HEADER
from service.assets.service import parse_references
from service.auth import scopes
from service.auth.deps import Session
from service.auth.service import Principal
from service.core.errors import DomainError, Forbidden, ServiceUnavailable
from service.core.http import inline_body_doc, parse_uuid, parse_uuids
from service.invocation import answers
from service.invocation.engine import Call, Detached, Finished
from service.invocation.forward import POLL_HEADER, poll_seconds
from service.invocation.schemas import (
    ExecRequest,
    ExecResponse,
    QueueList,
    QueueOut,
    QueuePosition,
    parse_exec,
)
from service.invocation.service import InvocationPlane
from service.state import app_state

router = APIRouter(tags=["invocation"])

_WORKER_DOC: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "description": "Sent unchanged (with its content type) to the function's inferenceUrl.",
        "content": {"*/*": {"schema": {}}},
    }
}
_EXEC_DOC = inline_body_doc(ExecRequest)


def _problem_doc(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


_INVOKE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The worker's answer (status, headers and body as it sent them)"},
    202: {"description": "Not answered within NVCF-POLL-SECONDS: poll the status route"},
    502: _problem_doc("The worker could not be reached or failed"),
    504: _problem_doc("The worker did not answer in time"),
}
_STATUS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The worker's answer"},
    202: {"description": "Still pending"},
    502: _problem_doc("The worker could not be reached or failed"),
    504: _problem_doc("The worker did not answer in time"),
}


def plane_of(request: Request) -> InvocationPlane:
    plane = app_state(request).invocation
    if plane is None:
        raise ServiceUnavailable(detail="invocation is not served by this process")
    return plane


async def caller(request: Request, *any_of: str) -> Principal:
    """The authenticated caller holding one of the scopes (no API rate limit; see above)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        state = app_state(request)
        principal = await state.authenticator.authenticate(
            state.sessionmaker,
            request.headers.get("authorization"),
            invocation=scopes.INVOKE_FUNCTION in any_of,  # invocation tokens: invoke and poll
        )
        org = getattr(request.state, "org", None)
        if org is not None and org != principal.account_id:
            raise Forbidden(detail=f"organization '{org}' in the path is not the caller's account")
        request.state.principal = principal
        request.state.account_id = principal.account_id
    if principal.scopes.isdisjoint(any_of):
        needed = " or ".join(f"'{s}'" for s in any_of)
        raise Forbidden(detail=f"this operation requires the scope {needed}")
    return principal


def _queue_reader() -> Callable[[Request], Awaitable[Principal]]:
    async def dependency(request: Request) -> Principal:
        return await caller(request, scopes.QUEUE_DETAILS)

    return dependency


QueueReader = Annotated[Principal, Depends(_queue_reader())]


async def invoke(
    request: Request,
    function_id: str,
    version_id: str | None,
    *,
    wrapped: bool = False,
    path: str | None = None,
    swap_ids: bool = False,
) -> Response:
    """Accept one invocation and answer it: at once when the worker answers within the poll
    time, else 202. `path` (transparent mode) is forwarded as is; otherwise the function's
    `inferenceUrl`. `swap_ids`: two ids of a Host may be in either order."""
    request_id = uuid.uuid4()
    try:
        plane = plane_of(request)
        principal = await caller(request, scopes.INVOKE_FUNCTION)
        if version_id is None:
            fid, vid = parse_uuid(function_id, "functionId"), None
        else:
            fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
        poll = poll_seconds(request.headers.get(POLL_HEADER))
        body = await request.body()
        headers: list[tuple[bytes, bytes]] = request.scope["headers"]
        references = request.headers.getlist(REFERENCES_HEADER)
        field = REFERENCES_HEADER
        if wrapped:
            body, exec_poll, exec_references = parse_exec(body)
            poll = exec_poll or poll
            if exec_references:
                references, field = exec_references, "requestHeader.inputAssetReferences"
            headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            headers.append((b"content-type", b"application/json"))
        limit = app_state(request).settings.asset_max_references
        asset_ids = parse_references(references, field, limit) if references else []
        answer = await plane.engine.invoke(
            Call(
                principal=principal,
                function_id=fid,
                version_id=vid,
                method=request.method,
                path=path,
                headers=headers,
                body=body,
                request_id=request_id,
                poll_seconds=poll,
                swap_ids=swap_ids,
                asset_ids=asset_ids,
                asset_field=field,
                base_url=str(request.base_url),
            )
        )
    except DomainError as err:
        return answers.problem(request, err, request_id)
    if isinstance(answer, Detached):
        if wrapped:
            return answers.exec_response(request, request_id, None, answers.PENDING)
        return answers.pending_response(request_id, answers.PENDING)
    if isinstance(answer, Finished):
        if wrapped:
            return answers.exec_response(request, request_id, answer.outcome)
        return answers.outcome_response(request, request_id, answer.outcome)
    if wrapped:
        outcome = await answers.whole(answer, plane.engine.result_max)
        return answers.exec_response(request, request_id, outcome)
    return answers.WorkerStream(answer)


async def poll_status(request: Request, requestId: str, *, wrapped: bool) -> Response:
    try:
        rid = parse_uuid(requestId, "requestId")
    except DomainError as err:
        return answers.problem(request, err, requestId)
    try:
        plane = plane_of(request)
        principal = await caller(request, scopes.INVOKE_FUNCTION)
        poll = poll_seconds(request.headers.get(POLL_HEADER))
        answer = await plane.lookup.poll(principal, rid, poll)
    except DomainError as err:
        return answers.problem(request, err, rid)
    if wrapped:
        return answers.exec_response(
            request, rid, answer.outcome, answers.IN_PROGRESS, answer.progress
        )
    if answer.outcome is None:
        return answers.pending_response(rid, answers.IN_PROGRESS, answer.progress)
    return answers.outcome_response(request, rid, answer.outcome)


# ------------------------------------------------------------------------------ pexec


@router.post(
    "/pexec/functions/{functionId}",
    summary="Invoke a function (its invocable version): the body goes to its inferenceUrl",
    responses=_INVOKE_RESPONSES,
    openapi_extra=_WORKER_DOC,
)
async def pexec_function(functionId: str, request: Request) -> Response:
    return await invoke(request, functionId, None)


@router.post(
    "/pexec/functions/{functionId}/versions/{functionVersionId}",
    summary="Invoke one version of a function",
    responses=_INVOKE_RESPONSES,
    openapi_extra=_WORKER_DOC,
)
async def pexec_version(functionId: str, functionVersionId: str, request: Request) -> Response:
    return await invoke(request, functionId, functionVersionId)


@router.get(
    "/pexec/status/{requestId}",
    summary="The answer of a request that got 202 (waits up to NVCF-POLL-SECONDS)",
    responses=_STATUS_RESPONSES,
)
async def pexec_status(requestId: str, request: Request) -> Response:
    return await poll_status(request, requestId, wrapped=False)


# ------------------------------------------------------------------------------ exec


@router.post(
    "/exec/functions/{functionId}",
    summary="Invoke a function, wrapped: {requestHeader, requestBody} → {reqId, status, response}",
    response_model=ExecResponse,
    responses=_INVOKE_RESPONSES,
    openapi_extra=_EXEC_DOC,
)
async def exec_function(functionId: str, request: Request) -> Response:
    return await invoke(request, functionId, None, wrapped=True)


@router.post(
    "/exec/functions/{functionId}/versions/{functionVersionId}",
    summary="Invoke one version of a function, wrapped",
    response_model=ExecResponse,
    responses=_INVOKE_RESPONSES,
    openapi_extra=_EXEC_DOC,
)
async def exec_version(functionId: str, functionVersionId: str, request: Request) -> Response:
    return await invoke(request, functionId, functionVersionId, wrapped=True)


@router.get(
    "/exec/status/{requestId}",
    summary="The wrapped answer of a request that got 202",
    response_model=ExecResponse,
    responses=_STATUS_RESPONSES,
)
async def exec_status(requestId: str, request: Request) -> Response:
    return await poll_status(request, requestId, wrapped=True)


# ------------------------------------------------------------------------------ queues


async def _queues(
    request: Request,
    session: Session,
    principal: Principal,
    function_id: str,
    version_id: str | None,
) -> QueueList:
    if version_id is None:
        fid, vid = parse_uuid(function_id, "functionId"), None
    else:
        fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
    infos = await plane_of(request).lookup.queues(session, principal, fid, vid)
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


@router.get(
    "/queues/functions/{functionId}",
    response_model=QueueList,
    summary="Requests waiting for an instance, per version of a function",
)
async def queues_of_function(
    functionId: str, request: Request, session: Session, principal: QueueReader
) -> QueueList:
    return await _queues(request, session, principal, functionId, None)


@router.get(
    "/queues/functions/{functionId}/versions/{functionVersionId}",
    response_model=QueueList,
    summary="Requests waiting for an instance of one version",
)
async def queues_of_version(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: QueueReader,
) -> QueueList:
    return await _queues(request, session, principal, functionId, functionVersionId)


@router.get(
    "/queues/{requestId}/position",
    response_model=QueuePosition,
    summary="The position of a waiting request in its queue (1 = next)",
)
async def queue_position(requestId: str, request: Request, principal: QueueReader) -> QueuePosition:
    rid = parse_uuid(requestId, "requestId")
    fid, vid, position = await plane_of(request).lookup.position(principal, rid)
    return QueuePosition(function_id=fid, function_version_id=vid, position_in_queue=position)

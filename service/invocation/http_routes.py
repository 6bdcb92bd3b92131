"""The invocation routes of the HTTP entry (http.py) and what answers every request it claims:
`pexec` and `exec` with their status polls, the queue routes, transparent mode, the LLM
gateway's requests (handed to it) and the refusals of the claim. Each route is a thin adapter
over the engine (engine.py) or the lookup: parse, check the caller, call, render (answers.py).
Their OpenAPI declarations are http_openapi.py's."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from service.assets.files import REFERENCES_HEADER
from service.assets.service import parse_references
from service.auth import scopes
from service.auth.caller import caller
from service.auth.service import Authenticator, Principal
from service.core.errors import (
    DomainError,
    FieldError,
    MethodNotAllowed,
    ServiceUnavailable,
    ValidationFailed,
)
from service.core.http import parse_uuid, parse_uuids
from service.core.middleware import ROUTE_LABEL
from service.invocation import answers
from service.invocation.engine import Call
from service.invocation.run import Detached, Finished
from service.invocation.schemas import (
    POLL_HEADER,
    QueueList,
    QueueOut,
    QueuePosition,
    parse_exec,
    poll_seconds,
)
from service.invocation.service import InvocationPlane
from service.invocation.transparent import forwarded_path

#: the metrics/log label of transparent-mode requests
TRANSPARENT = "<transparent invocation>"
#: the metrics/log label of the LLM gateway's requests
LLM = "<llm gateway>"
#: scope key carrying the entry's claim by the request's headers (else the router matched)
CLAIM = "nvcf.invocation_claim"
#: the input-asset header as the ASGI scope spells it (every value is read)
_REFERENCES = REFERENCES_HEADER.lower().encode()


@dataclass(frozen=True)
class Exchange:
    """One claimed request: its ASGI triple and what the route needs of it."""

    scope: Scope
    receive: Receive
    send: Send
    params: Mapping[str, str]
    routes: Routes

    def header(self, name: bytes) -> str | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return str(value.decode("latin-1"))
        return None

    async def body(self) -> bytes:
        """The whole request body (the request-context middleware bounds it);
        `ClientDisconnect` when the caller goes away (or its body breaks off) first."""
        parts: list[bytes] = []
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                raise ClientDisconnect()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts)


Handler = Callable[[Exchange], Awaitable[None]]


@dataclass(frozen=True)
class Operation:
    """A declared route: method and path (under the API prefix), what answers it, and the
    name its OpenAPI declaration goes by (http_openapi.py)."""

    method: str
    path: str
    handler: Handler
    operation_id: str


@dataclass(frozen=True)
class Claim:
    """What the entry claimed by the request's headers (or the LLM prefix), whatever its
    path: transparent mode (function id, version id, whether the two may be swapped), an
    OpenAI path of the LLM gateway, or a refusal of the addressing headers given more than
    once."""

    transparent: tuple[str, str | None, bool] | None = None
    llm: str | None = None
    repeated: tuple[str, ...] = ()


class OpenAIEntry(Protocol):
    """The LLM gateway (service/llm/gateway.py): the requests it claims (the OpenAI path of
    one on the LLM host or under its prefix) and how it answers them."""

    def claims(self, scope: Scope) -> str | None: ...

    async def answer(self, ex: Exchange, path: str) -> None: ...


class Routes:
    """The ASGI application answering what the entry claimed (inside the request context):
    the claim on the scope, else the operation of the route the router matched
    (`scope["route"].handlers`, by method)."""

    def __init__(
        self,
        *,
        plane: Callable[[], InvocationPlane | None],
        authenticator: Callable[[], Authenticator],
        sessionmaker: Callable[[], async_sessionmaker[AsyncSession]],
        llm: OpenAIEntry | None = None,
    ) -> None:
        self._plane = plane
        self._authenticator = authenticator
        self._sessionmaker = sessionmaker
        self.llm = llm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        claim: Claim | None = scope.get(CLAIM)
        if claim is None:
            handlers: Mapping[str, Handler] = scope["route"].handlers
            handler = handlers.get("GET" if scope["method"] == "HEAD" else scope["method"])
            if handler is None:
                err = MethodNotAllowed(
                    detail=f"method {scope['method']} is not allowed on {_instance(scope)}",
                    headers={"Allow": ", ".join(sorted(handlers))},
                )
                await answers.send_problem(send, scope, err, None)
                return
            await handler(Exchange(scope, receive, send, scope["path_params"], self))
        elif claim.llm is not None and self.llm is not None:
            scope[ROUTE_LABEL] = LLM
            await self.llm.answer(Exchange(scope, receive, send, {}, self), claim.llm)
        elif claim.transparent is not None:
            scope[ROUTE_LABEL] = TRANSPARENT
            ex = Exchange(scope, receive, send, {}, self)
            function_id, version_id, swap = claim.transparent
            await _invoke(ex, function_id, version_id, path=forwarded_path(scope), swap=swap)
        else:
            errors = [FieldError(name, "given more than once") for name in claim.repeated]
            await answers.send_problem(send, scope, ValidationFailed.of(errors, "header"), None)

    def sessions(self) -> async_sessionmaker[AsyncSession]:
        """The application's sessions (reads of an entry's own)."""
        return self._sessionmaker()

    def plane(self) -> InvocationPlane:
        plane = self._plane()
        if plane is None:
            raise ServiceUnavailable(detail="invocation is not served by this process")
        return plane

    def own_limits(self, account_id: str) -> Mapping[str, Any]:
        """The limits the operator set the account, as the caller check last read them."""
        known = self._authenticator().suspensions
        return {} if known is None else known.own_limits(account_id)

    async def caller(self, ex: Exchange, *any_of: str) -> Principal:
        """The authenticated caller holding one of the scopes."""
        state = ex.scope["state"]
        return await caller(
            self._authenticator(),
            ex.header(b"authorization"),
            sessions=self._sessionmaker(),
            any_of=any_of,
            org=state.get("org"),
            invocation=scopes.INVOKE_FUNCTION in any_of,  # invocation tokens: invoke and poll
            state=state,
        )


def _instance(scope: Scope) -> str:
    return str(scope.get("state", {}).get("original_path") or scope.get("path", ""))


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
        plane = ex.routes.plane()
        principal = await ex.routes.caller(ex, scopes.INVOKE_FUNCTION)
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
        plane = ex.routes.plane()
        principal = await ex.routes.caller(ex, scopes.INVOKE_FUNCTION)
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
        principal = await ex.routes.caller(ex, scopes.QUEUE_DETAILS)
        function_id, version_id = ex.params["functionId"], ex.params.get("functionVersionId")
        if version_id is None:
            fid, vid = parse_uuid(function_id, "functionId"), None
        else:
            fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
        plane = ex.routes.plane()
        async with ex.routes.sessions()() as session:
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
        principal = await ex.routes.caller(ex, scopes.QUEUE_DETAILS)
        rid = parse_uuid(ex.params["requestId"], "requestId")
        fid, vid, position = await ex.routes.plane().lookup.position(principal, rid)
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

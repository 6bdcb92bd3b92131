"""The HTTP entry of invocation (api.md §6): one plain ASGI application, ahead of FastAPI's
middleware stack, serving every invocation route — `pexec` (pass-through) and `exec` (wrapped)
with their status polls, the queue routes, and transparent mode (a request addressed to a
function by its Host or routing headers, transparent.py) — through the org aliases and a
leading `//` too — and hands the LLM gateway's requests (service/llm/) to it. It is a thin
adapter over the engine (engine.py): parse, authenticate, call the engine or the lookup,
render (answers.py).

`ROUTES` declares the routes; the OpenAPI document is generated from them (`openapi_paths`).
The application hands the entry the requests it claims (`claim`) with the request-context
middleware (request id, body limit, metrics, access line) put around it, as around the
ordinary stack. Invocation routes authenticate without the per-account API rate limit: a
function's own `rateLimit` governs its invocations (ratelimit.py); an invocation token is
accepted on invoking and polling only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from service.assets.files import REFERENCES_HEADER
from service.assets.service import parse_references
from service.auth import scopes
from service.auth.service import Authenticator, Principal
from service.core.errors import (
    DomainError,
    FieldError,
    Forbidden,
    MethodNotAllowed,
    ServiceUnavailable,
    ValidationFailed,
)
from service.core.http import parse_uuid, parse_uuids
from service.core.middleware import ROUTE_LABEL, routed_path
from service.invocation import answers
from service.invocation.engine import Call
from service.invocation.forward import POLL_HEADER, poll_seconds
from service.invocation.run import Detached, Finished
from service.invocation.schemas import (
    ExecRequest,
    ExecResponse,
    QueueList,
    QueueOut,
    QueuePosition,
    parse_exec,
)
from service.invocation.service import InvocationPlane
from service.invocation.transparent import addressed, forwarded_path, repeated

API_PREFIX = "/v2/nvcf"
#: the metrics/log label of transparent-mode requests
TRANSPARENT = "<transparent invocation>"
#: the metrics/log label of the LLM gateway's requests
LLM = "<llm gateway>"
#: the input-asset header as the ASGI scope spells it (every value is read)
_REFERENCES = REFERENCES_HEADER.lower().encode()


@dataclass(frozen=True)
class Exchange:
    """One claimed request: its ASGI triple and what the route needs of it."""

    scope: Scope
    receive: Receive
    send: Send
    params: dict[str, str]
    entry: InvocationEntry

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
class Route:
    """A declared route: what answers it and what the OpenAPI document says of it."""

    method: str
    template: str
    handler: Handler
    summary: str
    operation_id: str
    responses: dict[str, dict[str, Any]]
    request_body: dict[str, Any] | None = None
    response_model: type[BaseModel] | None = None
    #: the route's parts: text to match, or None for a parameter
    parts: tuple[str | None, ...] = field(init=False)
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        segments = self.template.split("/")
        object.__setattr__(self, "parts", tuple(None if s.startswith("{") else s for s in segments))
        object.__setattr__(self, "names", tuple(s[1:-1] for s in segments if s.startswith("{")))

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.parts):
            return None
        values = []
        for want, got in zip(self.parts, segments, strict=True):
            if want is None:
                if not got:
                    return None
                values.append(got)
            elif want != got:
                return None
        return dict(zip(self.names, values, strict=True))


@dataclass(frozen=True)
class Claim:
    """What the entry will answer: a declared route (with its parameters), transparent
    mode (function id, version id, whether the two may be swapped), or an OpenAI path of the
    LLM gateway."""

    route: Route | None = None
    params: dict[str, str] = field(default_factory=dict)
    transparent: tuple[str, str | None, bool] | None = None
    #: the methods the path's routes serve, when the request's is none of them
    allowed: tuple[str, ...] = ()
    llm: str | None = None
    #: the addressing headers given more than once: the request is refused
    repeated: tuple[str, ...] = ()


class OpenAIEntry(Protocol):
    """The LLM gateway (service/llm/gateway.py): the requests it claims (the OpenAI path of
    one on the LLM host or under its prefix) and how it answers them."""

    def claims(self, scope: Scope) -> str | None: ...

    async def answer(self, ex: Exchange, path: str) -> None: ...


#: scope key carrying the claim from `claim` to the entry
_CLAIM = "nvcf.invocation_claim"


class InvocationEntry:
    def __init__(
        self,
        *,
        suffix: str | None,
        plane: Callable[[], InvocationPlane | None],
        authenticator: Callable[[], Authenticator],
        sessionmaker: Callable[[], async_sessionmaker[AsyncSession]],
        llm: OpenAIEntry | None = None,
    ) -> None:
        self.suffix = suffix
        self._plane = plane
        self._authenticator = authenticator
        self._sessionmaker = sessionmaker
        self.llm = llm

    # ------------------------------------------------------------------ claiming

    def claim(self, scope: Scope) -> bool:
        """Whether the request is the entry's (then it is answered by `__call__`)."""
        twice = repeated(scope["headers"])
        if twice:
            scope[_CLAIM] = Claim(repeated=tuple(twice))
            return True
        llm_path = self.llm.claims(scope) if self.llm is not None else None
        if llm_path is not None:
            scope[_CLAIM] = Claim(llm=llm_path)
            return True
        target = addressed(scope["headers"], self.suffix)
        if target is not None:
            scope[_CLAIM] = Claim(transparent=target)
            return True
        path = _api_path(scope)
        if path is None:
            return False
        segments = path.rstrip("/").split("/") if len(path) > 1 else [""]
        method = scope["method"]
        if method == "HEAD":
            method = "GET"
        allowed: list[str] = []
        for route in ROUTES:
            params = route.match(segments)
            if params is None:
                continue
            if route.method == method:
                scope[_CLAIM] = Claim(route=route, params=params)
                return True
            allowed.append(route.method)
        if allowed:
            scope[_CLAIM] = Claim(allowed=tuple(sorted(set(allowed))))
            return True
        return False

    # ------------------------------------------------------------------ answering

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        claim: Claim = scope.pop(_CLAIM)
        if claim.llm is not None and self.llm is not None:
            scope[ROUTE_LABEL] = LLM
            await self.llm.answer(Exchange(scope, receive, send, {}, self), claim.llm)
            return
        if claim.transparent is not None:
            scope[ROUTE_LABEL] = TRANSPARENT
            ex = Exchange(scope, receive, send, {}, self)
            function_id, version_id, swap = claim.transparent
            await _invoke(ex, function_id, version_id, path=forwarded_path(scope), swap=swap)
            return
        if claim.repeated:
            errors = [FieldError(name, "given more than once") for name in claim.repeated]
            await answers.send_problem(send, scope, ValidationFailed.of(errors, "header"), None)
            return
        if claim.route is None:
            methods = ", ".join(claim.allowed)
            err = MethodNotAllowed(
                detail=f"method {scope['method']} is not allowed on {_instance(scope)}",
                headers={"Allow": methods},
            )
            await answers.send_problem(send, scope, err, None)
            return
        route = claim.route
        scope[ROUTE_LABEL] = API_PREFIX + route.template
        await route.handler(Exchange(scope, receive, send, claim.params, self))

    def sessions(self) -> async_sessionmaker[AsyncSession]:
        """The application's sessions (reads of an entry's own)."""
        return self._sessionmaker()

    def plane(self) -> InvocationPlane:
        plane = self._plane()
        if plane is None:
            raise ServiceUnavailable(detail="invocation is not served by this process")
        return plane

    async def caller(self, ex: Exchange, *any_of: str) -> Principal:
        """The authenticated caller holding one of the scopes."""
        principal = await self._authenticator().authenticate(
            self._sessionmaker(),
            ex.header(b"authorization"),
            invocation=scopes.INVOKE_FUNCTION in any_of,  # invocation tokens: invoke and poll
        )
        state = ex.scope["state"]
        org = state.get("org")
        if org is not None and org != principal.account_id:
            raise Forbidden(detail=f"organization '{org}' in the path is not the caller's account")
        state["account_id"] = principal.account_id
        if principal.scopes.isdisjoint(any_of):
            needed = " or ".join(f"'{s}'" for s in any_of)
            raise Forbidden(detail=f"this operation requires the scope {needed}")
        return principal


def _api_path(scope: Scope) -> str | None:
    """The path under the API prefix the routes are declared on, through the org aliases
    (`/v2/orgs/{org}[/teams/{team}]/nvcf/...`, read by the middleware's one grammar, which
    also sets the org the caller is checked against) and leading slashes; None for any other."""
    path = routed_path(scope)
    if path.startswith(API_PREFIX + "/"):
        return path[len(API_PREFIX) :]
    return None


def _instance(scope: Scope) -> str:
    return str(scope.get("state", {}).get("original_path") or scope.get("path", ""))


# ---------------------------------------------------------------------------- invoking


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


# ---------------------------------------------------------------------------- declarations


def _problem(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


_WORKER_BODY: dict[str, Any] = {
    "required": False,
    "description": "Sent unchanged (with its content type) to the function's inferenceUrl.",
    "content": {"*/*": {"schema": {}}},
}
_EXEC_BODY: dict[str, Any] = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecRequest"}}},
}
_INVOKE: dict[str, dict[str, Any]] = {
    "200": {"description": "The worker's answer (status, headers and body as it sent them)"},
    "202": {"description": "Not answered within NVCF-POLL-SECONDS: poll the status route"},
    "502": _problem("The worker could not be reached or failed"),
    "504": _problem("The worker did not answer in time"),
}
_STATUS: dict[str, dict[str, Any]] = {
    "200": {"description": "The worker's answer"},
    "202": {"description": "Still pending"},
    "502": _problem("The worker could not be reached or failed"),
    "504": _problem("The worker did not answer in time"),
}
_FUNCTION = "/pexec/functions/{functionId}"
_VERSION = "/pexec/functions/{functionId}/versions/{functionVersionId}"

ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        _FUNCTION,
        _pexec,
        "Invoke a function (its invocable version): the body goes to its inferenceUrl",
        "pexec_function",
        _INVOKE,
        _WORKER_BODY,
    ),
    Route(
        "POST",
        _VERSION,
        _pexec,
        "Invoke one version of a function",
        "pexec_version",
        _INVOKE,
        _WORKER_BODY,
    ),
    Route(
        "GET",
        "/pexec/status/{requestId}",
        _pexec_status,
        "The answer of a request that got 202 (waits up to NVCF-POLL-SECONDS)",
        "pexec_status",
        _STATUS,
    ),
    Route(
        "POST",
        "/exec/functions/{functionId}",
        _exec,
        "Invoke a function, wrapped: {requestHeader, requestBody} → {reqId, status, response}",
        "exec_function",
        _INVOKE,
        _EXEC_BODY,
        ExecResponse,
    ),
    Route(
        "POST",
        "/exec/functions/{functionId}/versions/{functionVersionId}",
        _exec,
        "Invoke one version of a function, wrapped",
        "exec_version",
        _INVOKE,
        _EXEC_BODY,
        ExecResponse,
    ),
    Route(
        "GET",
        "/exec/status/{requestId}",
        _exec_status,
        "The wrapped answer of a request that got 202",
        "exec_status",
        _STATUS,
        None,
        ExecResponse,
    ),
    Route(
        "GET",
        "/queues/functions/{functionId}",
        _queues,
        "Requests waiting for an instance, per version of a function",
        "queues_of_function",
        {"200": {"description": "Successful Response"}},
        None,
        QueueList,
    ),
    Route(
        "GET",
        "/queues/functions/{functionId}/versions/{functionVersionId}",
        _queues,
        "Requests waiting for an instance of one version",
        "queues_of_version",
        {"200": {"description": "Successful Response"}},
        None,
        QueueList,
    ),
    Route(
        "GET",
        "/queues/{requestId}/position",
        _position,
        "The position of a waiting request in its queue (1 = next)",
        "queue_position",
        {"200": {"description": "Successful Response"}},
        None,
        QueuePosition,
    ),
)

#: models the generated operations refer to (added to the document's components)
MODELS: tuple[type[BaseModel], ...] = (ExecRequest, ExecResponse, QueueList, QueuePosition)


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI path items of `ROUTES` (the error responses are added by
    core/openapi.py: `truthful`, as for every route)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        parameters = [
            {
                "in": "path",
                "name": name,
                "required": True,
                "schema": {"type": "string", "format": "uuid"},
            }
            for name in route.names
        ]
        if route.handler in (_pexec, _exec, _pexec_status, _exec_status):
            parameters.append(
                {
                    "in": "header",
                    "name": "NVCF-POLL-SECONDS",
                    "required": False,
                    "description": "Seconds to wait for the worker's answer before 202 "
                    "(1–3600, default 60)",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 3600},
                }
            )
        responses = json.loads(json.dumps(route.responses))
        if route.response_model is not None:
            ref = {"$ref": f"#/components/schemas/{route.response_model.__name__}"}
            responses["200"]["content"] = {"application/json": {"schema": ref}}
        elif route.handler in (_pexec, _pexec_status):
            responses["200"]["content"] = {"*/*": {"schema": {}}}
        operation: dict[str, Any] = {
            "tags": ["invocation"],
            "summary": route.summary,
            "operationId": route.operation_id,
            "parameters": parameters,
            "responses": responses,
        }
        if route.request_body is not None:
            operation["requestBody"] = route.request_body
        paths.setdefault(API_PREFIX + route.template, {})[route.method.lower()] = operation
    return paths

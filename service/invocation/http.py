"""The HTTP entry of invocation (api.md §6): a host dispatch and a Starlette router ahead of
FastAPI (as NVCF's `app.rs` puts its host dispatch ahead of a path router), serving every
invocation route — the routes of http_routes.py (`pexec` and `exec` with their status polls,
the queue routes), transparent mode (a request addressed to a function by its Host or routing
headers, transparent.py) and the LLM gateway's requests (service/llm/) — and handing every
other request to FastAPI (the router's default).

The application normalizes the path once (the leading `//` and the org aliases,
core/middleware.py `normalize`) before the entry sees it. The host dispatch decides first and
puts its claim on the scope; else the router matches the path. What is claimed is answered
inside the request-context middleware (request id, body limit, metrics, access line), as the
ordinary stack's routes are; the body limit reads the claim. Invocation routes authenticate
without the per-account API rate limit: a function's own `rateLimit` governs its invocations
(ratelimit.py); an invocation token is accepted on invoking and polling only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import ClientDisconnect
from starlette.routing import Match, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import scopes
from service.auth.service import Authenticator, Principal
from service.core.errors import (
    FieldError,
    Forbidden,
    MethodNotAllowed,
    ServiceUnavailable,
    ValidationFailed,
)
from service.core.middleware import ROUTE_LABEL
from service.invocation import answers
from service.invocation.service import InvocationPlane
from service.invocation.transparent import addressed, forwarded_path, repeated

API_PREFIX = "/v2/nvcf"
#: the metrics/log label of transparent-mode requests
TRANSPARENT = "<transparent invocation>"
#: the metrics/log label of the LLM gateway's requests
LLM = "<llm gateway>"
#: the body limit of the LLM gateway's requests: none here, the gateway reads its bodies itself
#: (within its own limit) so that a refusal is in OpenAI's shape
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class Exchange:
    """One claimed request: its ASGI triple and what the route needs of it."""

    scope: Scope
    receive: Receive
    send: Send
    params: Mapping[str, str]
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
#: answers a transparent-mode request: (function id, version id, forwarded path, swap)
Transparent = Callable[[Exchange, str, str | None, str, bool], Awaitable[None]]


@dataclass(frozen=True)
class Operation:
    """A declared route: method and path (under `API_PREFIX`), what answers it, and the
    name its OpenAPI declaration goes by (http_openapi.py)."""

    method: str
    path: str
    handler: Handler
    operation_id: str


class EntryRoute(Route):
    """One path of the entry's router: its operations by method, answered by `app` (the
    request context around `InvocationEntry.answer`). It matches whatever the method (the
    entry answers a method it does not serve with its own 405) and with trailing slashes."""

    def __init__(self, path: str, operations: Iterable[Operation], app: ASGIApp) -> None:
        super().__init__(API_PREFIX + path, app)
        self.handlers = {op.method: op.handler for op in operations}

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        path: str = scope["path"]
        if match is Match.NONE and len(path) > 1 and path.endswith("/"):
            return super().matches({**scope, "path": path.rstrip("/")})
        return match, child


@dataclass(frozen=True)
class Claim:
    """What the host dispatch claimed: transparent mode (function id, version id, whether the
    two may be swapped), an OpenAI path of the LLM gateway, or a refusal of the addressing
    headers given more than once."""

    transparent: tuple[str, str | None, bool] | None = None
    llm: str | None = None
    repeated: tuple[str, ...] = ()


class OpenAIEntry(Protocol):
    """The LLM gateway (service/llm/gateway.py): the requests it claims (the OpenAI path of
    one on the LLM host or under its prefix) and how it answers them."""

    def claims(self, scope: Scope) -> str | None: ...

    async def answer(self, ex: Exchange, path: str) -> None: ...


#: scope key carrying the host dispatch's claim to the answer and the body limit
CLAIM = "nvcf.invocation_claim"


class InvocationEntry:
    def __init__(
        self,
        *,
        suffix: str | None,
        max_body: int,
        operations: Iterable[Operation],
        transparent: Transparent,
        fallback: ASGIApp,
        context: Callable[[ASGIApp, Callable[[Scope], int]], ASGIApp],
        plane: Callable[[], InvocationPlane | None],
        authenticator: Callable[[], Authenticator],
        sessionmaker: Callable[[], async_sessionmaker[AsyncSession]],
        llm: OpenAIEntry | None = None,
    ) -> None:
        """`operations` and `transparent` answer the routes and transparent mode
        (http_routes.py); `fallback` answers what the entry does not claim (FastAPI);
        `context` puts the request-context middleware (with its body limit) around the
        entry's answers."""
        self.suffix = suffix
        self.max_body = max_body
        self._plane = plane
        self._authenticator = authenticator
        self._sessionmaker = sessionmaker
        self.llm = llm
        self.transparent = transparent
        self.answering = context(self.answer, self.body_limit)
        by_path: dict[str, list[Operation]] = {}
        for op in operations:
            by_path.setdefault(op.path, []).append(op)
        self.router = Router(
            [EntryRoute(path, ops, self.answering) for path, ops in by_path.items()],
            redirect_slashes=False,
            default=fallback,
        )

    # ------------------------------------------------------------------ dispatching

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An HTTP request of the application, its path normalized: the host dispatch's
        claim, else the router (the entry's routes, else FastAPI)."""
        claim = self.host_claim(scope)
        if claim is None:
            await self.router(scope, receive, send)
            return
        scope[CLAIM] = claim
        await self.answering(scope, receive, send)

    def host_claim(self, scope: Scope) -> Claim | None:
        """What the request is by its headers (or the LLM prefix), whatever its path."""
        twice = repeated(scope["headers"])
        if twice:
            return Claim(repeated=tuple(twice))
        llm_path = self.llm.claims(scope) if self.llm is not None else None
        if llm_path is not None:
            return Claim(llm=llm_path)
        target = addressed(scope["headers"], self.suffix)
        if target is not None:
            return Claim(transparent=target)
        return None

    def body_limit(self, scope: Scope) -> int:
        """For the request-context middleware around the answers: the claim's limit."""
        claim: Claim | None = scope.get(CLAIM)
        return UNBOUNDED if claim is not None and claim.llm is not None else self.max_body

    # ------------------------------------------------------------------ answering

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a claimed request (inside the request context)."""
        claim: Claim | None = scope.get(CLAIM)
        if claim is None:
            route: EntryRoute = scope["route"]
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            handler = route.handlers.get(method)
            if handler is None:
                err = MethodNotAllowed(
                    detail=f"method {scope['method']} is not allowed on {_instance(scope)}",
                    headers={"Allow": ", ".join(sorted(route.handlers))},
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
            await self.transparent(ex, function_id, version_id, forwarded_path(scope), swap)
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


def _instance(scope: Scope) -> str:
    return str(scope.get("state", {}).get("original_path") or scope.get("path", ""))

"""The HTTP entry of invocation (api.md §6): a host dispatch and a Starlette router ahead of
FastAPI (as NVCF's `app.rs` puts its host dispatch ahead of a path router). The host dispatch
claims, by the request's headers, transparent mode (transparent.py), the LLM gateway's
requests (service/llm/) and the refusal of addressing headers given twice; else the router
matches the routes of http_routes.py; what neither claims goes to FastAPI (the router's
default).

The application has normalized the path (core/paths.py: `//`, the org aliases) before. What
the entry claims is answered by `http_routes.Routes` inside the request-context middleware
(request id, body limit, metrics, access line), as the ordinary stack's routes are; the body
limit reads the claim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from service.invocation.http_routes import CLAIM, Claim, Handler, OpenAIEntry, Operation
from service.invocation.transparent import addressing

API_PREFIX = "/v2/nvcf"
#: the body limit of the LLM gateway's requests: none here, the gateway reads its bodies itself
#: (within its own limit) so that a refusal is in OpenAI's shape
UNBOUNDED = 1 << 62


class EntryRoute(Route):
    """A path of the entry's router: its operations by method (`handlers`, read by
    `http_routes.Routes`), answered by `app`. It matches whatever the method (a method the
    path does not serve is the entry's own 405) and with trailing slashes."""

    def __init__(self, path: str, operations: Iterable[Operation], app: ASGIApp) -> None:
        super().__init__(API_PREFIX + path, app)
        self.handlers: dict[str, Handler] = {op.method: op.handler for op in operations}
        self.path_regex = re.compile(self.path_regex.pattern.removesuffix("$") + "/*$")


class InvocationEntry:
    """The application's HTTP requests, their paths normalized: the host dispatch's claim,
    else the router (the entry's routes, else FastAPI)."""

    def __init__(
        self,
        *,
        suffix: str | None,
        max_body: int,
        operations: Iterable[Operation],
        answer: ASGIApp,
        fallback: ASGIApp,
        context: Callable[[ASGIApp, Callable[[Scope], int]], ASGIApp],
        llm: OpenAIEntry | None = None,
    ) -> None:
        """`answer` answers what is claimed (`http_routes.Routes`), `context` puts the
        request-context middleware (with its body limit) around it; `fallback` answers the
        rest (FastAPI)."""
        self.suffix = suffix
        self.max_body = max_body
        self.llm = llm
        self.answering = context(answer, self.body_limit)
        by_path: dict[str, list[Operation]] = {}
        for op in operations:
            by_path.setdefault(op.path, []).append(op)
        self.router = Router(
            [EntryRoute(path, ops, self.answering) for path, ops in by_path.items()],
            redirect_slashes=False,
            default=fallback,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        claim = self.host_claim(scope)
        if claim is None:
            await self.router(scope, receive, send)
            return
        scope[CLAIM] = claim
        await self.answering(scope, receive, send)

    def host_claim(self, scope: Scope) -> Claim | None:
        """What the request is by its headers (or the LLM prefix), whatever its path."""
        twice, target = addressing(scope["headers"], self.suffix)
        if twice:
            return Claim(repeated=twice)
        llm_path = self.llm.claims(scope) if self.llm is not None else None
        if llm_path is not None:
            return Claim(llm=llm_path)
        if target is not None:
            return Claim(transparent=target)
        return None

    def body_limit(self, scope: Scope) -> int:
        """For the request-context middleware around the answers: the claim's limit."""
        claim: Claim | None = scope.get(CLAIM)
        return UNBOUNDED if claim is not None and claim.llm is not None else self.max_body

"""One request on the inline invocation path (inline.py): what it holds from its start to its
end, the general path's record of it when it must become one, and the small answers the path
writes itself."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.auth import scopes
from service.auth.service import Authenticator, Principal
from service.backends.worker import WorkerExchange, WorkerFailed, WorkerResponse
from service.core.db import utcnow
from service.core.errors import DomainError
from service.core.front import Front
from service.core.numbers import natural
from service.invocation import answers
from service.invocation.dispatch import LocalDispatcher
from service.invocation.forward import (
    DEFAULT_POLL_SECONDS,
    poll_seconds,
    request_headers,
    response_headers,
)
from service.invocation.models import RequestState
from service.invocation.records import Invocation
from service.invocation.routing import InstanceRoute, Target
from service.invocation.service import InvocationPlane
from service.invocation.store import Outcome

X_REQUEST_ID = b"x-request-id"

#: what the inline path needs of a request, known without waiting
Ready = tuple[InvocationPlane, LocalDispatcher, Principal, Target, int]


@dataclass(eq=False, slots=True)
class InlineCall:
    """One request on the inline path."""

    plane: InvocationPlane
    dispatcher: LocalDispatcher
    principal: Principal
    target: Target
    instance: InstanceRoute
    request_id: str
    scope: Scope
    send: Send
    label: str
    started: float
    path: str
    body: bytes
    accepted: float
    deadline: float
    poll_at: float
    receive: Receive
    task: asyncio.Task[None] | None = None
    #: the HTTP status the caller got, once it got one
    status: int = 0
    #: set when the request was detached (the poll time passed)
    inv: Invocation | None = None
    pending: asyncio.Task[None] | None = None
    reply_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: the server's request cycle, when the request came by the express lane (answers are
    #: then written to the connection in one piece)
    cycle: RequestResponseCycle | None = None
    #: where the answer is written from callbacks: the front protocol, or the cycle
    wire: Front | None = None
    #: the worker request, when it was written without a task (`InlineInvocation.start`)
    exchange: WorkerExchange | None = None

    def headers(self) -> list[tuple[str, str]]:
        """The caller's headers for the worker (decoded, filtered)."""
        return request_headers(self.scope["headers"], ())

    def invocation(self, state: RequestState = RequestState.RUNNING) -> Invocation:
        """The general path's record of this request."""
        inv = Invocation(
            id=uuid.UUID(self.request_id),
            target=self.target,
            principal=self.principal,
            method=self.scope["method"],
            path=self.path,
            headers=self.headers(),
            body=self.body,
            created_at=utcnow(),
            accepted=self.accepted,
            deadline=self.deadline,
            state=state,
        )
        inv.task = self.task
        return inv


async def read_detached(plane: InvocationPlane, response: WorkerResponse) -> Outcome:
    """A detached request's answer, read whole (bounded by the result size)."""
    try:
        body = await response.read(plane.result_max)
    except WorkerFailed as exc:
        return Outcome.failure(502, f"the worker failed: {exc.reason}")
    finally:
        await response.aclose()
    return Outcome(response.status, tuple(response_headers(response.headers)), body)


async def discarded(message: Message) -> None:
    """The `send` of a request whose caller went away (as a disconnected cycle's)."""


async def disconnected() -> Message:
    """The `receive` of a request whose caller went away."""
    return {"type": "http.disconnect"}


async def unset(*args: Any) -> Any:
    """The `receive` and `send` of a request the front protocol took (it has none until it
    goes on with a cycle)."""
    raise RuntimeError("the request has no ASGI messages")


def outcome_message(
    outcome: Outcome, request_id: str
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    kept = [(k, v) for k, v in outcome.headers if k.lower() != "content-length"]
    headers = [
        *answers.encode_headers(kept),
        (b"content-length", str(len(outcome.body)).encode()),
        *answers.nvcf_headers(request_id, answers.status_word(outcome.status)),
    ]
    return outcome.status, headers, outcome.body


def header_index(headers: Sequence[tuple[bytes, bytes]]) -> dict[bytes, bytes] | None:
    """A request's headers by name, unless it names one twice."""
    index = dict(headers)
    return index if len(index) == len(headers) else None


def what_it_needs(
    state: Mapping[str, Any],
    body_limit: int,
    headers: Mapping[bytes, bytes],
    function_id: str,
    version_id: str | None,
) -> Ready | None:
    """What the inline path needs of a request without a query string, known without
    waiting; None: the general path's. `state`: the application's state, as a mapping;
    `headers` by (lower-cased) name (a request naming one twice is the general path's, see
    `header_index`)."""
    plane: InvocationPlane | None = state.get("invocation")
    if plane is None or not plane.accepting:
        return None
    dispatcher = plane.dispatcher
    if not isinstance(dispatcher, LocalDispatcher):
        return None
    if X_REQUEST_ID in headers or b"transfer-encoding" in headers or b"expect" in headers:
        return None
    length = headers.get(b"content-length")
    if length is not None and ((declared := natural(length)) is None or declared > body_limit):
        return None
    authorization = headers.get(b"authorization")
    poll = headers.get(b"nvcf-poll-seconds")
    auth: Authenticator = state["authenticator"]
    principal = auth.cached_principal(
        None if authorization is None else authorization.decode("latin-1")
    )
    if principal is None or scopes.INVOKE_FUNCTION not in principal.scopes:
        return None
    seconds = DEFAULT_POLL_SECONDS
    if poll is not None:
        try:
            seconds = poll_seconds(poll.decode("latin-1"))
        except DomainError:
            return None
    target = plane.routes.cached(principal, function_id, version_id)
    if target is None or target.rate is not None:
        return None
    return plane, dispatcher, principal, target, seconds

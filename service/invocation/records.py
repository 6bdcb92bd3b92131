"""What the invocation plane keeps of a request while it runs in this replica (`Invocation`),
what it hands the waiting HTTP handler (`Handoff`), and what polls and queue reads answer."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from service.auth.service import Principal
from service.backends.worker import WorkerResponse
from service.invocation.models import RequestState
from service.invocation.routing import InstanceRoute, Target
from service.invocation.store import Outcome


@dataclass
class Handoff:
    """The worker's answer handed to the waiting HTTP handler: a response to stream (the
    handler calls `InvocationPlane.finish_stream` when done), or the outcome of a failure."""

    response: WorkerResponse | None = None
    outcome: Outcome | None = None


@dataclass(eq=False)
class Invocation:
    id: uuid.UUID
    target: Target
    principal: Principal
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    created_at: datetime
    accepted: float
    deadline: float
    state: RequestState = RequestState.QUEUED
    instance: InstanceRoute | None = None
    detached: bool = False
    store_ok: bool = False
    outcome: Outcome | None = None
    handoff: asyncio.Future[Handoff] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    stored: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: asyncio.Event = field(default_factory=asyncio.Event)
    stream_error: str | None = None
    task: asyncio.Task[None] | None = None
    #: instances that refused the connection, and why (a request is retried once)
    tried: list[uuid.UUID] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @cached_property
    def rid(self) -> str:
        return str(self.id)


async def done_or_timeout(future: asyncio.Future[Handoff], seconds: float) -> None:
    """Wait until `future` is done or `seconds` have passed (`asyncio.wait` of one future,
    without its sets and counters: every request waits like this for its answer)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)


@dataclass(frozen=True)
class PollAnswer:
    """A status poll's answer: still pending (`state`), or the outcome."""

    request_id: uuid.UUID
    function_id: uuid.UUID
    version_id: uuid.UUID
    state: str
    outcome: Outcome | None


@dataclass(frozen=True)
class QueueInfo:
    version_id: uuid.UUID
    name: str
    status: str
    depth: int

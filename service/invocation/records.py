"""What the engine keeps of a request while it runs in this replica (`Run`), and what polls
and queue reads answer."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

from service.auth.service import Principal
from service.invocation.models import RequestState
from service.invocation.routing import InstanceRoute, Target
from service.invocation.store import Outcome

if TYPE_CHECKING:
    from service.assets.files import Progress, RequestFiles
    from service.assets.models import Asset
    from service.invocation.dispatch import Ticket
    from service.invocation.engine import Answer, Engine

log = logging.getLogger("nvcf.invocation")


@dataclass(eq=False)
class Run:
    """One request in this replica, from admission to `finish` (called exactly once: it
    releases the instance slot, writes the metrics and keeps the outcome for polls)."""

    engine: Engine
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
    ticket: Ticket | None = None
    #: the instance whose slot the request holds
    instance: InstanceRoute | None = None
    #: nobody waits for the answer: it is read whole and kept for polls
    detached: bool = False
    #: the entry went away before the answer came
    abandoned: bool = False
    store_ok: bool = False
    finished: bool = False
    outcome: Outcome | None = None
    stored: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Answer] | None = None
    #: instances that refused the connection, and why (a request is retried once)
    tried: list[uuid.UUID] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    #: the input assets, resolved at admission
    assets: list[Asset] = field(default_factory=list)
    #: the asset and output directories of a worker on this machine; removed by `finish`
    files: RequestFiles | None = None
    #: where the local store's signed URL of a large result points (the caller's base URL)
    base_url: Callable[[], str] | None = None
    #: the session this request resumes (`Engine.open`): its instance only, never retried
    session: uuid.UUID | None = None

    @cached_property
    def rid(self) -> str:
        return str(self.id)

    async def release(self) -> None:
        """Give the instance slot back (the next request in the queue takes it)."""
        instance, self.instance = self.instance, None
        if instance is not None:
            await self.engine.dispatcher.release(self.target, instance.id, self.id)

    async def set_state(self, state: RequestState) -> None:
        self.state = state
        if self.detached and self.store_ok and state == RequestState.RUNNING:
            try:
                await self.engine.store.save_state(self.id, state)
            except Exception:
                log.exception("storing the state of request %s failed", self.id)

    async def finish(self, outcome: Outcome) -> None:
        """The request ended with `outcome`: the only place a slot is released for good."""
        if self.finished:
            return
        self.finished = True
        engine = self.engine
        try:
            ticket, self.ticket = self.ticket, None
            if self.instance is None and ticket is not None and self.state == RequestState.QUEUED:
                ticket.cancel()  # still waiting in the queue: leave it
            await self.release()
        finally:
            files, self.files = self.files, None
            if files is not None:
                await files.remove()
            self.outcome = outcome
            elapsed = asyncio.get_running_loop().time() - self.accepted
            engine.metrics.answered(self.target, outcome.fulfilled, elapsed)
            self.done.set()
            try:
                if self.detached:
                    await self.stored.wait()
                    if self.store_ok:
                        try:
                            await engine.store.save_outcome(self.id, outcome)
                        except Exception:
                            log.exception("storing the outcome of request %s failed", self.id)
            finally:
                engine.active.pop(self.id, None)


@dataclass(frozen=True)
class PollAnswer:
    """A status poll's answer: still pending (`state`), or the outcome."""

    request_id: uuid.UUID
    function_id: uuid.UUID
    version_id: uuid.UUID
    state: str
    outcome: Outcome | None
    #: the worker's last progress report while pending (a worker on this machine)
    progress: Progress | None = None


@dataclass(frozen=True)
class QueueInfo:
    version_id: uuid.UUID
    name: str
    status: str
    depth: int

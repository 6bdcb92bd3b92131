"""One request in this replica (`Run`, engine.py's corridor runs it) and the answers an entry
gets of it: `Streamed` and `Opened` hold the request until their `close` (`async with`), which
finishes it; `Finished` and `Detached` hold nothing."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar

from service.assets.files import WorkerFiles
from service.auth.service import Principal
from service.backends.worker import WorkerFailed, WorkerResponse
from service.invocation.dispatch import Dispatcher, Ticket
from service.invocation.metrics import InvocationMetrics, Timeline
from service.invocation.models import RequestState
from service.invocation.routing import InstanceRoute, Target
from service.invocation.sessions import Sessions
from service.invocation.store import Outcome, RequestStore
from service.observability.events import TraceIds

if TYPE_CHECKING:
    from service.assets.models import Asset

log = logging.getLogger("nvcf.invocation")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Desk:
    """What a run reports to when it changes and when it ends (the engine's)."""

    dispatcher: Dispatcher
    store: RequestStore
    metrics: InvocationMetrics
    sessions: Sessions
    #: the requests running in this replica (polls read it)
    active: dict[uuid.UUID, Run]


class Streamed:
    """The worker answered: its status and head now, the body as it arrives. `close` must
    be called (or `async with`): it releases the instance's slot."""

    def __init__(
        self, run: Run, response: WorkerResponse, head: tuple[list[tuple[bytes, bytes]], int | None]
    ) -> None:
        self.run = run
        self.request_id = run.id
        self.status = response.status
        self.headers, self.length = head
        if response.status in (204, 304):
            self.length = 0  # no body follows, whatever the worker declared
        self._response = response

    @property
    def target(self) -> Target:
        return self.run.target

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (`WorkerFailed` when the worker breaks off or takes longer
        than the request's deadline)."""
        whole = self._response.complete_body()
        if whole is not None:  # already here: no deadline to watch
            if whole:
                yield whole
            return
        try:
            async with asyncio.timeout_at(self.run.deadline):
                async for chunk in self._response.iter_bytes():
                    yield chunk
        except TimeoutError:
            raise WorkerFailed("the worker did not finish its answer in time") from None

    async def read(self, limit: int) -> tuple[bytes, str | None]:
        """The whole body, at most `limit` bytes, and why it stopped short (None: it did not);
        the answer is closed."""
        parts: list[bytes] = []
        size = 0
        error: str | None = None
        try:
            async for chunk in self.chunks():
                size += len(chunk)
                if size > limit:
                    error = f"the worker's response exceeds {limit} bytes"
                    break
                parts.append(chunk)
        except WorkerFailed as exc:
            error = exc.reason
        except BaseException as exc:  # the caller went away (cancelled), or worse
            error = f"{type(exc).__name__} while reading the answer"
            raise
        finally:
            await self.close(error)
        return b"".join(parts), error

    async def close(self, error: str | None = None) -> None:
        """The caller has the answer (`error`: why it stopped short)."""
        if self.run.finished:
            return
        status = self.status
        outcome = Outcome(status) if error is None else Outcome(status, error=error)
        try:
            await self._response.aclose()
        finally:  # the slot is released even if this is cancelled (the caller went away)
            await self.run.finish(outcome)

    async def __aenter__(self) -> Streamed:
        return self

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            why = None
        elif isinstance(exc, WorkerFailed):
            why = exc.reason
        else:
            why = f"{type(exc).__name__} while streaming the answer"
        await self.close(why)


class Opened(Generic[T]):
    """An exchange an entry opened with the worker (`Engine.open`); `close` must be called:
    it releases the instance's slot."""

    def __init__(self, run: Run, value: T, joined: asyncio.Future[None]) -> None:
        self.run = run
        #: the session's id (the first call's), which a later call may resume
        self.request_id = run.session or run.id
        self.value = value
        #: done once every replica can resume the session (before the caller learns its id)
        self.joined = joined

    @property
    def target(self) -> Target:
        return self.run.target

    @property
    def instance(self) -> InstanceRoute | None:
        return self.run.instance

    async def close(self, status: int, error: str | None = None) -> None:
        """The exchange ended with `status` (the entry's own, e.g. HTTP-like 200/502)."""
        if not self.run.finished:
            self.run.desk.sessions.leave(self.request_id, self.run.id)
        await self.run.finish(Outcome(status) if error is None else Outcome(status, error=error))


@dataclass(frozen=True, slots=True)
class Finished:
    """No stream: the whole answer, or why there is none (`outcome.error`)."""

    request_id: uuid.UUID
    outcome: Outcome
    #: `Engine.open` only: no instance took the call in time (the queue timeout, or the
    #: deadline while waiting for one)
    no_instance: bool = False


@dataclass(frozen=True, slots=True)
class Detached:
    """Not answered within the poll time: it keeps running; the caller polls."""

    request_id: uuid.UUID


Answer = Streamed | Finished | Detached


@dataclass(eq=False)
class Run:
    """One request in this replica, from admission to `finish` (called exactly once: it
    releases the instance slot, writes the metrics and keeps the outcome for polls)."""

    desk: Desk
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
    #: the asset and output directories (made here, or by the sidecar); removed by `finish`
    files: WorkerFiles | None = None
    #: where the local store's signed URL of a large result points (the caller's base URL)
    base_url: Callable[[], str] | None = None
    #: the session this request resumes (`Engine.open`): its instance only, never retried
    session: uuid.UUID | None = None
    #: the model the request is metered under (`Admitted.model`)
    model: str = ""
    #: when admission began, and when an instance first took the request (loop clock)
    began: float = 0.0
    dispatched: float | None = None
    #: the exported trace's ids, sent to the worker (a version naming a traces telemetry)
    trace: TraceIds | None = None

    @cached_property
    def rid(self) -> str:
        return str(self.id)

    async def release(self) -> None:
        """Give the instance slot back (the next request in the queue takes it)."""
        instance, self.instance = self.instance, None
        if instance is not None:
            await self.desk.dispatcher.release(self.target, instance.id, self.id)

    async def set_state(self, state: RequestState) -> None:
        self.state = state
        if self.detached and self.store_ok and state == RequestState.RUNNING:
            try:
                await self.desk.store.save_state(self.id, state)
            except Exception:
                log.exception("storing the state of request %s failed", self.id)

    async def finish(self, outcome: Outcome) -> None:
        """The request ended with `outcome`: the only place a slot is released for good."""
        if self.finished:
            return
        self.finished = True
        desk = self.desk
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
            now = asyncio.get_running_loop().time()
            timeline = Timeline(
                self.began or self.accepted, self.accepted, self.dispatched, now, self.trace
            )
            desk.metrics.answered(
                self.target, outcome.fulfilled, now - self.accepted, self.model, timeline
            )
            self.done.set()
            try:
                if self.detached:
                    await self.stored.wait()
                    if self.store_ok:
                        try:
                            await desk.store.save_outcome(self.id, outcome)
                        except Exception:
                            log.exception("storing the outcome of request %s failed", self.id)
            finally:
                desk.active.pop(self.id, None)

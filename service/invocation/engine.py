"""The invocation engine: every entry (the HTTP routes, gRPC, the LLM gateway) runs its
requests through `Engine.invoke`, and knows nothing of how they run.

A request goes through five steps:

1. **admit** — the version resolved (routing.py, shared functions included), the entry's own
   check, the function's rate limit counted, a claim on an instance taken in the version's
   queue (dispatch.py); any refusal is a `DomainError` and changes nothing;
2. **acquire** — the claim waits for an instance slot (at most the queue timeout);
3. **send** — the request goes to the instance's worker; a refused connection is retried
   once on another instance (never the same one);
4. the worker's head arrives: the caller streams it (`Streamed`), or, when nobody waits any
   more (the poll time passed: `Detached`), the whole answer is read and kept for polls;
   a failure on the way is a `Finished` with the platform's status (502/503/504);
5. **finish** — `Run.finish`: the slot released, metrics written, the outcome kept (for a
   detached request) — once, whatever happened: in `Engine._held`'s `finally`, or, once an
   answer holds the request (`Streamed`, `Opened`), in the answer's `close` (`async with`).

Steps 2–4 run in a task of their own, so that a request outlives its caller's poll time;
the entry waits for that task up to `Call.poll_seconds`. What ended a request early becomes
its outcome in one place (`Engine.finished_by`). Asset work (a request's files, a large answer,
progress) is behind one port, `AssetPort` (service/assets/requests.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from service.assets.files import REFERENCES_HEADER, Progress, WorkerFiles
from service.assets.requests import FilesRefused, Kept, Whole
from service.auth.service import Principal
from service.backends.protocol import AdapterError
from service.backends.worker import (
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
)
from service.clusters.adapters import AdapterRegistry
from service.core.db import utcnow
from service.core.errors import (
    BadRequest,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)
from service.invocation.dispatch import Dispatcher, QueueTimeout, Ticket
from service.invocation.forward import (
    caller_headers,
    header_text,
    request_target_safe,
    worker_request_headers,
)
from service.invocation.metrics import InvocationMetrics
from service.invocation.models import RequestState
from service.invocation.ratelimit import FunctionRateLimiter
from service.invocation.routing import InstanceRoute, RouteTable, Target
from service.invocation.run import Answer, Desk, Detached, Finished, Opened, Run, Streamed
from service.invocation.sessions import LocalSessions, Sessions
from service.invocation.store import Outcome, RequestStore
from service.observability.events import TraceIds, traced

if TYPE_CHECKING:
    from service.assets.models import Asset
    from service.core.settings import Settings

log = logging.getLogger("nvcf.invocation")
T = TypeVar("T")
#: what an answer that holds the request is (`Streamed`, `Opened`)
H = TypeVar("H")
#: the inferenceUrl of a gRPC function (NVCF): it is invoked on the gRPC entry only
GRPC_PATH = "/gRPC"
#: W3C Trace Context's headers: a traced run's worker gets the platform's, not the caller's
_TRACE_CONTEXT = frozenset({"traceparent", "tracestate"})


def is_grpc(target: Target) -> bool:
    """A gRPC function: its inferenceUrl is /gRPC (as functions/validation.py reads it)."""
    return target.inference_path.strip("/").lower() == "grpc"


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """What an entry asks the engine to run."""

    principal: Principal
    function_id: uuid.UUID
    version_id: uuid.UUID | None
    method: str
    #: None: the version's inferenceUrl; otherwise forwarded as it is (printable ASCII only)
    path: str | None
    #: the caller's headers as received; hop-by-hop ones, Host, Content-Length,
    #: Authorization and the NVCF-* headers the engine sets are not forwarded
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes
    request_id: uuid.UUID = field(default_factory=uuid.uuid4)
    #: how long the entry waits for the worker's answer before `Detached`; None: never detach
    poll_seconds: float | None = None
    #: two ids of a Host may be in either order (transparent mode)
    swap_ids: bool = False
    #: headers the entry adds to the worker's request
    worker_headers: Sequence[tuple[str, str]] = ()
    #: the entry's own admission of the resolved version: raises a DomainError to refuse
    #: it, may say what the entry decides of it (`Admitted`)
    check: Callable[[Target], Awaitable[Admitted | None]] | None = None
    #: input assets (NVCF-INPUT-ASSET-REFERENCES): resolved at admission (400 naming every
    #: bad one), fetched into the request's NVCF-ASSET-DIR before it reaches the worker
    asset_ids: Sequence[uuid.UUID] = ()
    #: what the refusal of a bad reference names (the header, or exec's field)
    asset_field: str = REFERENCES_HEADER
    #: the caller's base URL (asked only for a large result): where the local store's signed
    #: URL of one points
    base_url: Callable[[], str] | None = None
    #: `open` only: resume the live session with this request id — its instance takes the
    #: request (NotFound when the session is not live: sessions.py)
    session: uuid.UUID | None = None
    #: the session the request belongs to (the LLM gateway's session key): a function's
    #: traffic split puts its requests on one version (routing.py, `Split.pick`); else the
    #: gRPC session, else the request's own id
    affinity: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """What an entry's check (`Call.check`) decides of the version it admits."""

    #: instances the entry would have serve the request, best first (the first with a free
    #: slot takes it; none free: the least loaded) — the LLM gateway's sessions
    prefer: Sequence[uuid.UUID] = ()
    #: where the request waits in the version's queue: lower first, None after every
    #: priority (the LLM gateway's llmInvocationConfig.priority)
    priority: int | None = None
    #: the path forwarded instead of the call's (printable ASCII only)
    path: str | None = None
    #: headers the entry adds to the worker's request, after the call's
    worker_headers: Sequence[tuple[str, str]] = ()
    #: the model the request is metered under (the LLM gateway's; "" for others)
    model: str = ""


_NOTHING = Admitted()


class AssetPort(Protocol):
    """The engine's one port to asset work (service/assets/requests.py implements it)."""

    async def resolve(self, account_id: str, ids: Sequence[uuid.UUID], field: str) -> list[Asset]:
        """Admission: the input assets (a 400 naming every bad one)."""

    async def prepare(
        self,
        request_id: uuid.UUID,
        inputs: Sequence[Asset],
        cluster: str,
        instance_key: str,
        endpoint: WorkerEndpoint,
        base_url: Callable[[], str] | None,
    ) -> WorkerFiles | None:
        """Send: the request's directories for its instance (`FilesRefused`)."""

    async def large(
        self,
        request_id: uuid.UUID,
        files: WorkerFiles,
        response: WorkerResponse,
        length: int | None,
        *,
        detached: bool,
        base_url: Callable[[], str] | None,
    ) -> Kept | Whole | None:
        """The worker's head: a large answer kept, one read whole, or None (`FilesRefused`)."""

    def publish(
        self,
        request_id: uuid.UUID,
        done: asyncio.Event,
        files: Callable[[], WorkerFiles | None],
        save: Callable[[uuid.UUID, Progress], Awaitable[None]],
    ) -> None:
        """Detached: the request's progress `save`d until `done`."""

    async def aclose(self) -> None:
        """The replica stops."""


#: `Engine.open`'s way of opening an exchange with a worker
Opener = Callable[[WorkerEndpoint, list[tuple[str, str]]], Awaitable[T]]


class Engine:
    """Runs invocations (see the module docstring); `active` holds the requests running in
    this replica (polls read it)."""

    def __init__(
        self,
        settings: Settings,
        routes: RouteTable,
        limiter: FunctionRateLimiter,
        dispatcher: Dispatcher,
        store: RequestStore,
        adapters: AdapterRegistry,
        metrics: InvocationMetrics,
        owner: str,
        assets: AssetPort,
        sessions: Sessions | None = None,
    ) -> None:
        self.routes = routes
        #: input assets, per-request directories, large results and progress
        self.assets = assets
        self.limiter = limiter
        self.dispatcher = dispatcher
        self.store = store
        self.adapters = adapters
        self.metrics = metrics
        self.owner = owner
        self.queue_timeout = settings.invoke_queue_timeout_seconds
        self.worker_timeout = settings.invoke_worker_timeout_seconds
        self.result_max = settings.invoke_result_max_bytes
        self.max_references = settings.asset_max_references
        self._max_size = ("NVCF-MAX-RESPONSE-SIZE-BYTES", str(self.result_max))
        self.active: dict[uuid.UUID, Run] = {}
        #: the gRPC entry's sessions (sessions.py)
        self.sessions = sessions or LocalSessions(settings.grpc_session_idle_seconds)
        self.desk = Desk(dispatcher, store, metrics, self.sessions, self.active)
        self.stopping = False

    # ------------------------------------------------------------------ the entry's call

    async def invoke(self, call: Call) -> Answer:
        """Run one request: its answer when the worker answers within `call.poll_seconds`,
        else `Detached`. Raises the `DomainError` that refuses it at admission. Cancelled
        before it returns (the caller went away), the request ends there, 499."""
        run = await self.admit(call)
        task = asyncio.get_running_loop().create_task(self._held(run, self._answer))
        run.task = task
        poll = call.poll_seconds
        try:
            if not task.done():
                await _done_or_timeout(task, math.inf if poll is None else poll)
        except asyncio.CancelledError:
            # the caller went away (answers.Attended): nobody can ever take the answer, nor
            # poll for it (it never learnt the request's id) — the request ends now
            run.abandoned = True
            task.cancel()
            task.add_done_callback(_close_abandoned)  # an answer that came all the same
            raise
        if task.done():
            return task.result()
        run.detached = True
        await self._store_pending(run)
        self.assets.publish(run.id, run.done, lambda: run.files, self.store.save_progress)
        return Detached(run.id)

    async def open(self, call: Call, opener: Opener[T]) -> Opened[T] | Finished:
        """Admit, acquire and open the entry's own exchange with the worker (gRPC: a call on
        a channel to the instance), for an entry that never detaches. `opener(endpoint,
        headers)` gets the instance's endpoint and the NVCF-* headers and raises
        `WorkerUnreachable` when nothing reached the worker (tried once more elsewhere).
        Failures after admission are `Finished`; `Opened.close` releases the slot. A live
        session (the first call's request id, sessions.py) may be resumed: `Call.session`
        sends the request to the same instance."""
        run = await self.admit(call, http=False, session=call.session)

        async def send(run: Run, instance: InstanceRoute) -> T:
            endpoint = await self.endpoint_of(run.target, instance)
            return await opener(endpoint, self.worker_headers(run, instance))

        async def opened(run: Run) -> Opened[T]:
            async with asyncio.timeout_at(run.deadline):
                value = await self._exchange(run, send)
            assert run.instance is not None
            joined = self.sessions.join(run.session or run.id, run.instance.id, run.id)
            return Opened(run, value, joined)

        return await self._held(run, opened)

    # ------------------------------------------------------------------ 1. admit

    async def admit(
        self, call: Call, *, http: bool = True, session: uuid.UUID | None = None
    ) -> Run:
        """Step 1 (`http`: the request is sent as HTTP, which a gRPC function cannot take)."""
        if self.stopping:
            raise ServiceUnavailable(detail="this replica is shutting down; retry")
        began = asyncio.get_running_loop().time()
        _forwardable(call.path)
        target = await self._resolve(call)
        admitted = (await call.check(target) if call.check is not None else None) or _NOTHING
        _forwardable(admitted.path)
        if http and is_grpc(target):
            raise BadRequest(
                detail=f"function {target.function_id} is a gRPC function (inferenceUrl "
                f"{GRPC_PATH}): invoke it on the gRPC endpoint, not over HTTP"
            )
        exclude: list[uuid.UUID] = []
        if session is not None:
            exclude = await self.sessions.others(session, target)
        principal = call.principal
        assets = (
            await self.assets.resolve(principal.account_id, call.asset_ids, call.asset_field)
            if call.asset_ids
            else []
        )
        if target.rate is not None:
            try:
                await self.limiter.check(
                    target.rate,
                    account=principal.account_id,
                    subject=principal.subject,
                    version_id=target.vid,
                )
            except TooManyRequests:
                self.metrics.refused(target, "rate_limited")
                raise
        now = asyncio.get_running_loop().time()
        path = admitted.path if admitted.path is not None else call.path
        extra = admitted.worker_headers
        run = Run(
            desk=self.desk,
            id=call.request_id,
            target=target,
            principal=principal,
            method=call.method,
            path=path if path is not None else target.inference_path,
            headers=worker_request_headers(
                call.headers, [*call.worker_headers, *extra] if extra else call.worker_headers
            ),
            body=call.body,
            created_at=utcnow(),
            accepted=now,
            deadline=now + self.worker_timeout,
            assets=assets,
            base_url=call.base_url,
            session=session,
            model=admitted.model,
            began=began,
            trace=TraceIds.new() if traced(target.telemetries) else None,
        )
        try:
            run.ticket = await self.dispatcher.enqueue(
                run.id, target, exclude=exclude, prefer=admitted.prefer, priority=admitted.priority
            )
        except TooManyRequests:
            self.metrics.refused(target, "queue_full")
            raise
        self.active[run.id] = run
        return run

    async def _resolve(self, call: Call) -> Target:
        fid, vid = call.function_id, call.version_id
        key = call.affinity or str(call.session or call.request_id)
        try:
            return await self.routes.resolve(call.principal, fid, vid, key)
        except NotFound:
            if not call.swap_ids or vid is None:
                raise
            return await self.routes.resolve(call.principal, vid, fid, key)

    # ------------------------------------------------------------------ 2–5. the run

    async def _held(self, run: Run, steps: Callable[[Run], Awaitable[H | Outcome]]) -> H | Finished:
        """Steps 2–4 (`steps`: an answer that holds the run, or its whole outcome), and step
        5 here, once, whatever happens — unless an answer holds the run: its `close` is the
        hand-over."""
        finished: Finished | None = None
        cancelled = False
        try:
            answer = await steps(run)
            if not isinstance(answer, Outcome):
                return answer
            finished = Finished(run.id, answer)
        except BaseException as exc:
            finished = self.finished_by(run, exc)
            cancelled = not isinstance(exc, Exception)
            if cancelled:
                raise
        finally:
            if finished is not None:
                finishing = run.finish(finished.outcome)
                # cancelled: a second cancellation must not stop the slot's release
                await (asyncio.shield(finishing) if cancelled else finishing)
        return finished

    def finished_by(self, run: Run, exc: BaseException) -> Finished:
        """What ended a run before an answer held it, as its outcome (the only mapping)."""
        no_instance = False
        if isinstance(exc, _Failed):
            outcome, no_instance = exc.outcome, isinstance(exc, _NoInstance)
        elif isinstance(exc, FilesRefused):
            outcome = Outcome.failure(exc.status, exc.reason)
        elif isinstance(exc, TimeoutError):
            outcome = Outcome.failure(
                504, f"the worker did not answer within {self.worker_timeout:g} s"
            )
            no_instance = run.instance is None
        elif isinstance(exc, WorkerFailed):
            outcome = Outcome.failure(502, f"the worker failed: {exc.reason}")
        elif not isinstance(exc, Exception):  # cancelled
            # a run without a task of its own (`open`) is cancelled by its caller only
            if run.abandoned or run.task is None:
                outcome = Outcome.failure(499, "the caller went away")
            else:
                reason = f"the replica {self.owner} running the request shut down"
                outcome = Outcome.failure(503, reason)
        else:  # never leave a request without an outcome
            log.error("invocation %s failed", run.id, exc_info=exc)
            outcome = Outcome.failure(502, f"the request failed: {type(exc).__name__}")
        return Finished(run.id, outcome, no_instance)

    async def _answer(self, run: Run) -> Streamed | Outcome:
        """The worker's answer to stream to the caller, or its whole outcome (a large one
        kept; a detached request's read)."""
        async with asyncio.timeout_at(run.deadline):
            response = await self._exchange(run, self._send)
            head = caller_headers(response.raw_headers)
            if run.files is not None:
                kept = await self.assets.large(
                    run.id,
                    run.files,
                    response,
                    head[1],
                    detached=run.detached,
                    base_url=run.base_url,
                )
                if isinstance(kept, Kept):
                    return Outcome(302, ((b"location", kept.url.encode("latin-1")),))
                if isinstance(kept, Whole):
                    return Outcome(response.status, tuple(head[0]), kept.body)
            if run.detached:
                try:
                    body = await response.read(self.result_max)
                finally:
                    await response.aclose()
                return Outcome(response.status, tuple(head[0]), body)
        return Streamed(run, response, head)

    async def _exchange(self, run: Run, send: Callable[[Run, InstanceRoute], Awaitable[T]]) -> T:
        """Acquire an instance and `send`; once more on another when the first refused
        (`send` raised `WorkerUnreachable`)."""
        target = run.target
        ticket = run.ticket
        assert ticket is not None
        while True:
            remaining = max(0.0, run.deadline - asyncio.get_running_loop().time())
            try:
                instance = await ticket.wait(min(self.queue_timeout, remaining))
            except QueueTimeout:
                raise _NoInstance(
                    503,
                    f"no instance of function version {target.version_id} took the request "
                    f"within {self.queue_timeout:g} s",
                ) from None
            run.instance = instance
            if run.dispatched is None:
                run.dispatched = asyncio.get_running_loop().time()
            await run.set_state(RequestState.RUNNING)
            try:
                return await send(run, instance)
            except WorkerUnreachable as exc:
                run.reasons.append(f"instance {instance.id}: {exc.reason}")
                run.tried.append(instance.id)
                await run.release()
            target, ticket = await self._retry(run, target)

    async def _send(self, run: Run, instance: InstanceRoute) -> WorkerResponse:
        endpoint = await self.endpoint_of(run.target, instance)
        if run.files is None:
            run.files = await self.assets.prepare(
                run.id, run.assets, instance.cluster, instance.key, endpoint, run.base_url
            )
        return await endpoint.send(
            run.method, run.path, self.worker_headers(run, instance), run.body
        )

    def worker_headers(self, run: Run, instance: InstanceRoute) -> list[tuple[str, str]]:
        """The worker request's headers: the caller's (filtered) and the NVCF-* ones; a traced
        run's `traceparent` names its exported worker span (the caller's is replaced)."""
        caller = run.headers
        traced_by: tuple[tuple[str, str], ...] = ()
        if run.trace is not None:
            caller = [(k, v) for k, v in caller if k.lower() not in _TRACE_CONTEXT]
            traced_by = (("traceparent", run.trace.traceparent),)
        return [
            *caller,
            *traced_by,
            ("NVCF-REQID", str(run.session) if run.session is not None else run.rid),
            ("NVCF-SUB", header_text(run.principal.subject)),
            self._max_size,
            *run.target.nvcf_headers,
            *instance.nvcf_headers,
            *(run.files.worker_headers() if run.files is not None else ()),
        ]

    async def endpoint_of(self, target: Target, instance: InstanceRoute) -> WorkerEndpoint:
        """Where the instance's worker answers (`WorkerUnreachable` when nobody can say)."""
        adapter = self.adapters.get(instance.cluster)
        if adapter is None:
            raise WorkerUnreachable(
                self.adapters.unavailable_reason(instance.cluster) or "no adapter"
            )
        try:
            return await adapter.endpoint(target.instance_spec(instance), target.port)
        except AdapterError as exc:
            raise WorkerUnreachable(exc.message) from exc

    async def _retry(self, run: Run, target: Target) -> tuple[Target, Ticket]:
        """After an instance refused the connection: the target and the claim to try again
        with — at the head of the queue, never on an instance that refused — or `_Failed`
        when there is nobody else to try."""
        if run.session is not None:
            raise _Failed(502, "the session's worker could not be reached: " + run.reasons[-1])
        fresh = await self.routes.refresh(run.principal, target)
        others = [i for i in (fresh or target).instances if i.id not in run.tried]
        # scaled to zero meanwhile: wait in the queue for the next instance
        cold = fresh is not None and not fresh.instances and len(run.tried) == 1
        if not cold and (len(run.tried) > 1 or not others):
            raise _Failed(502, "the worker could not be reached: " + "; ".join(run.reasons))
        target = fresh or target
        run.ticket = await self.dispatcher.enqueue(run.id, target, exclude=run.tried, front=True)
        return target, run.ticket

    # ------------------------------------------------------------------ detached requests

    async def _store_pending(self, run: Run) -> None:
        """Store a detached request as pending, for polling (`ServiceUnavailable` when the
        database refuses: the request keeps running, nobody can poll it)."""
        try:
            await self.store.save_pending(
                run.id,
                account_id=run.principal.account_id,
                function_id=run.target.function_id,
                version_id=run.target.version_id,
                state=run.state,
                created_at=run.created_at,
            )
            run.store_ok = True
        except Exception as exc:
            log.exception("storing pending request %s failed", run.id)
            raise ServiceUnavailable(
                detail="the request is running but its state could not be stored for polling "
                f"({type(exc).__name__}); retry"
            ) from exc
        finally:
            run.stored.set()

    async def stop(self) -> None:
        """Requests still running here end errored (their callers may poll that)."""
        self.stopping = True
        running = [run.task for run in self.active.values() if run.task is not None]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        reason = f"the replica {self.owner} running the request shut down"
        for run in list(self.active.values()):  # a task cancelled before it began
            await run.finish(Outcome.failure(503, reason))
        await self.assets.aclose()


class _Failed(Exception):
    """The request ends without a worker's answer: `outcome` says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.outcome = Outcome.failure(status, reason)


class _NoInstance(_Failed):
    """No instance took the request within the queue timeout."""


def _forwardable(path: str | None) -> None:
    if path is not None and not request_target_safe(path):
        raise BadRequest(
            detail="the path cannot be forwarded to the function: it must be sent "
            "percent-encoded, with no control characters, spaces or non-ASCII bytes"
        )


def _close_abandoned(task: asyncio.Task[Streamed | Finished]) -> None:
    """The entry went away while waiting: an answer that came all the same is closed."""
    if task.cancelled() or task.exception() is not None:
        return
    answer = task.result()
    if isinstance(answer, Streamed):
        asyncio.get_running_loop().create_task(answer.close("the caller went away"))


async def _done_or_timeout(future: asyncio.Future[Streamed | Finished], seconds: float) -> None:
    """Wait until `future` is done or `seconds` have passed (`asyncio.wait` of one future
    without its sets: every request waits like this for its answer)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(seconds, wake) if seconds != math.inf else None
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        future.remove_done_callback(wake)

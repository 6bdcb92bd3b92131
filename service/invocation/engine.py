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
   detached request) — once, whatever happened.

Steps 2–4 run in a task of their own, so that a request outlives its caller's poll time;
the entry waits for that task up to `Call.poll_seconds`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar

from service.assets.files import (
    REFERENCES_HEADER,
    OutputDirs,
    RequestFiles,
    TooManyOutputs,
    WorkerFiles,
)
from service.assets.results import ResultTooLarge, store_result
from service.assets.sidecar import SidecarFiles, SidecarRefused
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
    DomainError,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)
from service.invocation import progress
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
from service.invocation.sessions import LocalSessions, Sessions
from service.invocation.store import Outcome, RequestStore

if TYPE_CHECKING:
    from service.assets.models import Asset
    from service.assets.service import Assets
    from service.core.settings import Settings

log = logging.getLogger("nvcf.invocation")
T = TypeVar("T")
#: the inferenceUrl of a gRPC function (NVCF): it is invoked on the gRPC entry only
GRPC_PATH = "/gRPC"


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
    #: the entry's own admission check of the resolved version (raises a DomainError)
    check: Callable[[Target], None] | None = None
    #: instances the entry would have serve the request, best first (the first with a free
    #: slot takes it; none free: the least loaded) — the LLM gateway's sessions
    prefer: Sequence[uuid.UUID] = ()
    #: where the request waits in the version's queue: lower first, None after every
    #: priority (the LLM gateway's llmInvocationConfig.priority)
    priority: int | None = None
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
            self.run.engine.sessions.leave(self.request_id, self.run.id)
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
        assets: Assets | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        self.routes = routes
        #: assets, per-request directories and large results (service/assets/); None: none
        self.assets = assets
        self.files_root = settings.asset_files_root
        #: output directories of workers on this machine, reused per instance
        self.output_dirs = OutputDirs(self.files_root / "output")
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
        #: progress reports of detached requests, stored for polls on other replicas
        self.progress_period = settings.invoke_progress_period_seconds
        self._publishers: set[asyncio.Task[None]] = set()
        self.stopping = False

    # ------------------------------------------------------------------ the entry's call

    async def invoke(self, call: Call) -> Answer:
        """Run one request: its answer when the worker answers within `call.poll_seconds`,
        else `Detached`. Raises the `DomainError` that refuses it at admission. Cancelled
        before it returns (the caller went away), the request ends there, 499."""
        run = await self.admit(call)
        task = asyncio.get_running_loop().create_task(self._run(run))
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
        if self.assets is not None and self.progress_period > 0:
            publisher = asyncio.get_running_loop().create_task(
                progress.publish(
                    run.id, run.done, lambda: run.files, self.store, self.progress_period
                )
            )
            self._publishers.add(publisher)
            publisher.add_done_callback(self._publishers.discard)
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

        try:
            no_instance = False
            try:
                async with asyncio.timeout_at(run.deadline):
                    value = await self._exchange(run, send)
            except TimeoutError:
                no_instance = run.instance is None
                failure = Outcome.failure(
                    504, f"the worker did not answer within {self.worker_timeout:g} s"
                )
            except WorkerFailed as exc:
                failure = Outcome.failure(502, f"the worker failed: {exc.reason}")
            except _Failed as exc:
                no_instance = isinstance(exc, _NoInstance)
                failure = exc.outcome
            else:
                assert run.instance is not None
                joined = self.sessions.join(run.session or run.id, run.instance.id, run.id)
                return Opened(run, value, joined)
        except BaseException:
            await asyncio.shield(run.finish(Outcome.failure(499, "the caller went away")))
            raise
        await run.finish(failure)
        return Finished(run.id, failure, no_instance)

    # ------------------------------------------------------------------ 1. admit

    async def admit(
        self, call: Call, *, http: bool = True, session: uuid.UUID | None = None
    ) -> Run:
        """Step 1 (`http`: the request is sent as HTTP, which a gRPC function cannot take)."""
        if self.stopping:
            raise ServiceUnavailable(detail="this replica is shutting down; retry")
        if call.path is not None and not request_target_safe(call.path):
            raise BadRequest(
                detail="the path cannot be forwarded to the function: it must be sent "
                "percent-encoded, with no control characters, spaces or non-ASCII bytes"
            )
        target = await self._resolve(call)
        if call.check is not None:
            call.check(target)
        if http and is_grpc(target):
            raise BadRequest(
                detail=f"function {target.function_id} is a gRPC function (inferenceUrl "
                f"{GRPC_PATH}): invoke it on the gRPC endpoint, not over HTTP"
            )
        exclude: list[uuid.UUID] = []
        if session is not None:
            exclude = await self.sessions.others(session, target)
        principal = call.principal
        assets = await self._input_assets(call) if call.asset_ids else []
        if target.rate is not None:
            try:
                await self.limiter.check(
                    target.rate,
                    account=principal.account_id,
                    subject=principal.subject,
                    version_id=target.vid,
                )
            except TooManyRequests:
                self.metrics.outcome(target.fid, target.vid, "rate_limited")
                raise
        now = asyncio.get_running_loop().time()
        run = Run(
            engine=self,
            id=call.request_id,
            target=target,
            principal=principal,
            method=call.method,
            path=call.path if call.path is not None else target.inference_path,
            headers=worker_request_headers(call.headers, call.worker_headers),
            body=call.body,
            created_at=utcnow(),
            accepted=now,
            deadline=now + self.worker_timeout,
            assets=assets,
            base_url=call.base_url,
            session=session,
        )
        try:
            run.ticket = await self.dispatcher.enqueue(
                run.id, target, exclude=exclude, prefer=call.prefer, priority=call.priority
            )
        except TooManyRequests:
            self.metrics.outcome(target.fid, target.vid, "queue_full")
            raise
        self.active[run.id] = run
        return run

    async def _input_assets(self, call: Call) -> list[Asset]:
        """The referenced assets, each the caller's, unexpired and uploaded (400 naming every
        one that is not)."""
        if self.assets is None:
            raise ServiceUnavailable(detail="assets are not served by this process")
        async with self.store.sessionmaker() as session, session.begin():
            return await self.assets.resolve(
                session, call.principal.account_id, call.asset_ids, call.asset_field
            )

    async def _resolve(self, call: Call) -> Target:
        fid, vid = call.function_id, call.version_id
        try:
            return await self.routes.resolve(call.principal, fid, vid)
        except NotFound:
            if not call.swap_ids or vid is None:
                raise
            return await self.routes.resolve(call.principal, vid, fid)

    # ------------------------------------------------------------------ 2–4. the task

    async def _run(self, run: Run) -> Streamed | Finished:
        try:
            try:
                async with asyncio.timeout_at(run.deadline):
                    response = await self._exchange(run, self._send)
                    head = caller_headers(response.raw_headers)
                    large = (
                        await self._large(run, response, head[1]) if run.files is not None else None
                    )
            except TimeoutError:
                failure = Outcome.failure(
                    504, f"the worker did not answer within {self.worker_timeout:g} s"
                )
            except WorkerFailed as exc:
                failure = Outcome.failure(502, f"the worker failed: {exc.reason}")
            except _Failed as exc:
                failure = exc.outcome
            else:
                if large is not None:
                    await run.finish(large)
                    return Finished(run.id, large)
                if not run.detached:
                    return Streamed(run, response, head)
                return Finished(run.id, await self._whole(run, response, head[0]))
        except asyncio.CancelledError:
            if run.abandoned:
                await run.finish(Outcome.failure(499, "the caller went away"))
            else:
                await run.finish(
                    Outcome.failure(503, f"the replica {self.owner} running the request shut down")
                )
            raise
        except Exception as exc:  # never leave a request without an outcome
            log.exception("invocation %s failed", run.id)
            failure = Outcome.failure(502, f"the request failed: {type(exc).__name__}")
        await run.finish(failure)
        return Finished(run.id, failure)

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
            await self._prepare_files(run, instance, endpoint)
        return await endpoint.send(
            run.method, run.path, self.worker_headers(run, instance), run.body
        )

    async def _prepare_files(
        self, run: Run, instance: InstanceRoute, endpoint: WorkerEndpoint
    ) -> None:
        """The request's asset and output directories: made here for a worker on this
        machine (a simulated cluster's), by the worker-utils sidecar in a Kubernetes pod
        (the signed URLs it needs sent along); none elsewhere (docs/assets.md)."""
        adapter = self.adapters.get(instance.cluster)
        local = adapter is not None and getattr(adapter, "files_on_this_machine", False)
        if self.assets is not None and getattr(adapter, "files_in_sidecar", False):
            base = run.base_url() if run.base_url is not None else ""
            run.files = await SidecarFiles.prepare(
                self.assets, run.id, run.assets, endpoint, base, instance.cluster
            )
            return
        if self.assets is None or not local:
            if run.assets:
                raise _Failed(
                    503,
                    f"input assets cannot be handed to workers of cluster {instance.cluster} "
                    "yet (only to workers on the server's machine)",
                )
            return
        try:
            key = instance.key
            folder = await self.output_dirs.take(key)
            run.files = await RequestFiles.prepare(
                self.assets.store,
                self.files_root,
                run.id,
                run.assets,
                output_dir=folder,
                release=functools.partial(self.output_dirs.give_back, key, folder),
            )
        except DomainError as exc:
            raise _Failed(503, exc.detail or exc.title) from None

    async def _large(
        self, run: Run, response: WorkerResponse, length: int | None
    ) -> Outcome | None:
        """A large result (NVCF's rule): an answer body over NVCF-MAX-RESPONSE-SIZE-BYTES,
        or any file the worker wrote into NVCF-LARGE-OUTPUT-DIR, is kept in the object
        store and answered with a 302 to its signed URL; None when the answer is not large
        (errors never are). An answer of unknown length to a waiting caller is streamed as
        it comes (event streams); to a detached one it is read up to the limit first."""
        assets, files = self.assets, run.files
        assert assets is not None and files is not None
        if isinstance(files, SidecarFiles):  # the sidecar in the pod decided already
            try:
                stored = await files.result(
                    assets, response, run.base_url() if run.base_url is not None else ""
                )
            except SidecarRefused as exc:
                await response.aclose()
                raise _Failed(exc.status, exc.detail) from None
            if stored is not None:
                await response.aclose()
                return Outcome(302, ((b"location", stored.encode("latin-1")),))
        if response.status >= 400:
            return None
        settings = assets.settings
        try:
            outputs = await files.outputs(
                settings.asset_result_max_files, settings.asset_result_max_bytes
            )
        except TooManyOutputs as exc:
            await response.aclose()
            raise _Failed(502, f"the worker's large result was refused: {exc}") from None
        prefix = b""
        small = length is not None and length <= self.result_max
        if not outputs and (small or (length is None and not run.detached)):
            return None  # not large; a stream of unknown length flows to its waiting caller
        try:
            chunks = response.iter_bytes()
            if not outputs and length is None:
                parts: list[bytes] = []
                size = 0
                async for chunk in chunks:
                    parts.append(chunk)
                    size += len(chunk)
                    if size > self.result_max:
                        break
                prefix = b"".join(parts)
                if size <= self.result_max:
                    headers, _ = caller_headers(response.raw_headers)
                    return Outcome(response.status, tuple(headers), prefix)

            async def body() -> AsyncIterator[bytes]:
                if prefix:
                    yield prefix
                async for chunk in chunks:
                    yield chunk

            base = run.base_url() if run.base_url is not None else ""
            url = await store_result(assets, run.id, body(), files, base)
        except ResultTooLarge as exc:
            raise _Failed(502, f"the worker's large result was refused: {exc}") from None
        finally:
            await response.aclose()
        return Outcome(302, ((b"location", url.encode("latin-1")),))

    def worker_headers(self, run: Run, instance: InstanceRoute) -> list[tuple[str, str]]:
        """The worker request's headers: the caller's (filtered) and the NVCF-* ones."""
        return [
            *run.headers,
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

    async def _whole(
        self, run: Run, response: WorkerResponse, headers: list[tuple[bytes, bytes]]
    ) -> Outcome:
        """The whole answer of a detached request, bounded by the result size; finished."""
        try:
            body = await response.read(self.result_max)
            outcome = Outcome(response.status, tuple(headers), body)
        except WorkerFailed as exc:
            outcome = Outcome.failure(502, f"the worker failed: {exc.reason}")
        except TimeoutError:
            outcome = Outcome.failure(
                504, f"the worker did not answer within {self.worker_timeout:g} s"
            )
        finally:
            await response.aclose()
        await run.finish(outcome)
        return outcome

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
        await self.output_dirs.aclose()


class _Failed(Exception):
    """The request ends without a worker's answer: `outcome` says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.outcome = Outcome.failure(status, reason)


class _NoInstance(_Failed):
    """No instance took the request within the queue timeout."""


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
    #: the asset and output directories (made here, or by the sidecar); removed by `finish`
    files: WorkerFiles | None = None
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

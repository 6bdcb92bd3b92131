"""The invocation plane: accepts requests, runs them on instances, keeps what must be polled.

A request is accepted (target resolved, rate limits counted, a place in its version's queue
taken — or refused), then runs in a task of this replica: it waits for an instance
(dispatch.py), sends to the instance's worker (the adapter's endpoint), and, when the worker
refuses the connection, is retried once on another instance. The HTTP handler waits for the
worker's answer for `NVCF-POLL-SECONDS`:

- the answer arrives in time: the handler takes it over (`Handoff`) and streams it to the
  caller unbuffered; the instance's slot is held until the stream ends;
- it does not: the request is *detached* — stored as pending (store.py) before the 202 goes
  out — and keeps running here; its outcome is stored when it ends, for any replica to serve
  to `GET .../status/{requestId}`.

Polls and queue questions are answered by lookup.py.

A replica renews a heartbeat; the pending requests of a replica that stopped renewing end
errored (swept by any replica, and at once when a restarted server takes back its persistent
id). Background work (heartbeat, sweeps, re-reading the instances of versions whose requests
wait) is one loop task; every database write uses its own short session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.service import Principal
from service.backends.protocol import AdapterError
from service.backends.worker import (
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
)
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.db import utcnow
from service.core.errors import BadRequest, ServiceUnavailable, TooManyRequests
from service.core.settings import Settings
from service.deployments.reconcile.owner import OwnerId
from service.invocation.dispatch import (
    Dispatcher,
    LocalDispatcher,
    QueueTimeout,
    Ticket,
)
from service.invocation.dispatch_redis import RedisDispatcher
from service.invocation.forward import (
    header_text,
    request_headers,
    request_target_safe,
    response_headers,
)
from service.invocation.load import LoadPublisher, LoadTracker
from service.invocation.lookup import RequestLookup
from service.invocation.metrics import InvocationMetrics
from service.invocation.models import RequestState
from service.invocation.ratelimit import FunctionRateLimiter
from service.invocation.records import (
    Handoff,
    Invocation,
    done_or_timeout,
)
from service.invocation.routing import InstanceRoute, RouteTable, Target
from service.invocation.store import Outcome, RequestStore

log = logging.getLogger("nvcf.invocation")


class InvocationPlane:
    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        catalog: Catalog,
        metrics: InvocationMetrics,
        owner: OwnerId,
        *,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self.sessionmaker = sessionmaker
        self.adapters = adapters
        self.owner = owner
        self.routes = RouteTable(sessionmaker, catalog, settings.invoke_route_cache_seconds)
        self.limiter = FunctionRateLimiter(settings.redis_url)
        self.metrics = metrics
        #: this replica's load per version, published for the autoscaler (load.py)
        self.load = LoadTracker(on_version=metrics.watch_load)
        self.load_publisher = LoadPublisher(
            sessionmaker, owner.value, self.load, period=settings.autoscale_load_report_seconds
        )
        self.dispatcher: Dispatcher
        if dispatcher is not None:
            self.dispatcher = dispatcher
        elif settings.redis_url:
            self.dispatcher = RedisDispatcher(
                settings.redis_url,
                queue_max=settings.invoke_queue_max,
                lease_seconds=settings.invoke_replica_lease_seconds,
                on_change=self.load,
            )
        else:
            self.dispatcher = LocalDispatcher(settings.invoke_queue_max, on_change=self.load)
        self.store = RequestStore(
            sessionmaker,
            owner.value,
            lease_seconds=settings.invoke_replica_lease_seconds,
            ttl_seconds=settings.invoke_result_ttl_seconds,
        )
        self._active: dict[uuid.UUID, Invocation] = {}
        #: polls and queue questions (lookup.py)
        self.lookup = RequestLookup(
            self.store,
            self.dispatcher,
            self._active,
            lease_seconds=settings.invoke_replica_lease_seconds,
        )
        self.queue_timeout = settings.invoke_queue_timeout_seconds
        self.worker_timeout = settings.invoke_worker_timeout_seconds
        self.result_max = settings.invoke_result_max_bytes
        self._max_size = str(self.result_max)
        self._max_size_line = f"\r\nNVCF-MAX-RESPONSE-SIZE-BYTES: {self._max_size}\r\n".encode()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._instances_changed = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.owner.persistent:
            ended = await self.store.end_owned(
                f"the replica {self.owner.value} running the request restarted"
            )
            if ended:
                log.warning("ended %d requests of this replica's previous run", ended)
        await self.store.heartbeat()
        await self._sweep()
        if isinstance(self.dispatcher, RedisDispatcher):
            await self.dispatcher.start()
        self._loop_task = asyncio.create_task(self._background(), name="nvcf-invocation")
        self.load_publisher.start()

    def instances_changed(self) -> None:
        """Instances became Running somewhere (the reconciler of this process says so):
        re-read the versions with waiting requests now, not at the next period."""
        self._instances_changed.set()

    async def stop(self) -> None:
        """Stop: requests still running here end errored (their callers may poll that). The
        replica's heartbeat row is left to age out (a restart of the same id renews it)."""
        self._stopping = True
        await self.load_publisher.stop()
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        running = [inv.task for inv in self._active.values() if inv.task is not None]
        for t in running:
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        await self.dispatcher.aclose()
        await self.limiter.aclose()

    async def _background(self) -> None:
        """Heartbeat every third of the lease, sweep every lease, and re-read the instances of
        versions with waiting requests every route-cache period (first run: after a pause;
        `start` did the first heartbeat and sweep)."""
        lease = self.settings.invoke_replica_lease_seconds
        beat = max(0.05, lease / 3)
        pause = min(beat, max(0.05, self.settings.invoke_route_cache_seconds or 0.5))
        loop = asyncio.get_running_loop()
        next_beat, next_sweep = loop.time() + beat, loop.time() + lease
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._instances_changed.wait(), pause)
            self._instances_changed.clear()
            now = loop.time()
            try:
                if now >= next_beat:
                    await self.store.heartbeat()
                    next_beat = now + beat
                if now >= next_sweep:
                    await self._sweep()
                    next_sweep = now + lease
                await self._refresh_waiting()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("invocation background work failed")

    async def _sweep(self) -> None:
        ended = await self.store.end_dead()
        if ended:
            log.warning("ended %d requests of stopped replicas", ended)
        await self.store.purge_expired()

    async def _refresh_waiting(self) -> None:
        """Re-read the instances of versions with requests waiting (new instances may run)."""
        for target in self.dispatcher.waiting_versions():
            principal = Principal(target.owner_account, frozenset(), "internal", "")
            fresh = await self.routes.refresh(principal, target)
            if fresh is not None:
                await self.dispatcher.update(fresh)

    # ------------------------------------------------------------------ accepting

    async def accept(
        self,
        principal: Principal,
        function_id: uuid.UUID,
        version_id: uuid.UUID | None,
        *,
        method: str,
        path: str | None,
        raw_headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        request_id: uuid.UUID | None = None,
        wrapped: bool = False,
    ) -> Invocation:
        """Resolve, count and enqueue a request and start running it; raises the 4xx/503
        that refuses it. `path` None: the function's inferenceUrl; `wrapped`: the body is the
        JSON of an exec request's `requestBody`."""
        if self._stopping:
            raise ServiceUnavailable(detail="this replica is shutting down; retry")
        if path is not None and not request_target_safe(path):
            raise BadRequest(
                detail="the path cannot be forwarded to the function: it must be sent "
                "percent-encoded, with no control characters, spaces or non-ASCII bytes"
            )
        target = await self.routes.resolve(principal, function_id, version_id)
        fid, vid = target.fid, target.vid
        if target.rate is not None:
            try:
                await self.limiter.check(
                    target.rate,
                    account=principal.account_id,
                    subject=principal.subject,
                    version_id=vid,
                )
            except TooManyRequests:
                self.metrics.outcome(fid, vid, "rate_limited")
                raise
        loop = asyncio.get_running_loop()
        now = loop.time()
        headers = request_headers(raw_headers, ())
        if wrapped:
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("content-type", "application/json"))
        inv = Invocation(
            id=request_id or uuid.uuid4(),
            target=target,
            principal=principal,
            method=method,
            path=path if path is not None else target.inference_path,
            headers=headers,
            body=body,
            created_at=utcnow(),
            accepted=now,
            deadline=now + self.worker_timeout,
        )
        try:
            ticket = await self.dispatcher.enqueue(inv.id, target)
        except TooManyRequests:
            self.metrics.outcome(fid, vid, "queue_full")
            raise
        self.begin(inv, ticket)
        return inv

    def begin(self, inv: Invocation, ticket: Ticket) -> None:
        """Run an accepted request in its own task of this replica."""
        self._active[inv.id] = inv
        inv.task = asyncio.create_task(self._run(inv, ticket))

    async def first_answer(self, inv: Invocation, poll_seconds: float) -> Handoff | None:
        """The worker's answer if it comes within `poll_seconds`; else None after storing the
        request as pending (it keeps running; the caller gets 202)."""
        try:
            if not inv.handoff.done():
                await done_or_timeout(inv.handoff, poll_seconds)
        except asyncio.CancelledError:
            inv.detached = True  # nobody waits any more, and nobody can poll it
            inv.stored.set()
            if inv.handoff.done() and (answer := inv.handoff.result()).response is not None:
                await asyncio.shield(answer.response.aclose())
                self.finish_stream(inv, "the caller went away")
            raise
        if inv.handoff.done():
            return inv.handoff.result()
        inv.detached = True
        await self.store_pending(inv)
        return None

    async def store_pending(self, inv: Invocation) -> None:
        """Store a detached request as pending, for polling (`ServiceUnavailable` when the
        database refuses: the request keeps running, nobody can poll it)."""
        try:
            await self.store.save_pending(
                inv.id,
                account_id=inv.principal.account_id,
                function_id=inv.target.function_id,
                version_id=inv.target.version_id,
                state=inv.state,
                created_at=inv.created_at,
            )
            inv.store_ok = True
        except Exception as exc:
            log.exception("storing pending request %s failed", inv.id)
            raise ServiceUnavailable(
                detail="the request is running but its state could not be stored for polling "
                f"({type(exc).__name__}); retry"
            ) from exc
        finally:
            inv.stored.set()

    def track(self, inv: Invocation) -> None:
        """A request running in its caller's task (invocation/inline.py) that polls must
        find: it was detached."""
        self._active[inv.id] = inv

    @property
    def accepting(self) -> bool:
        return not self._stopping

    async def read_handoff(self, inv: Invocation, response: WorkerResponse) -> Outcome:
        """Read a handed-over answer whole (the wrapped form), bounded by the result size."""
        error: str | None = None
        try:
            body = await response.read(self.result_max)
            return Outcome(response.status, tuple(response_headers(response.headers)), body)
        except WorkerFailed as exc:
            error = exc.reason
            return Outcome.failure(502, f"the worker failed: {exc.reason}")
        finally:
            await response.aclose()
            self.finish_stream(inv, error)

    def finish_stream(self, inv: Invocation, error: str | None = None) -> None:
        """The handler has streamed the handed-over response (or failed to)."""
        inv.stream_error = error
        inv.streamed.set()

    # ------------------------------------------------------------------ running

    async def _run(self, inv: Invocation, ticket: Ticket) -> None:
        outcome: Outcome | None = None
        try:
            outcome = await self._attempt(inv, ticket)
        except asyncio.CancelledError:
            outcome = Outcome.failure(
                503, f"the replica {self.owner.value} running the request shut down"
            )
        except Exception as exc:  # never leave a request without an outcome
            log.exception("invocation %s failed", inv.id)
            outcome = Outcome.failure(502, f"the request failed: {type(exc).__name__}")
        finally:
            if inv.instance is not None:
                await self.dispatcher.release(inv.target, inv.instance.id, inv.id)
                inv.instance = None
        await self.finish(inv, outcome)

    async def _attempt(self, inv: Invocation, ticket: Ticket) -> Outcome | None:
        """Run the request; None when the answer was handed to the waiting handler."""
        target = inv.target
        tried, reasons = inv.tried, inv.reasons
        remaining = max(0.0, inv.deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout_at(inv.deadline):
                while True:
                    try:
                        instance = await ticket.wait(min(self.queue_timeout, remaining))
                    except QueueTimeout:
                        return Outcome.failure(
                            503,
                            f"no instance of function version {target.version_id} took the "
                            f"request within {self.queue_timeout:g} s",
                        )
                    inv.instance = instance
                    await self._set_state(inv, RequestState.RUNNING)
                    try:
                        response = await self._send(inv, instance)
                        break
                    except WorkerUnreachable as exc:
                        reasons.append(f"instance {instance.id}: {exc.reason}")
                        tried.append(instance.id)
                        await self.dispatcher.release(target, instance.id, inv.id)
                        inv.instance = None
                    retry = await self.retry(inv, target)
                    if isinstance(retry, Outcome):
                        return retry
                    target, ticket = retry
                if not inv.detached:
                    inv.handoff.set_result(Handoff(response=response))
                    await inv.streamed.wait()
                    if inv.stream_error is None and response.status < 400:
                        inv.outcome = Outcome(response.status)
                    else:
                        inv.outcome = Outcome(response.status, error=inv.stream_error)
                    return None
                try:
                    body = await response.read(self.result_max)
                finally:
                    await response.aclose()
                headers = tuple(response_headers(response.headers))
                return Outcome(response.status, headers, body)
        except TimeoutError:
            return Outcome.failure(
                504,
                f"the worker did not answer within {self.worker_timeout:g} s",
            )
        except WorkerFailed as exc:
            return Outcome.failure(502, f"the worker failed: {exc.reason}")

    async def _send(self, inv: Invocation, instance: InstanceRoute) -> WorkerResponse:
        endpoint = await self.endpoint_of(inv.target, instance)
        headers = self.worker_headers(inv.headers, inv.rid, inv.principal, inv.target, instance)
        return await endpoint.send(inv.method, inv.path, headers, inv.body)

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

    def worker_headers(
        self,
        headers: list[tuple[str, str]],
        request_id: str,
        principal: Principal,
        target: Target,
        instance: InstanceRoute,
    ) -> list[tuple[str, str]]:
        """The worker request's headers: the caller's (filtered) and the NVCF-* ones."""
        return [
            *headers,
            ("NVCF-REQID", request_id),
            ("NVCF-SUB", header_text(principal.subject)),
            ("NVCF-MAX-RESPONSE-SIZE-BYTES", self._max_size),
            *target.nvcf_headers,
            *instance.nvcf_headers,
        ]

    def worker_lines(
        self, request_id: str, principal: Principal, target: Target, instance: InstanceRoute
    ) -> bytes:
        """The NVCF-* headers of `worker_headers` as header lines."""
        return b"".join(
            (
                b"NVCF-REQID: ",
                request_id.encode(),
                b"\r\nNVCF-SUB: ",
                header_text(principal.subject).encode(),
                self._max_size_line,
                target.nvcf_lines,
                instance.nvcf_lines,
            )
        )

    async def retry(self, inv: Invocation, target: Target) -> tuple[Target, Ticket] | Outcome:
        """After an instance refused the connection (in `inv.tried`): the target and the
        claim to try again with — at the head of the queue, never on an instance that
        refused — or the outcome when there is nobody else to try."""
        fresh = await self.routes.refresh(inv.principal, target)
        others = [i for i in (fresh or target).instances if i.id not in inv.tried]
        # scaled to zero meanwhile: wait in the queue for the next instance
        cold = fresh is not None and not fresh.instances and len(inv.tried) == 1
        if not cold and (len(inv.tried) > 1 or not others):
            return Outcome.failure(
                502, "the worker could not be reached: " + "; ".join(inv.reasons)
            )
        target = fresh or target
        ticket = await self.dispatcher.enqueue(inv.id, target, exclude=inv.tried, front=True)
        return target, ticket

    async def _set_state(self, inv: Invocation, state: RequestState) -> None:
        inv.state = state
        if inv.detached and inv.store_ok and state == RequestState.RUNNING:
            try:
                await self.store.save_state(inv.id, state)
            except Exception:
                log.exception("storing the state of request %s failed", inv.id)

    async def finish(self, inv: Invocation, outcome: Outcome | None) -> None:
        """Record how a request ended (metrics; its outcome stored when it was detached)."""
        if outcome is None:
            outcome = inv.outcome or Outcome(502, error="the request ended without an answer")
        inv.outcome = outcome
        if not inv.handoff.done() and not inv.detached:
            inv.handoff.set_result(Handoff(outcome=outcome))
        elapsed = asyncio.get_running_loop().time() - inv.accepted
        self.metrics.answered(inv.target, outcome.fulfilled, elapsed)
        inv.done.set()
        try:
            if inv.detached:
                await inv.stored.wait()
                if inv.store_ok:
                    try:
                        await self.store.save_outcome(inv.id, outcome)
                    except Exception:
                        log.exception("storing the outcome of request %s failed", inv.id)
        finally:
            self._active.pop(inv.id, None)

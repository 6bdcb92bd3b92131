"""What callers ask of requests already accepted: the outcome of one (`poll`, the status
routes), its place in its queue (`position`) and the depth of a function's queues (`queues`).

A request running on this replica is answered from memory (its outcome as soon as it ends);
any other from the request store (store.py), re-read at growing steps while it is pending — so
a poll reaching another replica than the one running the request answers correctly, and a
request whose replica stopped renewing its heartbeat ends errored at the first poll that sees
it. Requests and queues of another account are not found (access.py): an account a function
is shared with reads its own requests and the function's queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.core.errors import BadRequest, NotFound
from service.invocation.access import may_poll, visible_versions
from service.invocation.dispatch import Dispatcher
from service.invocation.records import PollAnswer, QueueInfo
from service.invocation.run import Run
from service.invocation.store import Outcome, RequestStore, StoredRequest

#: statuses whose queues `GET /queues/functions/{fid}` lists (NVCF: ACTIVE or DEPLOYING)
QUEUE_STATUSES = frozenset({"ACTIVE", "DEPLOYING", "DEGRADING"})
#: how often a poll reaching another replica re-reads a pending request (seconds, growing)
POLL_STEPS = (0.05, 0.1, 0.2, 0.5, 1.0)


class RequestLookup:
    """Polls and queue questions over this replica's running requests (`active`, the
    invocation plane's own mapping) and the request store."""

    def __init__(
        self,
        store: RequestStore,
        dispatcher: Dispatcher,
        active: Mapping[uuid.UUID, Run],
        *,
        lease_seconds: float,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self._active = active
        self._lease_seconds = lease_seconds

    async def poll(
        self, principal: Principal, request_id: uuid.UUID, poll_seconds: float
    ) -> PollAnswer:
        """The request's outcome once it is done, waiting up to `poll_seconds` for it; its
        pending state otherwise. 404 when unknown, expired or another account's."""
        inv = self._active.get(request_id)
        if inv is not None and inv.detached and inv.store_ok:
            if not _may_poll(principal, inv):
                raise NotFound(detail=f"request {request_id} not found")
            if not inv.done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_seconds):
                        await inv.done.wait()
            files = inv.files
            done = inv.done.is_set()
            return PollAnswer(
                request_id,
                inv.target.function_id,
                inv.target.version_id,
                inv.state.value,
                inv.outcome if done else None,
                # the worker's progress file, read while its directory is there
                None if done or files is None else await files.progress(),
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_seconds
        step = 0
        while True:
            stored = await self.store.read(request_id)
            if stored is None or not _may_poll_stored(principal, stored):
                raise NotFound(detail=f"request {request_id} not found or expired")
            local = self._active.get(request_id)
            if local is not None and local.detached and local.store_ok:
                # it ran here all along (stored moments ago): wait on it directly
                return await self.poll(principal, request_id, max(0.0, deadline - loop.time()))
            if stored.pending and not stored.owner_alive:
                reason = (
                    f"the replica {stored.owner} running the request stopped (no heartbeat "
                    f"for {self._lease_seconds:g} s)"
                )
                await self.store.end_one(request_id, stored.owner, reason)
                return _answer(stored, Outcome.failure(503, reason))
            if not stored.pending or loop.time() >= deadline:
                return _answer(stored, stored.outcome)
            await asyncio.sleep(
                min(POLL_STEPS[min(step, len(POLL_STEPS) - 1)], deadline - loop.time())
            )
            step += 1

    async def queues(
        self,
        session: AsyncSession,
        principal: Principal,
        function_id: uuid.UUID,
        version_id: uuid.UUID | None,
    ) -> list[QueueInfo]:
        """The queue of each version of the function that has one (one look at the
        dispatcher for all of them)."""
        rows = await visible_versions(session, principal, function_id, version_id)
        if not rows:
            what = f"function {function_id}" + (f" version {version_id}" if version_id else "")
            raise NotFound(detail=f"{what} not found")
        queued = sorted((r for r in rows if r.status in QUEUE_STATUSES), key=lambda r: str(r.id))
        if not queued:
            raise NotFound(
                detail=f"function {function_id} has no queue: no version is ACTIVE, DEGRADING "
                "or DEPLOYING"
            )
        depths = await self.dispatcher.requests_waiting([r.id for r in queued])
        return [QueueInfo(r.id, r.name, r.status, depths.get(r.id, 0)) for r in queued]

    async def position(
        self, principal: Principal, request_id: uuid.UUID
    ) -> tuple[uuid.UUID, uuid.UUID, int]:
        """(function id, version id, 1-based position) of a request waiting in its queue."""
        inv = self._active.get(request_id)
        if inv is not None:
            if not _may_poll(principal, inv):
                raise NotFound(detail=f"request {request_id} not found")
            function_id, version_id, state = (
                inv.target.function_id,
                inv.target.version_id,
                inv.state.value,
            )
        else:
            stored = await self.store.read(request_id)
            if stored is None or not _may_poll_stored(principal, stored):
                raise NotFound(detail=f"request {request_id} not found or expired")
            function_id, version_id, state = stored.function_id, stored.version_id, stored.state
        position = await self.dispatcher.position(request_id)
        if position is None:
            raise BadRequest(
                detail=f"request {request_id} is not waiting in a queue (it is {state})"
            )
        return function_id, version_id, position


def _may_poll(principal: Principal, inv: Run) -> bool:
    target = inv.target
    return may_poll(principal, inv.principal.account_id, target.function_id, target.version_id)


def _may_poll_stored(principal: Principal, stored: StoredRequest) -> bool:
    return may_poll(principal, stored.account_id, stored.function_id, stored.version_id)


def _answer(stored: StoredRequest, outcome: Outcome | None) -> PollAnswer:
    # the progress the replica running the request published, while it is pending
    progress = stored.progress if outcome is None else None
    return PollAnswer(
        stored.id, stored.function_id, stored.version_id, stored.state, outcome, progress
    )

"""Every SQL statement of the invocation plane: polled requests and replica heartbeats."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.assets.files import Progress
from service.core.db import utcnow
from service.invocation.models import (
    PENDING_STATES,
    InvocationReplica,
    InvocationRequest,
    RequestState,
)


@dataclass(frozen=True)
class Outcome:
    """How a request ended: the worker's answer, or why there was none (`error`, with the
    status the invocation plane answers: 502 worker failure, 503 no instance, 504 timeout)."""

    status: int
    #: the worker's headers the caller gets (forward.py: `caller_headers`)
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    error: str | None = None

    @property
    def fulfilled(self) -> bool:
        return self.error is None and self.status < 400

    @classmethod
    def failure(cls, status: int, reason: str) -> Outcome:
        return cls(status, error=reason)


@dataclass(frozen=True)
class StoredRequest:
    """A polled request as read back, with whether its replica is still alive."""

    id: uuid.UUID
    account_id: str
    function_id: uuid.UUID
    version_id: uuid.UUID
    owner: str
    state: str
    outcome: Outcome | None
    expires_at: datetime
    owner_alive: bool
    #: the worker's last progress report, as the replica running the request published it
    progress: Progress | None = None

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES


class RequestStore:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        owner: str,
        *,
        lease_seconds: float,
        ttl_seconds: float,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.owner = owner
        self.lease = timedelta(seconds=lease_seconds)
        self.ttl = timedelta(seconds=ttl_seconds)

    # ------------------------------------------------------------------ replicas

    async def heartbeat(self) -> None:
        """Renew this replica's heartbeat (registering it the first time)."""
        now = utcnow()
        async with self.sessionmaker() as session, session.begin():
            result: Any = await session.execute(
                update(InvocationReplica)
                .where(InvocationReplica.owner == self.owner)
                .values(heartbeat_at=now)
            )
            if result.rowcount == 0:
                session.add(InvocationReplica(owner=self.owner, heartbeat_at=now, started_at=now))

    async def end_owned(self, reason: str) -> int:
        """End every pending request of this replica id errored (a restart of a persistent
        id: its previous run is gone; or a shutdown)."""
        async with self.sessionmaker() as session, session.begin():
            return await _end(session, [self.owner], reason, utcnow())

    async def end_dead(self) -> int:
        """End the pending requests of replicas whose heartbeat is older than the lease."""
        now = utcnow()
        cutoff = now - self.lease
        async with self.sessionmaker() as session, session.begin():
            rows = (
                await session.execute(
                    select(InvocationReplica.owner, InvocationReplica.heartbeat_at).where(
                        InvocationReplica.heartbeat_at < cutoff
                    )
                )
            ).all()
            ended = 0
            for owner, seen in rows:
                reason = (
                    f"the replica {owner} running the request stopped (no heartbeat since "
                    f"{seen.isoformat()})"
                )
                ended += await _end(session, [owner], reason, now)
            # replicas gone for longer than any request lives are forgotten
            await session.execute(
                delete(InvocationReplica).where(InvocationReplica.heartbeat_at < now - self.ttl)
            )
            return ended

    # ------------------------------------------------------------------ requests

    async def save_pending(
        self,
        request_id: uuid.UUID,
        *,
        account_id: str,
        function_id: uuid.UUID,
        version_id: uuid.UUID,
        state: RequestState,
        created_at: datetime,
    ) -> None:
        async with self.sessionmaker() as session, session.begin():
            session.add(
                InvocationRequest(
                    id=request_id,
                    account_id=account_id,
                    function_id=function_id,
                    version_id=version_id,
                    owner=self.owner,
                    state=state.value,
                    created_at=created_at,
                    updated_at=utcnow(),
                    expires_at=created_at + self.ttl,
                )
            )

    async def save_state(self, request_id: uuid.UUID, state: RequestState) -> None:
        async with self.sessionmaker() as session, session.begin():
            await session.execute(
                update(InvocationRequest)
                .where(
                    InvocationRequest.id == request_id, InvocationRequest.state.in_(PENDING_STATES)
                )
                .values(state=state.value, updated_at=utcnow())
            )

    async def save_progress(self, request_id: uuid.UUID, progress: Progress) -> None:
        """The worker's progress report of a pending request, for polls on other replicas."""
        async with self.sessionmaker() as session, session.begin():
            await session.execute(
                update(InvocationRequest)
                .where(
                    InvocationRequest.id == request_id, InvocationRequest.state.in_(PENDING_STATES)
                )
                .values(progress_percent=progress.percent, progress_partial=progress.partial)
            )

    async def save_outcome(self, request_id: uuid.UUID, outcome: Outcome) -> None:
        values: dict[str, Any] = {"updated_at": utcnow()}
        if outcome.error is not None:
            values.update(state=RequestState.ERRORED.value, error=outcome.error)
            values["error_status"] = outcome.status
        else:
            values.update(
                state=(
                    RequestState.FULFILLED if outcome.status < 400 else RequestState.ERRORED
                ).value,
                result_status=outcome.status,
                result_headers=[
                    [k.decode("latin-1"), v.decode("latin-1")] for k, v in outcome.headers
                ],
                result_body=outcome.body,
            )
        async with self.sessionmaker() as session, session.begin():
            await session.execute(
                update(InvocationRequest)
                .where(
                    InvocationRequest.id == request_id, InvocationRequest.state.in_(PENDING_STATES)
                )
                .values(**values)
            )

    async def read(self, request_id: uuid.UUID) -> StoredRequest | None:
        """The request (None when unknown or expired), its replica's liveness included."""
        now = utcnow()
        async with self.sessionmaker() as session:
            row = (
                await session.execute(
                    select(InvocationRequest, InvocationReplica.heartbeat_at)
                    .outerjoin(
                        InvocationReplica, InvocationReplica.owner == InvocationRequest.owner
                    )
                    .where(InvocationRequest.id == request_id)
                )
            ).first()
        if row is None:
            return None
        req, seen = row
        if req.expires_at <= now:
            return None
        return StoredRequest(
            id=req.id,
            account_id=req.account_id,
            function_id=req.function_id,
            version_id=req.version_id,
            owner=req.owner,
            state=req.state,
            outcome=_outcome(req),
            expires_at=req.expires_at,
            owner_alive=seen is not None and seen >= now - self.lease,
            progress=(
                Progress(req.progress_percent, req.progress_partial or b"null")
                if req.progress_percent is not None
                else None
            ),
        )

    async def end_one(self, request_id: uuid.UUID, owner: str, reason: str) -> None:
        async with self.sessionmaker() as session, session.begin():
            await session.execute(
                update(InvocationRequest)
                .where(
                    InvocationRequest.id == request_id,
                    InvocationRequest.owner == owner,
                    InvocationRequest.state.in_(PENDING_STATES),
                )
                .values(
                    state=RequestState.ERRORED.value,
                    error=reason,
                    error_status=503,
                    updated_at=utcnow(),
                )
            )

    async def purge_expired(self) -> int:
        async with self.sessionmaker() as session, session.begin():
            result: Any = await session.execute(
                delete(InvocationRequest).where(InvocationRequest.expires_at < utcnow())
            )
            return int(result.rowcount or 0)


async def _end(session: AsyncSession, owners: list[str], reason: str, now: datetime) -> int:
    result: Any = await session.execute(
        update(InvocationRequest)
        .where(
            InvocationRequest.owner.in_(owners),
            or_(*(InvocationRequest.state == s for s in PENDING_STATES)),
        )
        .values(state=RequestState.ERRORED.value, error=reason, error_status=503, updated_at=now)
    )
    return int(result.rowcount or 0)


def _outcome(req: InvocationRequest) -> Outcome | None:
    if req.state in PENDING_STATES:
        return None
    if req.error is not None:
        return Outcome.failure(req.error_status or 502, req.error)
    headers = tuple(
        (str(h[0]).encode("latin-1"), str(h[1]).encode("latin-1"))
        for h in (req.result_headers or [])
        if isinstance(h, list) and len(h) == 2
    )
    return Outcome(req.result_status or 200, headers, req.result_body or b"")

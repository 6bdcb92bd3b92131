"""Invocation state as stored: requests a client may poll, and the replicas running them.

Only requests that outlive their first answer are stored: when the worker has not answered
within `NVCF-POLL-SECONDS`, the client gets 202 with the request id and the request's row is
written (state `queued` or `running`); the replica that accepted it keeps running it and writes
the outcome (`fulfilled` with the worker's status, headers and body, or `errored` with the
reason). A request answered at once is never stored (its id cannot be polled, as in NVCF).

`owner` is the accepting replica's id (deployments/reconcile/owner.py); a replica renews its
`invocation_replicas.heartbeat_at` while it runs, and the pending requests of a replica whose
heartbeat is older than the lease end `errored` (any replica sweeps them; a restarted server
that takes back its persistent id ends its previous run's at once).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow


class RequestState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FULFILLED = "fulfilled"
    ERRORED = "errored"


PENDING_STATES = (RequestState.QUEUED.value, RequestState.RUNNING.value)


class InvocationRequest(Base):
    __tablename__ = "invocation_requests"
    __table_args__ = (
        Index("ix_invocation_requests_owner_state", "owner", "state"),
        Index("ix_invocation_requests_expires_at", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    #: the invoking account (a poll from any other account is a 404)
    account_id: Mapped[str] = mapped_column(String(128))
    function_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    result_status: Mapped[int | None] = mapped_column(Integer)
    #: the worker's response headers, hop-by-hop ones removed: [[name, value], ...]
    result_headers: Mapped[list[Any] | None] = mapped_column(JSON)
    result_body: Mapped[bytes | None] = mapped_column(LargeBinary)
    error: Mapped[str | None] = mapped_column(Text)
    #: HTTP status of an errored request (502 worker, 503 no instance, 504 timeout)
    error_status: Mapped[int | None] = mapped_column(Integer)
    #: the worker's last progress report while pending (percent, partial output as JSON),
    #: published by the replica running the request for polls reaching another
    progress_percent: Mapped[int | None] = mapped_column(Integer)
    progress_partial: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class InvocationReplica(Base):
    """A replica serving invocations, alive while `heartbeat_at` is recent."""

    __tablename__ = "invocation_replicas"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

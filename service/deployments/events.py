"""Append entries to a deployment's timeline (`GET /deployments/{id}/events`).

Used by `transitions/`, the one writer of deployment state. Entries are buffered on the
session and written in one multi-row INSERT when its transaction commits: the ORM would insert
rows with a generated key one statement at a time, and a reconciler batch records thousands of
them. A rollback discards the buffer with the rest.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from service.core.db import mark_written, utcnow
from service.deployments import repository

_PENDING = "nvcf_pending_events"


def record_event(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    kind: str,
    message: str,
    *,
    instance_id: uuid.UUID | None = None,
    phase: str | None = None,
    reason: str | None = None,
) -> None:
    """Add one entry to the session's transaction (written at commit)."""
    sync = session.sync_session
    sync.info.setdefault(_PENDING, []).append(
        {
            "deployment_id": deployment_id,
            "at": utcnow(),
            "kind": kind,
            "instance_id": instance_id,
            "phase": phase,
            "reason": reason,
            "message": message,
        }
    )
    mark_written(sync)


def _write(session: Session) -> None:
    rows: list[dict[str, Any]] | None = session.info.pop(_PENDING, None)
    if rows:
        session.flush()  # the deployments they belong to first
        repository.insert_events(session, rows)


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    _write(session)


@event.listens_for(Session, "after_soft_rollback")
def _discard(session: Session, _previous: Any) -> None:
    session.info.pop(_PENDING, None)

"""Append entries to a deployment's timeline (`GET /deployments/{id}/events`).

Shared by the API (validation, dispatch, scaling, teardown) and the reconciler (instance phase
changes, status changes). Callers flush or commit; this only adds the row to the session.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import utcnow
from service.deployments.models import DeploymentEvent


def record_event(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    kind: str,
    message: str,
    *,
    instance_id: uuid.UUID | None = None,
    phase: str | None = None,
    reason: str | None = None,
) -> DeploymentEvent:
    """Add one event row to `session` (not flushed) and return it."""
    event = DeploymentEvent(
        deployment_id=deployment_id,
        at=utcnow(),
        kind=kind,
        instance_id=instance_id,
        phase=phase,
        reason=reason,
        message=message,
    )
    session.add(event)
    return event

"""A GPU specification's revisions (docs/rollouts.md): recording a validated configuration as
the next revision, rolling back to an earlier one (both start a rollout through
`transitions.start_rollout`), and reading them. Services flush; the request commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.core.db import utcnow
from service.core.errors import NotFound
from service.deployments import repository, transitions
from service.deployments.models import Deployment, DeploymentSpec, SpecRevision


def principal_name(principal: Principal) -> str:
    """Who accepted a revision, as kept: the credential's kind and id, never a secret."""
    return f"{principal.kind}:{principal.subject}"


async def new_revision(
    session: AsyncSession,
    deployment: Deployment,
    spec: DeploymentSpec,
    *,
    configuration: dict[str, Any] | None,
    helm_validation_policy: dict[str, Any] | None,
    objects: list[dict[str, Any]],
    by: str,
) -> SpecRevision | None:
    """Record a validated configuration as the spec's next revision and start rolling its
    instances to it; None when it is the target revision's configuration already."""
    if (
        configuration == spec.configuration
        and helm_validation_policy == spec.helm_validation_policy
    ):
        return None
    last = await repository.last_revision(session, spec.id)
    now = utcnow()
    revision = SpecRevision(
        spec_id=spec.id,
        number=int(last or 0) + 1,
        configuration=configuration,
        helm_validation_policy=helm_validation_policy,
        objects=objects,
        created_by=by,
        created_at=now,
    )
    transitions.start_rollout(session, deployment, spec, revision, now, created=True, by=by)
    await session.flush()
    return revision


async def rollback(
    session: AsyncSession, deployment: Deployment, spec: DeploymentSpec, number: int, by: str
) -> bool:
    """Roll the spec's instances back to revision `number` (404 if it has none such);
    whether anything changed (not when it is the target already)."""
    revision = await repository.revision(session, spec.id, number)
    if revision is None:
        raise NotFound(detail=f"GPU specification {spec.id} has no revision {number}")
    if number == spec.target_revision:
        return False
    transitions.start_rollout(session, deployment, spec, revision, utcnow(), created=False, by=by)
    await session.flush()
    return True

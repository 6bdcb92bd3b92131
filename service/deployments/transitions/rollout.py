"""A specification's revisions rolled out: started, progressed, completed or failed (rolled
back), each with its timeline event."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from service.deployments.events import record_event
from service.deployments.models import (
    Deployment,
    DeploymentSpec,
    SpecRevision,
)
from service.deployments.rollout import RolloutState
from service.deployments.transitions.deployment import mark_changed


def _target(spec: DeploymentSpec, revision: SpecRevision) -> None:
    """What a new instance of the spec gets: the revision's configuration and objects."""
    spec.target_revision = revision.number
    spec.configuration = revision.configuration
    spec.helm_validation_policy = revision.helm_validation_policy
    spec.objects = list(revision.objects)


def _spec_name(spec: DeploymentSpec) -> str:
    return f"{spec.gpu} {spec.instance_type} ({spec.id})"


def start_rollout(
    session: AsyncSession,
    deployment: Deployment,
    spec: DeploymentSpec,
    revision: SpecRevision,
    now: datetime,
    *,
    created: bool,
    by: str | None,
) -> None:
    """Roll the spec's instances to `revision`: a new one (`created`, stored here) or an
    earlier one (rollback). Instances move one at a time (rollout.py); `by` (who asked) is
    named on the timeline."""
    if created:
        session.add(revision)
    previous = spec.target_revision
    _target(spec, revision)
    spec.rollout_state = RolloutState.PROGRESSING.value
    spec.rollout_reason = None
    spec.rollout_at = now
    mark_changed(deployment, now)
    what = "revision" if created else "rollback to revision"
    who = f" by {by}" if by else ""
    record_event(
        session,
        deployment.id,
        "rollout",
        f"{_spec_name(spec)}: {what} {revision.number}{who}; rolling instances from revision "
        f"{spec.revision} (target was {previous}) to {revision.number}, one at a time",
        reason="RolloutStarted" if created else "RollbackStarted",
    )


def rollout_progressed(
    session: AsyncSession, deployment: Deployment, spec: DeploymentSpec, done: int, desired: int
) -> None:
    record_event(
        session,
        deployment.id,
        "rollout",
        f"{_spec_name(spec)}: {done}/{desired} instances on revision {spec.target_revision}",
        reason="RolloutProgressed",
    )


async def rollout_completed(
    session: AsyncSession, deployment: Deployment, spec: DeploymentSpec, now: datetime
) -> bool:
    """Every wanted instance runs the target revision: it is the current one. Compare-and-set
    on the target and the progressing state (a new revision accepted meanwhile wins); whether
    it was recorded."""
    target = spec.target_revision
    done = (
        await session.execute(
            update(DeploymentSpec)
            .where(
                DeploymentSpec.id == spec.id,
                DeploymentSpec.target_revision == target,
                DeploymentSpec.rollout_state == RolloutState.PROGRESSING.value,
            )
            .values(
                revision=target,
                rollout_state=RolloutState.COMPLETED.value,
                rollout_reason=None,
                rollout_at=now,
            )
            .returning(DeploymentSpec.id)
            .execution_options(synchronize_session=False)
        )
    ).first()
    if done is None:
        return False
    for attr, value in (
        ("revision", target),
        ("rollout_state", RolloutState.COMPLETED.value),
        ("rollout_reason", None),
        ("rollout_at", now),
    ):
        set_committed_value(spec, attr, value)
    record_event(
        session,
        deployment.id,
        "rollout",
        f"{_spec_name(spec)}: rollout to revision {target} completed",
        reason="RolloutCompleted",
    )
    return True


async def rollout_failed(
    session: AsyncSession,
    deployment: Deployment,
    spec: DeploymentSpec,
    serving: SpecRevision,
    now: datetime,
    *,
    reason: str,
) -> bool:
    """A new instance of the target revision failed: the rollout stops and the target goes
    back to the revision that serves (`serving`); the failed revision's instances are
    replaced the same way, one at a time. Compare-and-set on the failed target (a revision
    accepted meanwhile wins); whether it was recorded."""
    failed_revision = spec.target_revision
    values = {
        "target_revision": serving.number,
        "configuration": serving.configuration,
        "helm_validation_policy": serving.helm_validation_policy,
        "objects": list(serving.objects),
        "rollout_state": RolloutState.FAILED.value,
        "rollout_reason": f"revision {failed_revision}: {reason}",
        "rollout_at": now,
    }
    done = (
        await session.execute(
            update(DeploymentSpec)
            .where(
                DeploymentSpec.id == spec.id,
                DeploymentSpec.target_revision == failed_revision,
                DeploymentSpec.rollout_state == RolloutState.PROGRESSING.value,
            )
            .values(**values)
            .returning(DeploymentSpec.id)
            .execution_options(synchronize_session=False)
        )
    ).first()
    if done is None:
        return False
    for attr, value in values.items():
        set_committed_value(spec, attr, value)
    mark_changed(deployment, now)
    record_event(
        session,
        deployment.id,
        "rollout",
        f"{_spec_name(spec)}: rollout to revision {failed_revision} failed ({reason}); "
        f"revision {serving.number} keeps serving",
        reason="RolloutFailed",
    )
    return True

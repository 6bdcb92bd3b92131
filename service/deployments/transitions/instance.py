"""An instance's desired state, phase and condition: the one place they change (created, placed,
observed, retired, torn down), each with its timeline event."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.changes import touching
from service.deployments.events import record_event
from service.deployments.models import (
    Deployment,
    DeploymentSpec,
    Instance,
    InstanceDesired,
)
from service.health.machine import InstanceCondition, Phase
from service.metering import intervals


def create_instance(
    session: AsyncSession,
    deployment: Deployment,
    spec: DeploymentSpec,
    now: datetime,
    *,
    owner: str,
    lease_expires_at: datetime,
    ordinal: int,
) -> Instance:
    """A new wanted instance of `spec`, leased to `owner`, waiting for placement."""
    row = Instance(
        id=uuid.uuid4(),
        deployment_id=deployment.id,
        spec_id=spec.id,
        account_id=deployment.account_id,
        cluster=None,
        desired=InstanceDesired.PRESENT,
        applied=False,
        phase=Phase.SCHEDULING.value,
        reason="Pending",
        message="waiting for placement",
        since=now,
        condition=None,
        lease_owner=owner,
        lease_expires_at=lease_expires_at,
        due_at=now,
        created_at=now,
        updated_at=now,
        revision=spec.target_revision,
    )
    session.add(row)
    intervals.open_instance(
        session,
        instance_id=row.id,
        account_id=row.account_id,
        function_id=deployment.function_id,
        version_id=deployment.version_id,
        deployment_id=deployment.id,
        gpu=spec.gpu,
        instance_type=spec.instance_type,
        created_at=now,
    )
    spec.attempts = (spec.attempts or 0) + 1
    record_event(
        session,
        deployment.id,
        "instance",
        f"instance {row.id} created for {spec.instance_type} ({ordinal}/{spec.desired_instances}, "
        f"revision {row.revision})",
        instance_id=row.id,
        phase=row.phase,
        reason="Created",
    )
    return row


async def place_instances(
    session: AsyncSession, placements: Sequence[tuple[Instance, str]], owner: str, now: datetime
) -> list[Instance]:
    """Record each instance's cluster and `applied` before anything is applied, so a crash
    never loses the objects; the rows placed. A row whose lease `owner` lost meanwhile is
    left alone (the new owner places it). One statement per cluster."""
    by_cluster: dict[str, list[Instance]] = defaultdict(list)
    for row, cluster in placements:
        by_cluster[cluster].append(row)
    placed: list[Instance] = []
    for cluster, rows in by_cluster.items():
        kept = set(
            (
                await session.execute(
                    update(Instance)
                    .where(Instance.id.in_([r.id for r in rows]), Instance.lease_owner == owner)
                    .values(cluster=cluster, applied=True, updated_at=now)
                    .returning(Instance.id)
                    .execution_options(
                        synchronize_session=False, **touching({r.deployment_id for r in rows})
                    )
                )
            ).scalars()
        )
        for row in rows:
            if row.id not in kept:
                continue
            row.cluster = cluster
            row.applied = True
            placed.append(row)
            await intervals.placed(session, row.id, cluster)
            record_event(
                session,
                row.deployment_id,
                "instance",
                f"instance {row.id} placed on cluster {cluster}",
                instance_id=row.id,
                phase=row.phase,
                reason="Placed",
            )
    return placed


async def observe_instance(
    session: AsyncSession, row: Instance, cond: InstanceCondition, now: datetime
) -> None:
    """Store the instance's evaluated condition: a phase change and every newly noted problem
    go on the timeline. A failed instance is no longer wanted (it is torn down). Its GPU
    interval starts when it is first Running and ends when it fails."""
    data = cond.to_json()
    # Problems the health rules note but do not fail on (side objects in worker-readiness
    # mode, transient warnings) go on the timeline once each, so users can see them.
    seen = {
        (o.get("object"), o.get("reason"))
        for o in (row.condition or {}).get("observations", [])
        if isinstance(o, dict)
    }
    for obs in cond.observations:
        if (obs.object, obs.reason) not in seen:
            record_event(
                session,
                row.deployment_id,
                "observation",
                f"{obs.object}: {obs.message}",
                instance_id=row.id,
                phase=cond.phase.value,
                reason=obs.reason,
            )
    if row.phase != cond.phase.value:
        # when the phase began (the backend's reading), not when this pass saw it
        at = max(row.created_at, min(cond.since, now))
        if cond.phase is Phase.RUNNING:
            await intervals.started(session, row.id, at)
        elif cond.phase is Phase.FAILED:
            await intervals.ended(session, row.id, at)
        record_event(
            session,
            row.deployment_id,
            "instance",
            f"instance {row.id} is {cond.phase.value}: {cond.message}",
            instance_id=row.id,
            phase=cond.phase.value,
            reason=cond.reason,
        )
    if (
        row.phase != cond.phase.value
        or row.reason != cond.reason
        or row.message != cond.message
        or row.condition != data
    ):
        row.phase = cond.phase.value
        row.reason = cond.reason
        row.message = cond.message
        row.since = cond.since
        row.condition = data
        row.updated_at = now
    if cond.phase is Phase.FAILED and row.desired == InstanceDesired.PRESENT:
        row.desired = InstanceDesired.ABSENT


def count_failure(spec: DeploymentSpec) -> None:
    """One more instance of `spec` failed (`observe_instance` recorded it and its event);
    while DEPLOYING the count decides between a replacement and ERROR (health/status.py)."""
    spec.failures = (spec.failures or 0) + 1


def retire_instance(
    session: AsyncSession,
    row: Instance,
    now: datetime,
    *,
    kind: str,
    reason: str,
    message: str,
    drain: bool = False,
) -> None:
    """The instance is no longer wanted (scaled down, replaced by a rollout, or its version
    failed): it will be torn down; `kind`/`reason`/`message` say why on the timeline. `drain`:
    a Running instance first stops taking requests and finishes those it has."""
    row.desired = InstanceDesired.ABSENT
    row.updated_at = now
    row.due_at = now
    if drain and row.phase == Phase.RUNNING.value:
        row.drain_since = now
        message += "; draining: it takes no new requests and finishes those in flight"
    record_event(
        session,
        row.deployment_id,
        kind,
        f"instance {row.id} {message}",
        instance_id=row.id,
        phase=row.phase,
        reason=reason,
    )


def unwant(row: Instance) -> None:
    """The instance's deployment is being deleted: the instance is no longer wanted (the
    deployment's teardown event says why)."""
    row.desired = InstanceDesired.ABSENT


async def torn_down(session: AsyncSession, row: Instance, now: datetime) -> None:
    """The backend reports the instance's objects gone: its GPU interval ends."""
    row.applied = False
    await intervals.ended(session, row.id, now)


def schedule_instance(row: Instance, due: datetime | None) -> None:
    """When the instance's lease owner must observe it next (None: nothing scheduled)."""
    if row.due_at != due:
        row.due_at = due

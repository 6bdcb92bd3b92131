"""A deployment's desired state, targets, schedule and removal: the one place they change, each
with its timeline event."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from service.core.changes import BOOKKEEPING, touching
from service.core.db import for_update
from service.core.schemas import iso_z
from service.deployments import history, usage
from service.deployments.events import record_event
from service.deployments.models import (
    AutoscaleState,
    Deployment,
    DeploymentDesired,
    DeploymentSpec,
    Instance,
    SpecRevision,
)
from service.deployments.transitions.status import (
    set_version_status,
    status_of,
)
from service.functions import repository as functions_repository
from service.functions.models import FunctionVersion
from service.health.machine import Phase
from service.health.status import VersionStatus
from service.metering import intervals

#: the statuses of a version whose instances serve (a hold takes them to DEGRADED)
SERVING = frozenset({VersionStatus.ACTIVE, VersionStatus.DEGRADING})


def mark_changed(deployment: Deployment, now: datetime) -> None:
    """A change of desired state: a new generation, due for the reconciler at once."""
    deployment.generation += 1
    deployment.updated_at = now
    deployment.due_at = now


async def deploy(
    session: AsyncSession,
    deployment: Deployment,
    version: FunctionVersion,
    status: VersionStatus,
    now: datetime,
    *,
    validated: str,
    by: str | None = None,
) -> None:
    """Store a new deployment (desired `deployed`, due at once) with revision 1 of each
    spec (accepted `by`), and move its version out of INACTIVE; `validated` describes the
    specifications for the timeline."""
    deployment.desired = DeploymentDesired.DEPLOYED
    deployment.due_at = now
    session.add(deployment)
    await session.flush()
    await usage.adjust(
        session, deployment.account_id, sum(s.max_instances for s in deployment.specs)
    )
    session.add_all(
        SpecRevision(
            spec_id=spec.id,
            number=1,
            configuration=spec.configuration,
            helm_validation_policy=spec.helm_validation_policy,
            objects=list(spec.objects),
            created_by=by,
            created_at=now,
        )
        for spec in deployment.specs
    )
    record_event(session, deployment.id, "validation", validated)
    record_event(
        session,
        deployment.id,
        "dispatch",
        "desired state recorded; dispatched to the reconciler "
        f"(generation {deployment.generation})",
    )
    await set_version_status(session, deployment.id, version, status, now)


async def rescale(
    deployment: Deployment,
    session: AsyncSession,
    described: str,
    now: datetime,
    *,
    added_max: int = 0,
) -> None:
    """New scaling values were set on the deployment's specs (their maxInstances grew by
    `added_max`, negative when they shrank): record them, wake the work."""
    if deployment.desired == DeploymentDesired.DEPLOYED:
        await usage.adjust(session, deployment.account_id, added_max)
    mark_changed(deployment, now)
    record_event(session, deployment.id, "scaling", described)


def set_targets(
    session: AsyncSession,
    deployment: Deployment,
    targets: dict[uuid.UUID, int],
    now: datetime,
    *,
    reason: str,
    message: str,
) -> bool:
    """The autoscaler's new desired instance counts of the deployment's specs (spec id →
    count): stored, on the timeline as one `scaling` event (`message` says from → to and
    why), and the deployment due at once. Whether anything changed."""
    parts: list[str] = []
    for spec in deployment.specs:
        to = targets.get(spec.id)
        if to is None:
            continue
        before = spec.desired_instances
        if spec.target_instances != to:
            spec.target_instances = to
        if before != spec.desired_instances:
            parts.append(f"{spec.gpu} {spec.instance_type} ({spec.id}) {before} → {to}")
    if not parts:
        return False
    mark_changed(deployment, now)
    record_event(
        session, deployment.id, "scaling", f"{message}; " + ", ".join(parts), reason=reason
    )
    return True


async def undeploy(
    session: AsyncSession,
    deployment: Deployment,
    version: FunctionVersion | None,
    now: datetime,
    *,
    message: str,
    drain: bool = False,
) -> None:
    """Mark the deployment `deleting` (the reconciler tears its instances down, then removes
    it) and turn the version INACTIVE at once. `drain` (graceful): its Running instances
    first finish the requests in flight and queued (bounded by the drain timeout)."""
    if deployment.desired == DeploymentDesired.DEPLOYED:
        await usage.adjust(
            session, deployment.account_id, -sum(s.max_instances for s in deployment.specs)
        )
    deployment.desired = DeploymentDesired.DELETING
    deployment.drain_since = now if drain else None
    mark_changed(deployment, now)
    record_event(session, deployment.id, "teardown", message)
    if version is not None:
        await set_version_status(
            session, deployment.id, version, VersionStatus.INACTIVE, now, cause="undeployed"
        )


def secrets_changed(
    session: AsyncSession,
    deployment: Deployment,
    names: Sequence[str],
    generation: int,
    now: datetime,
    how: str = "running instances receive it in place, without a restart",
) -> None:
    """The version's secrets were updated (`names`, never values): the reconciler delivers
    generation `generation` to the deployment's instances, so the deployment is due now.
    `how` says how the running instances get it (a telemetry key may roll pods)."""
    deployment.updated_at = now
    deployment.due_at = now
    record_event(
        session,
        deployment.id,
        "secrets",
        f"secrets updated ({', '.join(sorted(names))}): generation {generation}; {how}",
        reason="SecretsUpdated",
    )


def secrets_delivered(
    session: AsyncSession, row: Instance, generation: int, *, rotated: bool
) -> None:
    """The instance's Secret holds the secrets of `generation`; a rotation (an update of an
    instance already running) goes on the timeline."""
    if row.secrets_generation == generation:
        return
    row.secrets_generation = generation
    if rotated:
        record_event(
            session,
            row.deployment_id,
            "secrets",
            f"instance {row.id} received the updated secrets (generation {generation})",
            instance_id=row.id,
            phase=row.phase,
            reason="SecretsDelivered",
        )


def schedule(deployment: Deployment, due: datetime | None) -> None:
    """When the reconciler must look at the deployment next (None: it has settled)."""
    if deployment.due_at != due:
        deployment.due_at = due


async def settle(session: AsyncSession, deployment: Deployment) -> None:
    """The deployment has settled: nothing is due, unless its desired state changed since it
    was read (compare-and-set on `generation`: on SQLite reads take no lock, so a change
    committed meanwhile, e.g. a new revision, must stay due)."""
    if deployment.due_at is None:
        return
    await session.execute(
        update(Deployment)
        .where(Deployment.id == deployment.id, Deployment.generation == deployment.generation)
        .values(due_at=None)
        .execution_options(synchronize_session=False, **BOOKKEEPING)
    )
    set_committed_value(deployment, "due_at", None)


async def remove_deployment(
    session: AsyncSession,
    deployment: Deployment,
    version: FunctionVersion | None,
    now: datetime,
    *,
    retention: timedelta,
) -> None:
    """Delete a torn-down deployment's records, keeping its history for `retention`: a
    `deployment_history` row with its specifications and failed instances, and its timeline
    (history.py). Its version becomes INACTIVE unless another live deployment serves it."""
    dep_id = deployment.id
    failed = (
        (
            await session.execute(
                select(Instance)
                .where(Instance.deployment_id == dep_id, Instance.phase == Phase.FAILED.value)
                .order_by(Instance.created_at, Instance.id)
            )
        )
        .scalars()
        .all()
    )
    kept = history.entry(deployment, failed, now, retention)
    session.add(kept)
    record_event(
        session,
        dep_id,
        "teardown",
        "deployment removed: its instances are gone; this timeline and its failed instances "
        f"stay readable until {iso_z(kept.expires_at)}",
        reason="Removed",
    )
    await session.execute(delete(AutoscaleState).where(AutoscaleState.deployment_id == dep_id))
    await intervals.deployment_removed(session, dep_id, now)
    await session.execute(
        delete(Instance)
        .where(Instance.deployment_id == dep_id)
        .execution_options(**touching({dep_id}))
    )
    specs = select(DeploymentSpec.id).where(DeploymentSpec.deployment_id == dep_id)
    await session.execute(delete(SpecRevision).where(SpecRevision.spec_id.in_(specs)))
    await session.execute(delete(DeploymentSpec).where(DeploymentSpec.deployment_id == dep_id))
    await session.execute(
        delete(Deployment)
        .where(Deployment.id == dep_id)
        .execution_options(**touching({(dep_id, deployment.version_id)}))
    )
    if version is None or version.status == VersionStatus.INACTIVE:
        return
    live = (
        await session.execute(
            select(Deployment.id).where(
                Deployment.version_id == version.id,
                Deployment.desired == DeploymentDesired.DEPLOYED,
            )
        )
    ).first()
    if live is None:
        await session.execute(
            update(FunctionVersion)
            .where(FunctionVersion.id == version.id)
            .values(status=VersionStatus.INACTIVE.value, updated_at=now)
            .execution_options(synchronize_session=False, **touching({version.id}))
        )


async def hold_account(
    session: AsyncSession, account_id: str, held: bool, now: datetime, *, reason: str
) -> int:
    """Hold every deployment of the account at zero instances (`held`) or let them back to
    their desired counts: on each timeline, due at once. How many deployments changed.

    A held version that served reads DEGRADED at once: its instances are retired before the
    reconciler next aggregates the status, and a version read ACTIVE then (as after a quick
    resume) would turn DEGRADED while its held instances are replaced. It reads ACTIVE again
    once an instance runs."""
    mine = select(Deployment.version_id).where(Deployment.account_id == account_id)
    # the versions, then the deployments, each in id order (every writer's order)
    versions = await functions_repository.lock_versions(
        session, set((await session.execute(mine)).scalars().all())
    )
    stmt = for_update(
        select(Deployment).where(Deployment.account_id == account_id).order_by(Deployment.id)
    )
    changed = 0
    for deployment in (await session.execute(stmt)).scalars().all():
        specs = [s for s in deployment.specs if s.held != held]
        if not specs:
            continue
        for spec in specs:
            spec.held = held
        mark_changed(deployment, now)
        what = "held at zero instances" if held else "back to its instance counts"
        record_event(session, deployment.id, "scaling", f"{what}: {reason}", reason=reason)
        changed += 1
        if held and deployment.desired == DeploymentDesired.DEPLOYED:
            version = versions.get(deployment.version_id)
            if version is not None and status_of(version) in SERVING:
                await set_version_status(
                    session, deployment.id, version, VersionStatus.DEGRADED, now, cause=reason
                )
    return changed

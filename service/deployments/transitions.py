"""The one writer of deployment state (runtime.md §3, §6).

Every change of an instance's phase or condition, of desired state (deployment or instance),
of a function version's status, and the removal of a deployment goes through a function here;
each writes the row change and its timeline event together, in the caller's session (callers
flush or commit). The API service (create, scale, undeploy, version delete) and the reconciler
both use it, so the timeline reads the same whoever made the change. The decisions themselves
(which phase, which status) are pure functions in `service.health`.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from service.core.schemas import iso_z
from service.deployments import history, usage
from service.deployments.events import record_event
from service.deployments.models import (
    AutoscaleState,
    Deployment,
    DeploymentDesired,
    DeploymentSpec,
    Instance,
    InstanceDesired,
    SpecRevision,
)
from service.deployments.rollout import RolloutState
from service.functions.models import FunctionVersion
from service.health.machine import InstanceCondition, Phase
from service.health.status import VersionStatus


def status_of(version: FunctionVersion) -> VersionStatus:
    """The stored status as an enum (an unknown value reads as DEPLOYING, to be recomputed)."""
    try:
        return VersionStatus(version.status)
    except ValueError:
        return VersionStatus.DEPLOYING


# --- function version status -------------------------------------------------------------------


def status_message(
    previous: VersionStatus, to: VersionStatus, *, cause: str | None, detail: str | None
) -> str:
    """The one wording of a status change on the timeline."""
    text = f"function version status {previous} → {to}"
    if cause:
        text += f" ({cause})"
    if detail:
        text += f": {detail}"
    return text


@dataclass(frozen=True)
class StatusChange:
    """A wanted move of one version's status, with what the timeline should say about it."""

    deployment_id: uuid.UUID
    version: FunctionVersion
    to: VersionStatus
    cause: str | None = None
    detail: str | None = None
    reason: str | None = None


async def set_version_statuses(
    session: AsyncSession, changes: Sequence[StatusChange], now: datetime
) -> list[StatusChange]:
    """Move each version to its new status if it still has the status it was read with
    (compare-and-set, so two writers never both record a change) and record the events; the
    changes that took place. One statement per (from, to) pair; loaded objects follow."""
    groups: dict[tuple[str, VersionStatus], list[StatusChange]] = defaultdict(list)
    for change in changes:
        if status_of(change.version) is not change.to:
            groups[(change.version.status, change.to)].append(change)
    done: list[StatusChange] = []
    for (stored, to), group in groups.items():
        changed = set(
            (
                await session.execute(
                    update(FunctionVersion)
                    .where(
                        FunctionVersion.id.in_([c.version.id for c in group]),
                        FunctionVersion.status == stored,
                    )
                    .values(status=to.value, updated_at=now)
                    .returning(FunctionVersion.id)
                    .execution_options(synchronize_session=False)
                )
            ).scalars()
        )
        for c in group:
            if c.version.id not in changed:
                continue
            previous = status_of(c.version)
            set_committed_value(c.version, "status", to.value)
            set_committed_value(c.version, "updated_at", now)
            record_event(
                session,
                c.deployment_id,
                "status",
                status_message(previous, to, cause=c.cause, detail=c.detail),
                reason=c.reason,
            )
            done.append(c)
    return done


async def set_version_status(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    version: FunctionVersion,
    to: VersionStatus,
    now: datetime,
    *,
    cause: str | None = None,
) -> bool:
    """`set_version_statuses` for one version; whether it moved."""
    change = StatusChange(deployment_id, version, to, cause=cause)
    return bool(await set_version_statuses(session, [change], now))


# --- deployments -------------------------------------------------------------------------------


def _changed(deployment: Deployment, now: datetime) -> None:
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
    _changed(deployment, now)
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
    _changed(deployment, now)
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
    _changed(deployment, now)
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
) -> None:
    """The version's secrets were updated (`names`, never values): the reconciler delivers
    generation `generation` to the deployment's instances, so the deployment is due now."""
    deployment.updated_at = now
    deployment.due_at = now
    record_event(
        session,
        deployment.id,
        "secrets",
        f"secrets updated ({', '.join(sorted(names))}): generation {generation}; running "
        "instances receive it in place, without a restart",
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
        .execution_options(synchronize_session=False)
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
    await session.execute(delete(Instance).where(Instance.deployment_id == dep_id))
    specs = select(DeploymentSpec.id).where(DeploymentSpec.deployment_id == dep_id)
    await session.execute(delete(SpecRevision).where(SpecRevision.spec_id.in_(specs)))
    await session.execute(delete(DeploymentSpec).where(DeploymentSpec.deployment_id == dep_id))
    await session.execute(delete(Deployment).where(Deployment.id == dep_id))
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
            .execution_options(synchronize_session=False)
        )


# --- instances ---------------------------------------------------------------------------------


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
                    .execution_options(synchronize_session=False)
                )
            ).scalars()
        )
        for row in rows:
            if row.id not in kept:
                continue
            row.cluster = cluster
            row.applied = True
            placed.append(row)
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


def observe_instance(
    session: AsyncSession, row: Instance, cond: InstanceCondition, now: datetime
) -> None:
    """Store the instance's evaluated condition: a phase change and every newly noted problem
    go on the timeline. A failed instance is no longer wanted (it is torn down)."""
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


# --- revisions and rollouts -------------------------------------------------------------------


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
    _changed(deployment, now)
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
    _changed(deployment, now)
    record_event(
        session,
        deployment.id,
        "rollout",
        f"{_spec_name(spec)}: rollout to revision {failed_revision} failed ({reason}); "
        f"revision {serving.number} keeps serving",
        reason="RolloutFailed",
    )
    return True


def unwant(row: Instance) -> None:
    """The instance's deployment is being deleted: the instance is no longer wanted (the
    deployment's teardown event says why)."""
    row.desired = InstanceDesired.ABSENT


def torn_down(row: Instance) -> None:
    """The backend reports the instance's objects gone."""
    row.applied = False


def schedule_instance(row: Instance, due: datetime | None) -> None:
    """When the instance's lease owner must observe it next (None: nothing scheduled)."""
    if row.due_at != due:
        row.due_at = due


__all__ = [
    "StatusChange",
    "count_failure",
    "create_instance",
    "deploy",
    "observe_instance",
    "place_instances",
    "remove_deployment",
    "rescale",
    "retire_instance",
    "rollout_completed",
    "rollout_failed",
    "rollout_progressed",
    "schedule",
    "schedule_instance",
    "secrets_changed",
    "secrets_delivered",
    "set_targets",
    "set_version_status",
    "set_version_statuses",
    "settle",
    "start_rollout",
    "status_message",
    "status_of",
    "torn_down",
    "undeploy",
    "unwant",
]

"""How many instances each spec of a deployment runs, and on which revision: one step of
`rollout.decide` per spec per unit of work (T1), written through `transitions`.

The desired count is one input (`DeploymentSpec.desired_instances`: the autoscaler's target
within [minInstances, maxInstances]); the decision surges one instance of the target revision
during a rollout, retires the surplus or the replaced instances (Running ones drain first) and
records the rollout's progress and completion. While the version is DEPLOYING, what may be
created is bounded by the spec's attempts (`health.status.may_replace`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments import rollout, transitions
from service.deployments.models import Deployment, DeploymentSpec, Instance, InstanceDesired
from service.deployments.reconcile.counts import progress_of
from service.health.machine import Phase
from service.health.status import VersionStatus, attempts_left


async def converge_counts(
    session: AsyncSession,
    dep: Deployment,
    rows: list[Instance],
    now: datetime,
    *,
    owner: str,
    expires: datetime,
    status: VersionStatus | None,
    attempts: int,
) -> list[Instance]:
    """Each spec's next step: create instances on its target revision (while DEPLOYING,
    within its attempts), retire the surplus or the replaced ones; the instances created
    (leased to `owner` until `expires`)."""
    created: list[Instance] = []
    for spec in dep.specs:
        present = [r for r in rows if r.spec_id == spec.id and r.desired == InstanceDesired.PRESENT]
        allowed = attempts_left(progress_of(spec, present), status, attempts)
        created += await _converge_spec(session, dep, spec, present, now, owner, expires, allowed)
    return created


async def _converge_spec(
    session: AsyncSession,
    dep: Deployment,
    spec: DeploymentSpec,
    present: list[Instance],
    now: datetime,
    owner: str,
    expires: datetime,
    allowed: int | None,
) -> list[Instance]:
    desired = spec.desired_instances
    progressing = spec.rollout_state == rollout.RolloutState.PROGRESSING
    decision = rollout.decide(
        desired,
        spec.target_revision,
        [rollout.Member(r.id, r.revision, r.phase == Phase.RUNNING, r.created_at) for r in present],
        rolling=progressing,
    )
    created = [
        transitions.create_instance(
            session,
            dep,
            spec,
            now,
            owner=owner,
            lease_expires_at=expires,
            ordinal=len(present) + n + 1,
        )
        for n in range(decision.create if allowed is None else min(decision.create, allowed))
    ]
    by_id = {r.id: r for r in present}
    for inst_id in decision.retire:
        row = by_id[inst_id]
        if row.revision != spec.target_revision:
            transitions.retire_instance(
                session,
                row,
                now,
                kind="rollout",
                reason="Replaced",
                message=f"(revision {row.revision}) replaced by revision {spec.target_revision}",
                drain=True,
            )
        else:
            transitions.retire_instance(
                session,
                row,
                now,
                kind="scaling",
                reason="ScaledDown",
                message=f"removed: {spec.instance_type} wants {desired} instances "
                f"(minInstances {spec.min_instances}, maxInstances {spec.max_instances})",
                drain=True,
            )
    if progressing and decision.retire and not decision.completed:
        done = sum(
            1 for r in present if r.revision == spec.target_revision and r.id not in decision.retire
        )
        transitions.rollout_progressed(session, dep, spec, done, desired)
    if decision.completed:
        await transitions.rollout_completed(session, dep, spec, now)
    return created

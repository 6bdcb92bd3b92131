"""The deployment-level decisions of a unit of work, taken under the deployment's row lock:
the version's status from its instances (the pure rules of service.health.status), with
whether the deployment has settled. How many instances each spec runs, and on which revision,
is converge.py's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments import rollout, transitions
from service.deployments.models import Deployment, DeploymentSpec, Instance, InstanceDesired
from service.functions.models import FunctionVersion
from service.health.machine import Phase
from service.health.status import (
    SpecProgress,
    VersionStatus,
    deploy_failed,
    next_status,
)


def aggregate(
    session: AsyncSession,
    dep: Deployment,
    version: FunctionVersion,
    rows: dict[uuid.UUID, Instance],
    failures: list[Instance],
    statuses: list[transitions.StatusChange],
    now: datetime,
    *,
    owner: str,
    attempts: int,
) -> tuple[bool, bool]:
    """Version status from the instances (appended to `statuses`, written for the whole
    batch at once); returns (settled, wake again)."""
    present = [r for r in rows.values() if r.desired == InstanceDesired.PRESENT]
    specs = {s.id: s for s in dep.specs}
    for row in failures:
        if row.spec_id in specs:
            transitions.count_failure(specs[row.spec_id])
    progress = [progress_of(s, [r for r in present if r.spec_id == s.id]) for s in dep.specs]
    previous = transitions.status_of(version)
    status = next_status(previous, deployed=True, specs=progress, attempts=attempts)
    wake = bool(failures)
    if status is not previous:
        statuses.append(status_change(dep, version, status, progress, failures, attempts))
    if status is VersionStatus.ERROR:
        # The version failed while deploying: no retries, tear the others down.
        for r in present:
            transitions.retire_instance(
                session,
                r,
                now,
                kind="teardown",
                reason="VersionError",
                message="torn down: the function version is in ERROR",
            )
            wake = True
        pending = any(r.applied for r in rows.values())
        return not pending and not present, wake
    counts_met = all(
        sum(1 for r in present if r.spec_id == s.id) == s.desired_instances for s in dep.specs
    )
    all_running = all(
        r.phase == Phase.RUNNING
        or (r.lease_owner not in (None, owner) and r.lease_expires_at is not None)
        for r in present
    )
    teardown_pending = any(r.applied for r in rows.values() if r.desired != InstanceDesired.PRESENT)
    secrets_pending = any(secrets_stale(r, version) for r in present)
    # A rollout is settled only once T1 has recorded its completion.
    rolling = any(s.rollout_state == rollout.RolloutState.PROGRESSING for s in dep.specs)
    settled = counts_met and all_running and not teardown_pending
    return settled and not secrets_pending and not rolling, wake


def status_change(
    dep: Deployment,
    version: FunctionVersion,
    status: VersionStatus,
    progress: list[SpecProgress],
    failures: list[Instance],
    attempts: int,
) -> transitions.StatusChange:
    """The timeline's wording of a status change; ERROR says why, with the last failure."""
    if status is not VersionStatus.ERROR:
        return transitions.StatusChange(dep.id, version, status)
    why = deploy_failed(progress, attempts)
    cause = failures[0] if failures else None
    detail = "; ".join(p for p in (why, f"last failure: {cause.message}" if cause else None) if p)
    return transitions.StatusChange(
        dep.id,
        version,
        status,
        detail=detail or None,
        reason=cause.reason if cause else "DeployAttemptsExhausted",
    )


def secrets_stale(row: Instance, version: FunctionVersion | None) -> bool:
    """An applied instance whose Secret holds older secrets than the version's."""
    return (
        version is not None
        and row.applied
        and row.secrets_generation < (version.secrets_generation or 0)
    )


def progress_of(spec: DeploymentSpec, present: Sequence[Instance]) -> SpecProgress:
    """A spec's progress from its wanted instances and its attempt counters."""
    return SpecProgress(
        spec.floor_instances,
        sum(1 for r in present if r.phase == Phase.RUNNING),
        present=len(present),
        tried=spec.attempts,
        failed=spec.failures,
        wanted=spec.desired_instances,
    )

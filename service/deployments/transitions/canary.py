"""A canary release's state, written here only (docs/rollouts.md, "Canary releases"): started,
decided (advanced, promoted, rolled back: canary.py `decide`), paused, resumed, promoted or
aborted now. Each write sets the function's traffic split to the release's weights and adds a
`canary` event with the reason and figures to the timelines of both versions' deployments, in
the caller's transaction; every write after the start is a compare-and-set on the release's
`revision`, so two replicas never both take a decision. Callers publish `AccessChanged` after
the commit (the route tables re-read the split)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from service.deployments import repository
from service.deployments.canary import Decision, Figures, Phase, PlanIn, State
from service.deployments.events import record_event
from service.deployments.models import CanaryRelease
from service.deployments.transitions.deployment import undeploy
from service.deployments.transitions.traffic import set_split
from service.functions import repository as functions_repository

#: phases in which a release is under way (the function's one release)
UNDER_WAY = (Phase.RUNNING, Phase.PAUSED)
_REASONS = {
    Phase.RUNNING: "CanaryAdvanced",
    Phase.PAUSED: "CanaryPaused",
    Phase.PROMOTED: "CanaryPromoted",
    Phase.ROLLED_BACK: "CanaryRolledBack",
    Phase.ABORTED: "CanaryAborted",
}


def plan_of(release: CanaryRelease) -> PlanIn:
    return PlanIn.model_validate(release.plan)


def state_of(release: CanaryRelease) -> State:
    return State(Phase(release.phase), release.step, release.step_started_at)


def weight_of(release: CanaryRelease) -> int:
    """The canary's weight in the release's state."""
    phase = Phase(release.phase)
    if phase is Phase.PROMOTED:
        return 100
    if phase in UNDER_WAY:
        return plan_of(release).steps[release.step].weight
    return 0


def analysis_of(canary: Figures, stable: Figures) -> dict[str, Any]:
    """The figures of a decision as stored and shown."""

    def one(f: Figures) -> dict[str, Any]:
        return {
            "requests": f.requests,
            "errors": f.errors,
            "errorRate": round(f.error_rate, 6),
            "p95Seconds": round(f.p95_seconds, 6),
        }

    return {"canary": one(canary), "stable": one(stable)}


async def _split(session: AsyncSession, release: CanaryRelease, weight: int, now: datetime) -> None:
    # the versions before their deployments (every writer's order: a rollback goes on to
    # write the canary version's status under its deployment)
    await functions_repository.lock_versions(
        session, {release.stable_version_id, release.canary_version_id}
    )
    weights = {release.stable_version_id: 100 - weight, release.canary_version_id: weight}
    await set_split(session, release.function_id, {v: w for v, w in weights.items() if w > 0}, now)


async def _record(session: AsyncSession, release: CanaryRelease, message: str, reason: str) -> None:
    """The event on both versions' timelines (those deployed)."""
    for version_id in (release.canary_version_id, release.stable_version_id):
        deployment = await repository.live_deployment(session, version_id)
        if deployment is not None:
            record_event(session, deployment.id, "canary", message, reason=reason)


async def start_canary(
    session: AsyncSession,
    *,
    function_id: uuid.UUID,
    canary_version_id: uuid.UUID,
    stable_version_id: uuid.UUID,
    plan: PlanIn,
    undeploy_on_rollback: bool,
    by: str | None,
    now: datetime,
) -> CanaryRelease:
    """A release at its first step (flushed: a release already under way for the function is
    the unique key's IntegrityError, for the caller to word)."""
    release = CanaryRelease(
        id=uuid.uuid4(),
        function_id=function_id,
        active_function_id=function_id,
        canary_version_id=canary_version_id,
        stable_version_id=stable_version_id,
        plan=plan.model_dump(mode="json", by_alias=True),
        undeploy_on_rollback=undeploy_on_rollback,
        phase=Phase.RUNNING.value,
        step=0,
        step_started_at=now,
        revision=0,
        created_by=by,
        created_at=now,
        updated_at=now,
    )
    session.add(release)
    await session.flush()
    weight = plan.steps[0].weight
    await _split(session, release, weight, now)
    who = f" by {by}" if by else ""
    release.reason = (
        f"canary release {release.id} of version {canary_version_id} started{who} against "
        f"version {stable_version_id}: step 1 of {len(plan.steps)}, weight {weight}%"
    )
    await _record(session, release, release.reason, "CanaryStarted")
    return release


async def write_state(
    session: AsyncSession,
    release: CanaryRelease,
    state: State,
    *,
    message: str,
    now: datetime,
    analysis: dict[str, Any] | None = None,
    reason: str | None = None,
) -> bool:
    """The release moves to `state` (compare-and-set on its revision: whether it was written),
    the split follows its weight and the change is an event (`message`, with its figures;
    `reason`: the event's, else the new phase's)."""
    values: dict[str, Any] = {
        "phase": state.phase.value,
        "step": state.step,
        "step_started_at": state.step_started_at,
        "active_function_id": release.function_id if state.phase in UNDER_WAY else None,
        "revision": release.revision + 1,
        "reason": message,
        "updated_at": now,
    }
    if analysis is not None:
        values["analysis"] = analysis
    done = (
        await session.execute(
            update(CanaryRelease)
            .where(CanaryRelease.id == release.id, CanaryRelease.revision == release.revision)
            .values(**values)
            .returning(CanaryRelease.id)
            .execution_options(synchronize_session=False)
        )
    ).first()
    if done is None:
        return False
    for attr, value in values.items():
        set_committed_value(release, attr, value)
    await _split(session, release, weight_of(release), now)
    await _record(session, release, message, reason or _REASONS[state.phase])
    if state.phase in (Phase.ROLLED_BACK, Phase.ABORTED) and release.undeploy_on_rollback:
        deployment = await repository.live_deployment(session, release.canary_version_id)
        if deployment is not None:
            version = await functions_repository.version_by_id(session, release.canary_version_id)
            await undeploy(
                session,
                deployment,
                version,
                now,
                message=f"canary release {release.id} {state.phase.value.lower()}: the canary "
                "is undeployed (undeployOnRollback)",
            )
    return True


async def decided(
    session: AsyncSession,
    release: CanaryRelease,
    decision: Decision,
    canary: Figures,
    stable: Figures,
    now: datetime,
) -> bool:
    """Write what `decide` said, when it changed something (its reason is the event)."""
    if decision.reason is None:
        return False
    return await write_state(
        session,
        release,
        decision.state,
        message=f"canary release {release.id}: {decision.reason}",
        now=now,
        analysis=analysis_of(canary, stable),
    )

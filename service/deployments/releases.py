"""A function's canary release through the API (docs/rollouts.md, "Canary releases"): the start
checked with every violation named, its status with the live figures of the current step, and
the operator's pause, resume, promote and abort. The state is written by transitions/canary.py;
the loop that decides it is canary_loop.py."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from pydantic.alias_generators import to_camel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.schemas import iso_z
from service.core.validation import RequestModel
from service.deployments import repository, transitions
from service.deployments.canary import Phase, PlanIn, State
from service.deployments.canary_loop import figures
from service.deployments.models import CanaryRelease
from service.deployments.traffic import INVOCABLE
from service.functions import repository as functions_repository


class CanaryStart(RequestModel):
    """Body of `POST /functions/{functionId}/canary`."""

    version_id: uuid.UUID
    plan: PlanIn
    #: the version the canary is compared with (default: the one taking most of the traffic)
    stable_version_id: uuid.UUID | None = None
    undeploy_on_rollback: StrictBool = False


class Action(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ABORT = "abort"


class CanaryOut(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    id: uuid.UUID
    function_id: uuid.UUID
    canary_version_id: uuid.UUID
    stable_version_id: uuid.UUID
    phase: str
    #: the current step, from 1, of `steps`
    step: int
    steps: int
    #: the canary's weight now (the stable version has the rest)
    weight: int
    step_started_at: str
    plan: dict[str, Any]
    undeploy_on_rollback: bool
    #: the figures of the current step so far (a release under way), or of the last decision
    analysis: dict[str, Any] | None = None
    #: the last change's reason, with the figures that decided it
    reason: str | None = None
    created_by: str | None = None
    created_at: str
    updated_at: str
    traffic: list[dict[str, Any]] = Field(default_factory=list)


async def latest(session: AsyncSession, function_id: uuid.UUID) -> CanaryRelease | None:
    """The function's release under way, else its most recent one."""
    return await repository.latest_release(session, function_id)


async def view(session: AsyncSession, release: CanaryRelease) -> CanaryOut:
    analysis = release.analysis
    if release.phase in (Phase.RUNNING.value, Phase.PAUSED.value):
        analysis = transitions.analysis_of(*await figures(session, release))
    weight = transitions.weight_of(release)
    split = [(release.stable_version_id, 100 - weight), (release.canary_version_id, weight)]
    return CanaryOut(
        id=release.id,
        function_id=release.function_id,
        canary_version_id=release.canary_version_id,
        stable_version_id=release.stable_version_id,
        phase=release.phase,
        step=release.step + 1,
        steps=len(release.plan.get("steps", [])),
        weight=weight,
        step_started_at=iso_z(release.step_started_at),
        plan=release.plan,
        undeploy_on_rollback=release.undeploy_on_rollback,
        analysis=analysis,
        reason=release.reason,
        created_by=release.created_by,
        created_at=iso_z(release.created_at),
        updated_at=iso_z(release.updated_at),
        traffic=[{"versionId": str(v), "weight": w} for v, w in split],
    )


async def _version_errors(
    session: AsyncSession, function_id: uuid.UUID, body: CanaryStart
) -> tuple[list[FieldError], uuid.UUID | None]:
    """Every violation of the versions named, and the stable version (chosen when not named)."""
    named = {"versionId": body.version_id}
    if body.stable_version_id is not None:
        named["stableVersionId"] = body.stable_version_id
    rows = await repository.with_live_deployment(
        session, functions_repository.versions_with_ids(list(named.values()))
    )
    known = {r.id: r for r in rows}
    errors: list[FieldError] = []
    for field, vid in named.items():
        row = known.get(vid)
        if row is None or row.function_id != function_id:
            errors.append(FieldError(field, f"{vid} is not a version of function {function_id}"))
        elif row.status not in INVOCABLE or row.deployment_id is None:
            status = "not deployed" if row.deployment_id is None else row.status
            errors.append(
                FieldError(
                    field,
                    f"version {vid} is {status}; a canary release needs invocable (ACTIVE or "
                    "DEGRADING, deployed) versions",
                )
            )
    if body.stable_version_id == body.version_id:
        errors.append(FieldError("stableVersionId", "must be another version than versionId"))
    stable = body.stable_version_id
    if stable is None:
        stable = await _stable(session, function_id, body.version_id)
        if stable is None:
            errors.append(
                FieldError(
                    "versionId",
                    f"function {function_id} has no other invocable version to compare version "
                    f"{body.version_id} with",
                )
            )
    return errors, stable


async def _stable(
    session: AsyncSession, function_id: uuid.UUID, canary: uuid.UUID
) -> uuid.UUID | None:
    """The version taking most of the traffic now, other than the canary: the split's heaviest,
    else the newest invocable one."""
    weights = await repository.traffic_weights(session, function_id)
    ids = await functions_repository.version_ids(session, function_id)
    rows = await repository.with_live_deployment(
        session, functions_repository.versions_with_ids(ids)
    )
    invocable = [
        r for r in rows if r.id != canary and r.status in INVOCABLE and r.deployment_id is not None
    ]
    if not invocable:
        return None
    chosen = max(invocable, key=lambda r: (weights.get(r.id, 0), r.created_at, str(r.id)))
    return uuid.UUID(str(chosen.id))


def _under_way(release: CanaryRelease) -> FieldError:
    return FieldError(
        "versionId",
        f"canary release {release.id} of version {release.canary_version_id} is "
        f"{release.phase}; promote or abort it before starting another",
    )


async def start(
    session: AsyncSession,
    function_id: uuid.UUID,
    body: CanaryStart,
    *,
    by: str,
    now: datetime,
) -> CanaryRelease:
    """A release at its first step, or a 400 naming every violation (nothing changes)."""
    errors, stable = await _version_errors(session, function_id, body)
    current = await latest(session, function_id)
    if current is not None and current.active_function_id is not None:
        errors.append(_under_way(current))
    if errors or stable is None:
        raise ValidationFailed.of(errors)
    try:
        async with session.begin_nested():
            return await transitions.start_canary(
                session,
                function_id=function_id,
                canary_version_id=body.version_id,
                stable_version_id=stable,
                plan=body.plan,
                undeploy_on_rollback=body.undeploy_on_rollback,
                by=by,
                now=now,
            )
    except IntegrityError:  # another request started one meanwhile
        raced = await latest(session, function_id)
        raise ValidationFailed.of([_under_way(raced)] if raced else []) from None


_PAST = {
    Action.PAUSE: "paused",
    Action.RESUME: "resumed",
    Action.PROMOTE: "promoted",
    Action.ABORT: "aborted",
}


async def operate(
    session: AsyncSession,
    release: CanaryRelease,
    action: Action,
    *,
    by: str,
    now: datetime,
) -> bool:
    """The operator's action now; a 400 when the release's phase does not allow it. Whether the
    state was written (False: another change won the compare-and-set; read it again)."""
    phase = Phase(release.phase)
    allowed = {
        Action.PAUSE: (Phase.RUNNING,),
        Action.RESUME: (Phase.PAUSED,),
        Action.PROMOTE: (Phase.RUNNING, Phase.PAUSED),
        Action.ABORT: (Phase.RUNNING, Phase.PAUSED),
    }[action]
    if phase not in allowed:
        names = " or ".join(p.value for p in allowed)
        raise ValidationFailed.of(
            [
                FieldError(
                    "action",
                    f"canary release {release.id} is {phase.value}; only a {names} release "
                    f"can be {_PAST[action]}",
                )
            ]
        )
    step = release.step + 1
    state, message = {
        Action.PAUSE: (
            State(Phase.PAUSED, release.step, release.step_started_at),
            f"paused at step {step} by {by}",
        ),
        Action.RESUME: (
            # the step's time starts again; what it measured so far still counts
            State(Phase.RUNNING, release.step, now),
            f"resumed at step {step} by {by}",
        ),
        Action.PROMOTE: (State(Phase.PROMOTED, release.step, now), f"promoted now by {by}"),
        Action.ABORT: (State(Phase.ABORTED, release.step, now), f"aborted at step {step} by {by}"),
    }[action]
    canary, stable = await figures(session, release)
    return await transitions.write_state(
        session,
        release,
        state,
        message=f"canary release {release.id}: {message}",
        now=now,
        analysis=transitions.analysis_of(canary, stable),
        reason="CanaryResumed" if action is Action.RESUME else None,
    )


async def get_latest(session: AsyncSession, function_id: uuid.UUID) -> CanaryRelease:
    release = await latest(session, function_id)
    if release is None:
        raise NotFound(detail=f"function {function_id} has no canary release")
    return release

"""Deployment operations: record desired state, read it back, scale it, tear it down.

Services flush; the request's transaction commits. Nothing here calls a backend: the reconciler
converges instances to what is stored and is woken after the commit (`wake_reconciler`).
Reads load a page of deployments in a constant number of queries (deployments, their specs,
their instances, their versions).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.core.db import utcnow
from service.core.errors import BadRequest, NotFound
from service.core.http import parse_uuids
from service.core.pagination import Page, keyset_page
from service.deployments import history, transitions
from service.deployments.autoscale.policy import PLATFORM, custom_policy, platform_policy
from service.deployments.logs.keep import kept_lines
from service.deployments.models import (
    Deployment,
    DeploymentDesired,
    DeploymentEvent,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
    InstanceDesired,
)
from service.deployments.schemas import (
    DeploymentOut,
    GpuSpecificationOut,
    HealthInfo,
    InstanceOut,
)
from service.deployments.validation import ScalingChange, StoredSpec, ValidatedSpec
from service.functions.models import FunctionVersion
from service.health.machine import Phase
from service.health.status import SpecProgress, VersionStatus, next_status

# --- lookups -----------------------------------------------------------------------------------


async def lock_version(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> FunctionVersion:
    """The caller's version, re-read and row-locked (`FOR UPDATE` on PostgreSQL) so concurrent
    deploys of one version serialise; 404 if it is not the caller's."""
    stmt = (
        select(FunctionVersion)
        .where(FunctionVersion.id == version_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    version = (await session.execute(stmt)).scalar_one_or_none()
    if version is None or version.account_id != account_id or version.function_id != function_id:
        raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    return version


async def live_deployment(session: AsyncSession, version_id: uuid.UUID) -> Deployment | None:
    """The version's live (`desired = deployed`) deployment, if any."""
    stmt = select(Deployment).where(
        Deployment.version_id == version_id, Deployment.desired == DeploymentDesired.DEPLOYED
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def get_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID
) -> Deployment:
    deployment = await session.get(Deployment, deployment_id)
    if deployment is None or deployment.account_id != account_id:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return deployment


async def lock_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID
) -> Deployment:
    """The caller's deployment re-read and row-locked (`FOR UPDATE` on PostgreSQL), as the
    reconciler locks it, so a change of its specs never interleaves with a unit of work."""
    stmt = (
        select(Deployment)
        .where(Deployment.id == deployment_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    deployment = (await session.execute(stmt)).scalar_one_or_none()
    if deployment is None or deployment.account_id != account_id:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return deployment


async def live_spec(
    session: AsyncSession, principal: Principal, deployment_id: str, spec_id: str
) -> tuple[Deployment, DeploymentSpec]:
    """The caller's live deployment, locked, and one of its specifications (404; 400 when the
    deployment is being deleted)."""
    did, sid = parse_uuids((deployment_id, "deploymentId"), (spec_id, "gpuSpecificationId"))
    deployment = await lock_deployment(session, principal.account_id, did)
    spec = next((s for s in deployment.specs if s.id == sid), None)
    if spec is None:
        raise NotFound(detail=f"GPU specification {sid} not found in deployment {did}")
    if deployment.desired != DeploymentDesired.DEPLOYED:
        raise BadRequest(
            detail=f"deployment {did} is being deleted; its GPU specifications cannot change"
        )
    return deployment, spec


async def find_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID, now: datetime
) -> Deployment | DeploymentHistory:
    """The caller's deployment, or its history once removed (until that expires); 404
    otherwise."""
    deployment = await session.get(Deployment, deployment_id)
    if deployment is not None and deployment.account_id == account_id:
        return deployment
    removed = await history.find(session, account_id, deployment_id, now)
    if removed is None:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return removed


async def get_version_deployment(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> Deployment:
    """The live deployment of the caller's version; 404 when the version or deployment is
    unknown."""
    deployment = await live_deployment(session, version_id)
    if (
        deployment is None
        or deployment.account_id != account_id
        or deployment.function_id != function_id
    ):
        raise NotFound(detail=f"no deployment of version {version_id} of function {function_id}")
    return deployment


async def list_deployments(
    session: AsyncSession, account_id: str, page: Page, only: frozenset[uuid.UUID] | None = None
) -> tuple[list[Deployment], str | None]:
    """The caller's live deployments, oldest first, keyset-paginated like the functions list
    (`only`: of these functions, for a key limited to them)."""
    stmt = select(Deployment).where(
        Deployment.account_id == account_id, Deployment.desired == DeploymentDesired.DEPLOYED
    )
    if only is not None:
        stmt = stmt.where(Deployment.function_id.in_(list(only)))
    return await keyset_page(
        session,
        stmt,
        page,
        created=Deployment.created_at,
        ident=Deployment.id,
        cursor_of=lambda d: (d.created_at, d.id),
    )


# --- views -------------------------------------------------------------------------------------


async def _instances_of(
    session: AsyncSession, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Instance]]:
    out: dict[uuid.UUID, list[Instance]] = defaultdict(list)
    if not deployment_ids:
        return out
    stmt = (
        select(Instance)
        .where(Instance.deployment_id.in_(deployment_ids))
        .order_by(Instance.created_at, Instance.id)
    )
    for inst in (await session.execute(stmt)).scalars():
        out[inst.deployment_id].append(inst)
    return out


async def _statuses_of(
    session: AsyncSession, version_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, str]:
    ids = list(set(version_ids))
    if not ids:
        return {}
    stmt = select(FunctionVersion.id, FunctionVersion.status).where(FunctionVersion.id.in_(ids))
    return {vid: status for vid, status in (await session.execute(stmt)).all()}


async def _error_reasons(
    session: AsyncSession, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, DeploymentEvent]:
    """The latest event carrying a reason, per deployment (healthInfo of ERROR versions whose
    failed instance rows are gone)."""
    if not deployment_ids:
        return {}
    stmt = (
        select(DeploymentEvent)
        .where(
            DeploymentEvent.deployment_id.in_(deployment_ids),
            DeploymentEvent.reason.is_not(None),
        )
        .order_by(DeploymentEvent.at, DeploymentEvent.id)
    )
    return {e.deployment_id: e for e in (await session.execute(stmt)).scalars()}


def _error_text(reason: str | None, message: str | None) -> str:
    if reason and message:
        return f"{reason}: {message}"
    return reason or message or "instance failed"


async def deployment_views(
    session: AsyncSession, deployments: Sequence[Deployment]
) -> list[DeploymentOut]:
    """API objects of `deployments` (specs are loaded with them), in three more queries."""
    ids = [d.id for d in deployments]
    instances = await _instances_of(session, ids)
    statuses = await _statuses_of(session, (d.version_id for d in deployments))
    errored = [
        d.id
        for d in deployments
        if d.desired == DeploymentDesired.DEPLOYED
        and statuses.get(d.version_id) == VersionStatus.ERROR
        and not any(i.phase == Phase.FAILED for i in instances.get(d.id, []))
    ]
    reasons = await _error_reasons(session, errored)
    kept = await kept_lines(session, (i.id for d in deployments for i in instances.get(d.id, [])))
    out: list[DeploymentOut] = []
    for d in deployments:
        specs = {s.id: s for s in d.specs}
        live = d.desired == DeploymentDesired.DEPLOYED
        status = (
            statuses.get(d.version_id, VersionStatus.INACTIVE) if live else VersionStatus.INACTIVE
        )
        health: list[HealthInfo] = []
        for inst in instances.get(d.id, []):
            spec = specs.get(inst.spec_id)
            if inst.phase == Phase.FAILED and spec is not None:
                health.append(
                    HealthInfo(
                        gpu=spec.gpu,
                        instance_type=spec.instance_type,
                        backend=spec.backend,
                        error=_error_text(inst.reason, inst.message),
                        last_logs=kept.get(inst.id),
                    )
                )
        event = reasons.get(d.id)
        if event is not None and not health and d.specs:
            spec = d.specs[0]
            health.append(
                HealthInfo(
                    gpu=spec.gpu,
                    instance_type=spec.instance_type,
                    backend=spec.backend,
                    error=_error_text(event.reason, event.message),
                )
            )
        out.append(
            DeploymentOut.of(
                d,
                function_status=str(status),
                instances=[
                    InstanceOut(
                        instance_id=i.id,
                        gpu_specification_id=i.spec_id,
                        revision=i.revision,
                        cluster=i.cluster,
                        phase=i.phase,
                        reason=i.reason,
                        message=i.message,
                        since=i.since,
                        last_logs=kept.get(i.id),
                    )
                    for i in instances.get(d.id, [])
                    if i.desired == InstanceDesired.PRESENT
                ],
                health_info=health,
                updated=_updated(d, instances.get(d.id, [])),
            )
        )
    return out


def _updated(
    deployment: Deployment, instances: Sequence[Instance]
) -> dict[uuid.UUID, tuple[int, int]]:
    """Per spec: (wanted Running instances on its target revision, instances it runs)."""
    out: dict[uuid.UUID, tuple[int, int]] = {}
    for spec in deployment.specs:
        done = sum(
            1
            for i in instances
            if i.spec_id == spec.id
            and i.desired == InstanceDesired.PRESENT
            and i.phase == Phase.RUNNING
            and i.revision == spec.target_revision
        )
        out[spec.id] = (done, spec.min_instances)
    return out


async def deployment_view(session: AsyncSession, deployment: Deployment) -> DeploymentOut:
    return (await deployment_views(session, [deployment]))[0]


async def spec_view(
    session: AsyncSession, deployment: Deployment, spec: DeploymentSpec
) -> GpuSpecificationOut:
    """The spec as the deployment object shows it (with its rollout progress)."""
    view = await deployment_view(session, deployment)
    return next(s for s in view.deployment_specifications if s.gpu_specification_id == spec.id)


def history_view(
    row: DeploymentHistory, kept: Mapping[uuid.UUID, list[str]] | None = None
) -> DeploymentOut:
    """A removed deployment as the API shows it: INACTIVE, no instances, the failed ones in
    `failedInstances` (and `healthInfo`), `removedAt` and `historyExpiresAt`."""
    specs = [GpuSpecificationOut.model_validate(s) for s in row.specifications]
    by_id = {s.gpu_specification_id: s for s in specs}
    failed = [InstanceOut.model_validate(i) for i in row.failed_instances]
    health = [
        HealthInfo(
            gpu=spec.gpu,
            instance_type=spec.instance_type,
            backend=spec.backend,
            error=_error_text(i.reason, i.message),
            last_logs=(kept or {}).get(i.instance_id),
        )
        for i in failed
        if (spec := by_id.get(i.gpu_specification_id)) is not None
    ]
    return DeploymentOut(
        deployment_id=row.id,
        function_id=row.function_id,
        function_version_id=row.version_id,
        function_name=row.function_name,
        nca_id=row.account_id,
        function_status=str(VersionStatus.INACTIVE),
        deployment_specifications=specs,
        instances=[],
        health_info=health or None,
        created_at=row.created_at,
        last_updated_at=row.removed_at,
        failed_instances=failed or None,
        removed_at=row.removed_at,
        history_expires_at=row.expires_at,
    )


async def view_of(session: AsyncSession, found: Deployment | DeploymentHistory) -> DeploymentOut:
    """`deployment_view` of a deployment, `history_view` of a removed one."""
    if isinstance(found, DeploymentHistory):
        failed = [InstanceOut.model_validate(i).instance_id for i in found.failed_instances]
        return history_view(found, await kept_lines(session, failed))
    return await deployment_view(session, found)


async def version_history(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    page: Page,
    now: datetime,
) -> tuple[list[DeploymentOut], str | None]:
    """The caller's removed deployments of a version, oldest first, until they expire. 404
    when the caller neither owns the version nor has history of it (another account, or a
    version deleted whose history has expired)."""
    rows, next_cursor = await history.of_version(
        session, account_id, function_id, version_id, page, now
    )
    if not rows and page.after is None:
        owned = (
            await session.execute(
                select(FunctionVersion.id).where(
                    FunctionVersion.id == version_id,
                    FunctionVersion.function_id == function_id,
                    FunctionVersion.account_id == account_id,
                )
            )
        ).first()
        if owned is None:
            raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    failed = [InstanceOut.model_validate(i).instance_id for r in rows for i in r.failed_instances]
    kept = await kept_lines(session, failed)
    return [history_view(r, kept) for r in rows], next_cursor


# --- create ------------------------------------------------------------------------------------


@dataclass
class SpecObjects:
    """A validated specification with the objects it will install."""

    spec: ValidatedSpec
    objects: list[dict[str, Any]]


def initial_status(specs: Iterable[ValidatedSpec]) -> VersionStatus:
    """DEPLOYING, or ACTIVE at once when every minInstances is 0 (runtime.md §6)."""
    progress = [SpecProgress(min_instances=s.min_instances, running=0) for s in specs]
    return next_status(VersionStatus.INACTIVE, deployed=True, specs=progress)


async def create_deployment(
    session: AsyncSession,
    *,
    version: FunctionVersion,
    specs: Sequence[SpecObjects],
    feature_flags: dict[str, bool],
    by: str | None = None,
) -> Deployment:
    """Store the deployment and its specifications, move the version out of INACTIVE and
    record the validation and dispatch events. The caller checked the version is INACTIVE
    without a live deployment; the partial unique index refuses a second live one."""
    now = utcnow()
    deployment = Deployment(
        id=uuid.uuid4(),
        account_id=version.account_id,
        function_id=version.function_id,
        version_id=version.id,
        function_name=version.name,
        feature_flags=dict(feature_flags),
        generation=1,
        created_at=now,
        updated_at=now,
    )
    deployment.specs = [
        DeploymentSpec(
            id=uuid.uuid4(),
            position=position,
            gpu=item.spec.target.gpu,
            instance_type=item.spec.target.instance_type.name,
            backend=item.spec.target.group.name,
            clusters=item.spec.clusters,
            regions=item.spec.regions,
            attributes=item.spec.attributes,
            availability_zones=item.spec.availability_zones,
            candidate_clusters=[c.name for c in item.spec.target.clusters],
            min_instances=item.spec.min_instances,
            max_instances=item.spec.max_instances,
            max_request_concurrency=item.spec.max_request_concurrency,
            preferred_order=item.spec.preferred_order,
            configuration=item.spec.configuration,
            helm_validation_policy=item.spec.helm_validation_policy,
            objects=item.objects,
        )
        for position, item in enumerate(specs)
    ]
    summary = "; ".join(
        f"{s.gpu} {s.instance_type} on {s.backend} "
        f"(min {s.min_instances}, max {s.max_instances}; "
        f"clusters {', '.join(s.candidate_clusters)})"
        for s in deployment.specs
    )
    n = len(deployment.specs)
    await transitions.deploy(
        session,
        deployment,
        version,
        initial_status(s.spec for s in specs),
        now,
        validated=f"{n} GPU specification{'s' if n != 1 else ''} validated: {summary}",
        by=by,
    )
    await session.flush()
    return deployment


# --- scaling -----------------------------------------------------------------------------------


def stored_spec(spec: DeploymentSpec) -> StoredSpec:
    """The stored specification as PUT/PATCH validation compares it (API field names)."""
    return StoredSpec(
        id=spec.id,
        min_instances=spec.min_instances,
        max_instances=spec.max_instances,
        max_request_concurrency=spec.max_request_concurrency,
        fixed={
            "gpu": spec.gpu,
            "instanceType": spec.instance_type,
            "backend": spec.backend,
            "clusters": spec.clusters,
            "regions": spec.regions,
            "attributes": spec.attributes,
            "availabilityZones": spec.availability_zones,
            "preferredOrder": spec.preferred_order,
            "configuration": spec.configuration,
            "helmValidationPolicy": spec.helm_validation_policy,
        },
        candidate_clusters=tuple(str(c) for c in spec.candidate_clusters or ()),
        autoscaling_policy=spec.autoscaling_policy,
        autoscaling_configuration=spec.autoscaling_configuration,
    )


async def running_counts(session: AsyncSession, deployment_id: uuid.UUID) -> dict[uuid.UUID, int]:
    """Running, wanted instances per specification of the deployment."""
    stmt = (
        select(Instance.spec_id, func.count())
        .where(
            Instance.deployment_id == deployment_id,
            Instance.desired == InstanceDesired.PRESENT,
            Instance.phase == Phase.RUNNING,
        )
        .group_by(Instance.spec_id)
    )
    return {sid: int(n) for sid, n in (await session.execute(stmt)).all()}


def _set_autoscaling(
    spec: DeploymentSpec, policy: str, configuration: dict[str, Any] | None
) -> list[str]:
    """Store a specification's autoscaling policy; what changed, for the timeline."""
    before = spec.autoscaling_policy or PLATFORM
    if before == policy and spec.autoscaling_configuration == configuration:
        return []
    spec.autoscaling_policy = policy
    spec.autoscaling_configuration = configuration
    described = f"autoscalingConfigurationPolicy {before} → {policy}"
    if configuration is not None:
        described += f" ({custom_policy(configuration, platform_policy()).describe()})"
    return [described]


async def apply_scaling(
    session: AsyncSession,
    deployment: Deployment,
    changes: Sequence[ScalingChange],
    version: FunctionVersion | None,
) -> bool:
    """Apply new scaling values; bump the generation, record a `scaling` event and recompute
    the version status when something changed. Returns whether anything changed."""
    specs = {s.id: s for s in deployment.specs}
    described: list[str] = []
    max_before = sum(s.max_instances for s in deployment.specs)
    for change in changes:
        spec = specs[change.spec_id]
        parts: list[str] = []
        for attr, label, value in (
            ("min_instances", "minInstances", change.min_instances),
            ("max_instances", "maxInstances", change.max_instances),
            ("max_request_concurrency", "maxRequestConcurrency", change.max_request_concurrency),
        ):
            old = getattr(spec, attr)
            if value is not None and value != old:
                setattr(spec, attr, value)
                parts.append(f"{label} {old} → {value}")
        if change.autoscaling is not None:
            parts += _set_autoscaling(spec, *change.autoscaling)
        if parts:
            described.append(f"{spec.gpu} {spec.instance_type} ({spec.id}): " + ", ".join(parts))
    if not described:
        return False
    now = utcnow()
    added = sum(s.max_instances for s in deployment.specs) - max_before
    await transitions.rescale(deployment, session, "; ".join(described), now, added_max=added)
    if version is not None:
        running = await running_counts(session, deployment.id)
        progress = [
            SpecProgress(min_instances=s.min_instances, running=running.get(s.id, 0))
            for s in deployment.specs
        ]
        status = next_status(transitions.status_of(version), deployed=True, specs=progress)
        await transitions.set_version_status(
            session, deployment.id, version, status, now, cause="scaling"
        )
    await session.flush()
    return True


# --- teardown ----------------------------------------------------------------------------------


async def undeploy(
    session: AsyncSession,
    deployment: Deployment,
    version: FunctionVersion | None,
    *,
    message: str = "deployment deleted; instances will be torn down",
    drain: bool = False,
) -> None:
    """Mark the deployment `deleting` (the reconciler tears its instances down and removes it)
    and turn the version INACTIVE at once; `drain`: Running instances first finish their
    requests in flight and queued (graceful)."""
    await transitions.undeploy(session, deployment, version, utcnow(), message=message, drain=drain)
    await session.flush()


async def undeploy_version(
    session: AsyncSession, version_id: uuid.UUID, *, message: str
) -> Deployment | None:
    """Mark the version's live deployment (if any) `deleting`; for a version being deleted.
    The deployment row outlives the version row (no foreign key)."""
    deployment = await live_deployment(session, version_id)
    if deployment is not None:
        await undeploy(session, deployment, None, message=message)
    return deployment


# --- events ------------------------------------------------------------------------------------


async def list_events(
    session: AsyncSession, deployment_id: uuid.UUID, page: Page
) -> tuple[list[DeploymentEvent], str | None]:
    """The deployment's timeline, oldest first (ties in insertion order)."""
    stmt = select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment_id)
    return await keyset_page(
        session,
        stmt,
        page,
        created=DeploymentEvent.at,
        ident=DeploymentEvent.id,
        cursor_of=lambda e: (e.at, uuid.UUID(int=e.id)),
        ident_from_cursor=lambda u: u.int,
    )


# --- activeInstances of function versions ------------------------------------------------------


@dataclass(frozen=True)
class ActiveInstanceRow:
    instance_id: uuid.UUID
    phase: str
    instance_type: str
    gpu: str
    backend: str
    cluster: str | None
    created_at: Any
    updated_at: Any


async def active_instances(
    session: AsyncSession, version_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[ActiveInstanceRow]]:
    """Wanted instances of each version's live deployment, in one query."""
    out: dict[uuid.UUID, list[ActiveInstanceRow]] = defaultdict(list)
    if not version_ids:
        return out
    stmt = (
        select(
            Deployment.version_id,
            Instance.id,
            Instance.phase,
            DeploymentSpec.instance_type,
            DeploymentSpec.gpu,
            DeploymentSpec.backend,
            Instance.cluster,
            Instance.created_at,
            Instance.updated_at,
        )
        .join(Deployment, Deployment.id == Instance.deployment_id)
        .join(DeploymentSpec, DeploymentSpec.id == Instance.spec_id)
        .where(
            Deployment.version_id.in_(list(version_ids)),
            Deployment.desired == DeploymentDesired.DEPLOYED,
            Instance.desired == InstanceDesired.PRESENT,
        )
        .order_by(Instance.created_at, Instance.id)
    )
    for vid, iid, phase, itype, gpu, backend, cluster, created, updated in (
        await session.execute(stmt)
    ).all():
        out[vid].append(
            ActiveInstanceRow(iid, phase, itype, gpu, backend, cluster, created, updated)
        )
    return out

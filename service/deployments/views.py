"""Read models of deployments: the API objects of live deployments (with their instances,
health and rollout progress) and of removed ones (history), built from the repository's batched
reads."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.errors import NotFound
from service.core.pagination import Page
from service.deployments import repository
from service.deployments.logs.keep import kept_lines
from service.deployments.models import (
    Deployment,
    DeploymentDesired,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
    InstanceDesired,
)
from service.deployments.repository import error_reasons, instances_of
from service.deployments.schemas import (
    DeploymentOut,
    GpuSpecificationOut,
    HealthInfo,
    InstanceOut,
)
from service.functions import repository as functions_repository
from service.health.machine import Phase
from service.health.status import VersionStatus


def _error_text(reason: str | None, message: str | None) -> str:
    if reason and message:
        return f"{reason}: {message}"
    return reason or message or "instance failed"


async def deployment_views(
    session: AsyncSession, deployments: Sequence[Deployment]
) -> list[DeploymentOut]:
    """API objects of `deployments` (specs are loaded with them), in three more queries."""
    ids = [d.id for d in deployments]
    # The version's status first: each read sees the latest commit (no snapshot across
    # statements), and the reconciler commits an ERROR with the failed instance and its kept
    # lines, so instances read after an ERROR always include what caused it.
    statuses = await functions_repository.statuses_of(session, [d.version_id for d in deployments])
    instances = await instances_of(session, ids)
    errored = [
        d.id
        for d in deployments
        if d.desired == DeploymentDesired.DEPLOYED
        and statuses.get(d.version_id) == VersionStatus.ERROR
        and not any(i.phase == Phase.FAILED for i in instances.get(d.id, []))
    ]
    reasons = await error_reasons(session, errored)
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
    rows, next_cursor = await repository.history_of_version(
        session, account_id, function_id, version_id, page, now
    )
    if not rows and page.after is None:
        owned = await functions_repository.owns_version(
            session, account_id, function_id, version_id
        )
        if not owned:
            raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    failed = [InstanceOut.model_validate(i).instance_id for r in rows for i in r.failed_instances]
    kept = await kept_lines(session, failed)
    return [history_view(r, kept) for r in rows], next_cursor

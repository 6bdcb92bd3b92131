"""HTTP routes of deployments (api.md §3); every route needs the `deploy_function` scope.

A deploy validates every specification (catalog resolution; for helm functions a re-render of
the pinned chart with each specification's configuration), then records the desired state and
wakes the reconciler after the commit. Concurrent deploys of one version serialise on an
in-process lock and on the version row (`FOR UPDATE` on PostgreSQL); the partial unique index
`uq_deployments_live_version` is the last line (409).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy.exc import IntegrityError

from service.auth.deps import Session
from service.auth.service import Principal, lock_account
from service.core.db import after_commit, utcnow
from service.core.deps import EventsDep
from service.core.errors import (
    BadRequest,
    Conflict,
    FieldError,
    ValidationFailed,
)
from service.core.http import inline_body_doc, parse_uuid, parse_uuids, read_json
from service.core.pagination import Limit, make_page
from service.deployments import rendering, revisions, service, usage
from service.deployments.announcements import DeploymentDeleted
from service.deployments.deps import Deploying, DeployingDep, WakeDep
from service.deployments.models import Deployment
from service.deployments.router_common import SPEC_PATH, Deployer
from service.deployments.schemas import (
    SPECS,
    DeploymentCreate,
    DeploymentEnvelope,
    DeploymentList,
    EventList,
    EventOut,
    GpuSpecificationEnvelope,
    GpuSpecificationPatch,
)
from service.deployments.validation import (
    ScalingChange,
    StoredSpec,
    ValidatedSpec,
    revision_change,
    stored_capacity_errors,
    stored_policy_errors,
    validate_create,
    validate_patch,
    validate_update,
)
from service.deployments.workload import container_objects
from service.functions import service as functions_service
from service.functions.models import FunctionVersion
from service.functions.schemas import FunctionEnvelope, FunctionOut
from service.health.status import VersionStatus

router = APIRouter(tags=["deployments"])


_BY_VERSION = "/deployments/functions/{functionId}/versions/{functionVersionId}"
_CREATE_DOC = inline_body_doc(DeploymentCreate)
_PATCH_DOC = inline_body_doc(GpuSpecificationPatch)

_locks: weakref.WeakValueDictionary[uuid.UUID, asyncio.Lock] = weakref.WeakValueDictionary()


@asynccontextmanager
async def _version_lock(version_id: uuid.UUID) -> AsyncIterator[None]:
    """Serialise deploys of one version within this process (SQLite has no row locks)."""
    lock = _locks.get(version_id)
    if lock is None:
        lock = asyncio.Lock()
        _locks[version_id] = lock
    async with lock:
        yield


def _ids(function_id: str, version_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
    return fid, vid


def _check_deployable(version: FunctionVersion, live: Deployment | None) -> None:
    if live is not None:
        raise BadRequest(
            detail=f"version {version.id} is {version.status} and already has deployment "
            f"{live.id}; delete that deployment first (DELETE {_BY_VERSION}), or change its "
            "scaling with PUT or PATCH"
        )
    if version.status != VersionStatus.INACTIVE:
        raise BadRequest(
            detail=f"version {version.id} is {version.status}; only an INACTIVE version can be "
            "deployed — delete its deployment first"
        )


async def _helm_objects(
    deps: Deploying,
    session: Session,
    principal: Principal,
    version: FunctionVersion,
    specs: list[ValidatedSpec],
) -> tuple[list[service.SpecObjects], dict[str, bool]]:
    """Re-render the pinned chart for every specification; all errors of all specs → 400."""
    errors: list[FieldError] = []
    out: list[service.SpecObjects] = []
    flags: dict[str, bool] = {}
    for spec in specs:
        result, found = await rendering.render(
            deps.pipeline,
            session,
            principal,
            version,
            clusters=spec.target.clusters,
            instance_type=spec.target.instance_type,
            configuration=spec.configuration,
            policy=spec.policy,
            path=f"{spec.path}.",
        )
        errors += found
        if not found:
            out.append(service.SpecObjects(spec, result.objects))
            flags.update(result.workload_config)
    if errors:
        raise ValidationFailed.of(errors, what="deployment")
    return out, flags


async def _objects(
    deps: Deploying,
    session: Session,
    principal: Principal,
    version: FunctionVersion,
    specs: list[ValidatedSpec],
) -> tuple[list[service.SpecObjects], dict[str, bool]]:
    if version.helm_chart is not None:
        return await _helm_objects(deps, session, principal, version, specs)
    return [
        service.SpecObjects(
            spec, container_objects(version, spec.target.instance_type, spec.target.clusters[0])
        )
        for spec in specs
    ], {}


@router.post(
    _BY_VERSION,
    response_model=DeploymentEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_CREATE_DOC,
    summary="Deploy a function version",
)
async def create_deployment(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Deployer,
    deps: DeployingDep,
) -> DeploymentEnvelope:
    fid, vid = _ids(functionId, functionVersionId)
    body = await read_json(request)
    version = await functions_service.get_version(session, principal.account_id, fid, vid)
    _check_deployable(version, await service.live_deployment(session, vid))
    specs = validate_create(body, catalog=deps.catalog, is_helm=version.helm_chart is not None)
    objects, flags = await _objects(deps, session, principal, version, specs)
    async with _version_lock(vid):
        version = await service.lock_version(session, principal.account_id, fid, vid)
        _check_deployable(version, await service.live_deployment(session, vid))
        await _instances_quota(deps, session, principal, [], [s.max_instances for s in specs])
        try:
            deployment = await service.create_deployment(
                session,
                version=version,
                specs=objects,
                feature_flags=flags,
                by=revisions.principal_name(principal),
            )
        except IntegrityError:
            raise Conflict(
                detail=f"a deployment for version {vid} already exists (created concurrently)"
            ) from None
        after_commit(session, deps.wake)
        # Commit inside the lock so the next deploy of this version sees this one.
        await session.commit()
    return DeploymentEnvelope(deployment=await service.deployment_view(session, deployment))


async def _instances_quota(
    deps: Deploying,
    session: Session,
    principal: Principal,
    replaced: Sequence[StoredSpec],
    new_max: Sequence[int],
) -> None:
    """The account's instances quota (maxInstances of its live deployments), when a change
    adds instances; `replaced` specifications are counted with their new values."""
    if sum(new_max) <= sum(s.max_instances for s in replaced):
        return
    await deps.quotas.instances.check(
        lambda: usage.deployed_instances(
            session, principal.account_id, excluding=[s.id for s in replaced]
        ),
        lambda: lock_account(session, principal.account_id),
        sum(new_max),
    )


async def _check_scaling(
    deps: Deploying,
    session: Session,
    principal: Principal,
    stored: Sequence[StoredSpec],
    changes: Sequence[ScalingChange],
    body_list: str | None,
) -> None:
    """New scaling values within what the clusters could hold, and within the quota."""
    catalog = deps.catalog
    by_id = {s.id: s for s in stored}
    errors: list[FieldError] = []
    for i, change in enumerate(changes):
        path = f"{body_list}[{i}]" if body_list else ""
        errors += stored_capacity_errors(catalog, by_id[change.spec_id], change, path)
        errors += stored_policy_errors(catalog, by_id[change.spec_id], change, path)
    if errors:
        raise ValidationFailed.of(errors)
    replaced = [by_id[c.spec_id] for c in changes]
    new_max = [
        c.max_instances if c.max_instances is not None else by_id[c.spec_id].max_instances
        for c in changes
    ]
    await _instances_quota(deps, session, principal, replaced, new_max)


@router.get(
    _BY_VERSION,
    response_model=DeploymentEnvelope,
    response_model_exclude_none=True,
    summary="Get the deployment of a function version",
)
async def get_version_deployment(
    functionId: str, functionVersionId: str, session: Session, principal: Deployer
) -> DeploymentEnvelope:
    fid, vid = _ids(functionId, functionVersionId)
    deployment = await service.get_version_deployment(session, principal.account_id, fid, vid)
    return DeploymentEnvelope(deployment=await service.deployment_view(session, deployment))


@router.put(
    _BY_VERSION,
    response_model=DeploymentEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_CREATE_DOC,
    deprecated=True,
    summary="Change the scaling of a deployment's GPU specifications",
)
async def update_deployment(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Deployer,
    deps: DeployingDep,
) -> DeploymentEnvelope:
    fid, vid = _ids(functionId, functionVersionId)
    body = await read_json(request)
    deployment = await service.get_version_deployment(session, principal.account_id, fid, vid)
    stored = [service.stored_spec(s) for s in deployment.specs]
    changes = validate_update(body, stored)
    await _check_scaling(deps, session, principal, stored, changes, SPECS)
    version = await service.lock_version(session, principal.account_id, fid, vid)
    if await service.apply_scaling(session, deployment, changes, version):
        after_commit(session, deps.wake)
    return DeploymentEnvelope(deployment=await service.deployment_view(session, deployment))


@router.delete(
    _BY_VERSION,
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    summary="Undeploy a function version (its instances are torn down)",
)
async def delete_deployment(
    functionId: str,
    functionVersionId: str,
    session: Session,
    principal: Deployer,
    wake: WakeDep,
    events: EventsDep,
    graceful: Annotated[
        bool,
        Query(
            description="true: turn the version INACTIVE at once (no new requests) but let "
            "queued and in-flight requests finish (bounded by NVCF_DRAIN_TIMEOUT_SECONDS) "
            "before the instances are torn down; false: tear them down at once"
        ),
    ] = False,
) -> FunctionEnvelope:
    fid, vid = _ids(functionId, functionVersionId)
    version = await service.lock_version(session, principal.account_id, fid, vid)
    deployment = await service.get_version_deployment(session, principal.account_id, fid, vid)
    if graceful:
        message = (
            "deployment deleted (graceful): the version takes no new requests; instances "
            "finish the requests in flight and queued, then are torn down"
        )
    else:
        message = "deployment deleted (immediate); instances will be torn down"
    await service.undeploy(session, deployment, version, message=message, drain=graceful)
    after_commit(session, wake)
    # the invocation plane of this process refuses new requests at once (others: route cache)
    await events.publish(session, DeploymentDeleted(vid))
    return FunctionEnvelope(function=FunctionOut.of(version))


@router.get(
    "/deployments",
    response_model=DeploymentList,
    response_model_exclude_none=True,
    summary="List the caller's deployments",
)
async def list_deployments(
    session: Session,
    principal: Deployer,
    limit: Limit = None,
    cursor: str | None = None,
) -> DeploymentList:
    page = make_page(limit, cursor)
    rows, next_cursor = await service.list_deployments(
        session, principal.account_id, page, only=principal.functions
    )
    return DeploymentList(
        deployments=await service.deployment_views(session, rows), next_cursor=next_cursor
    )


@router.get(
    _BY_VERSION + "/history",
    response_model=DeploymentList,
    response_model_exclude_none=True,
    summary="The removed deployments of a function version (kept for a retention period)",
    description="Deployments of the version that were undeployed and removed, oldest first, "
    "each with `removedAt`, `historyExpiresAt` and the instances that had failed; each stays "
    "readable, with its timeline at `GET /deployments/{deploymentId}/events`, for "
    "`NVCF_HISTORY_RETENTION_SECONDS` after its removal. The live deployment is not listed "
    f"(`GET {_BY_VERSION}`).",
)
async def list_version_history(
    functionId: str,
    functionVersionId: str,
    session: Session,
    principal: Deployer,
    limit: Limit = None,
    cursor: str | None = None,
) -> DeploymentList:
    fid, vid = _ids(functionId, functionVersionId)
    page = make_page(limit, cursor)
    views, next_cursor = await service.version_history(
        session, principal.account_id, fid, vid, page, utcnow()
    )
    return DeploymentList(deployments=views, next_cursor=next_cursor)


@router.get(
    "/deployments/{deploymentId}",
    response_model=DeploymentEnvelope,
    response_model_exclude_none=True,
    summary="Get a deployment (a removed one until its history expires)",
)
async def get_deployment(
    deploymentId: str, session: Session, principal: Deployer
) -> DeploymentEnvelope:
    did = parse_uuid(deploymentId, "deploymentId")
    found = await service.find_deployment(session, principal.account_id, did, utcnow())
    return DeploymentEnvelope(deployment=await service.view_of(session, found))


@router.get(
    "/deployments/{deploymentId}/events",
    response_model=EventList,
    response_model_exclude_none=True,
    summary="The time-ordered event timeline of a deployment (a removed one until its history "
    "expires)",
)
async def list_deployment_events(
    deploymentId: str,
    session: Session,
    principal: Deployer,
    limit: Limit = None,
    cursor: str | None = None,
) -> EventList:
    did = parse_uuid(deploymentId, "deploymentId")
    page = make_page(limit, cursor)
    await service.find_deployment(session, principal.account_id, did, utcnow())
    rows, next_cursor = await service.list_events(session, did, page)
    return EventList(events=[EventOut.of(e) for e in rows], next_cursor=next_cursor)


@router.patch(
    SPEC_PATH,
    response_model=GpuSpecificationEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_PATCH_DOC,
    summary="Change the scaling, the autoscaling policy or the configuration (a new revision) "
    "of one GPU specification",
)
async def patch_gpu_specification(
    deploymentId: str,
    gpuSpecificationId: str,
    request: Request,
    session: Session,
    principal: Deployer,
    deps: DeployingDep,
) -> GpuSpecificationEnvelope:
    body = await read_json(request)
    deployment, spec = await service.live_spec(session, principal, deploymentId, gpuSpecificationId)
    version = await service.lock_version(
        session, principal.account_id, deployment.function_id, deployment.version_id
    )
    stored = service.stored_spec(spec)
    change = validate_patch(body, stored, is_helm=version.helm_chart is not None)
    revision = revision_change(body)
    errors: list[FieldError] = []
    rendered: tuple[dict[str, Any] | None, dict[str, Any] | None, list[Any]] | None = None
    if revision is not None:
        configuration, policy, objects, errors = await rendering.revision_objects(
            deps.pipeline, deps.catalog, session, principal, version, spec, revision
        )
        rendered = (configuration, policy, objects)
    try:
        await _check_scaling(deps, session, principal, [stored], [change], None)
    except ValidationFailed as exc:
        errors = list(exc.errors or []) + errors
    if errors:
        raise ValidationFailed.of(errors, what="GPU specification update")
    changed = await service.apply_scaling(session, deployment, [change], version)
    if rendered is not None:
        configuration, policy, objects = rendered
        added = await revisions.new_revision(
            session,
            deployment,
            spec,
            configuration=configuration,
            helm_validation_policy=policy,
            objects=objects,
            by=revisions.principal_name(principal),
        )
        changed = changed or added is not None
    if changed:
        after_commit(session, deps.wake)
    return GpuSpecificationEnvelope(
        gpu_specification=await service.spec_view(session, deployment, spec)
    )

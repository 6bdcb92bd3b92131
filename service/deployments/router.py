"""HTTP routes of deployments (api.md §3); every route needs the `deploy_function` scope.

Each route parses the path and body, calls one use case of `service.py` (deploy, rescale,
patch a specification, delete) or one read (`repository.py`, `views.py`) and renders the
answer; the request's transaction is the `Session` dependency's.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request

from service.auth.deps import Session
from service.core.db import utcnow
from service.core.http import inline_body_doc, parse_uuid, parse_uuids, read_json
from service.core.pagination import Limit, make_page
from service.deployments import repository, service, views
from service.deployments.deps import DeployingDep
from service.deployments.router_common import SPEC_PATH, Deployer
from service.deployments.schemas import (
    DeploymentCreate,
    DeploymentEnvelope,
    DeploymentList,
    EventList,
    EventOut,
    GpuSpecificationEnvelope,
    GpuSpecificationPatch,
)
from service.functions.responses import FunctionEnvelope, FunctionOut

router = APIRouter(tags=["deployments"])


_BY_VERSION = "/deployments/functions/{functionId}/versions/{functionVersionId}"
_CREATE_DOC = inline_body_doc(DeploymentCreate)
_PATCH_DOC = inline_body_doc(GpuSpecificationPatch)


def _ids(function_id: str, version_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
    return fid, vid


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
    deployment = await service.deploy(session, deps, principal, fid, vid, body)
    return DeploymentEnvelope(deployment=await views.deployment_view(session, deployment))


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
    deployment = await repository.get_version_deployment(session, principal.account_id, fid, vid)
    return DeploymentEnvelope(deployment=await views.deployment_view(session, deployment))


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
    deployment = await service.rescale(session, deps, principal, fid, vid, body)
    return DeploymentEnvelope(deployment=await views.deployment_view(session, deployment))


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
    deps: DeployingDep,
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
    version = await service.delete(session, deps, principal, fid, vid, graceful=graceful)
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
    rows, next_cursor = await repository.list_deployments(
        session, principal.account_id, page, only=principal.functions
    )
    return DeploymentList(
        deployments=await views.deployment_views(session, rows), next_cursor=next_cursor
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
    removed, next_cursor = await views.version_history(
        session, principal.account_id, fid, vid, page, utcnow()
    )
    return DeploymentList(deployments=removed, next_cursor=next_cursor)


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
    found = await repository.find_deployment(session, principal.account_id, did, utcnow())
    return DeploymentEnvelope(deployment=await views.view_of(session, found))


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
    await repository.find_deployment(session, principal.account_id, did, utcnow())
    rows, next_cursor = await repository.list_events(session, did, page)
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
    deployment, spec = await service.patch_spec(
        session, deps, principal, deploymentId, gpuSpecificationId, body
    )
    return GpuSpecificationEnvelope(
        gpu_specification=await views.spec_view(session, deployment, spec)
    )

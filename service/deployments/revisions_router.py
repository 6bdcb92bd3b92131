"""HTTP routes of a GPU specification's revisions (docs/rollouts.md): the list, and a rollback
rolled out like any new revision. Every route needs the `deploy_function` scope."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth.deps import Session
from service.core.db import after_commit
from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.http import parse_uuids
from service.core.numbers import natural_in
from service.deployments import repository, revisions, views
from service.deployments.deps import WakeDep
from service.deployments.router_common import SPEC_PATH, Deployer
from service.deployments.schemas import GpuSpecificationEnvelope, RevisionList, RevisionOut

router = APIRouter(tags=["deployments"])


@router.get(
    SPEC_PATH + "/revisions",
    response_model=RevisionList,
    response_model_exclude_none=True,
    summary="List the revisions of one GPU specification (oldest first)",
)
async def list_revisions(
    deploymentId: str, gpuSpecificationId: str, session: Session, principal: Deployer
) -> RevisionList:
    did, sid = parse_uuids(
        (deploymentId, "deploymentId"), (gpuSpecificationId, "gpuSpecificationId")
    )
    deployment = await repository.get_deployment(session, principal.account_id, did)
    spec = next((s for s in deployment.specs if s.id == sid), None)
    if spec is None:
        raise NotFound(detail=f"GPU specification {sid} not found in deployment {did}")
    rows = await repository.revisions_of(session, spec)
    return RevisionList(revisions=[RevisionOut.of(r, spec) for r in rows])


@router.post(
    SPEC_PATH + "/revisions/{revision}/rollback",
    response_model=GpuSpecificationEnvelope,
    response_model_exclude_none=True,
    summary="Roll one GPU specification's instances back to an earlier revision",
    openapi_extra={
        "requestBody": {
            "required": False,
            "description": "none: the revision is in the path (an empty object is accepted)",
            "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
        }
    },
)
async def rollback_revision(
    deploymentId: str,
    gpuSpecificationId: str,
    revision: str,
    session: Session,
    principal: Deployer,
    wake: WakeDep,
) -> GpuSpecificationEnvelope:
    number = parse_revision(revision)
    deployment, spec = await repository.live_spec(
        session, principal, deploymentId, gpuSpecificationId
    )
    await repository.lock_version(
        session, principal.account_id, deployment.function_id, deployment.version_id
    )
    if await revisions.rollback(
        session, deployment, spec, number, revisions.principal_name(principal)
    ):
        after_commit(session, wake)
    return GpuSpecificationEnvelope(
        gpu_specification=await views.spec_view(session, deployment, spec)
    )


def parse_revision(raw: str) -> int:
    """A revision number from the path (an integer ≥ 1), else 400."""
    number = natural_in(raw, 1, 999_999_999)
    if number is None:
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        raise ValidationFailed.of(
            [FieldError("revision", f"must be a revision number (an integer ≥ 1), got {shown!r}")]
        )
    return number

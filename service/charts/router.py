"""`POST /helm/validate`: the chart pipeline as a dry-run (helm.md §6; the checks and the run
are dry_run.py's)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.charts.deps import ChartPipelineDep
from service.charts.dry_run import dry_run, parse_dry_run
from service.charts.schemas import HelmValidateRequest, HelmValidateResponse
from service.clusters.deps import CatalogDep
from service.core.http import inline_body_doc, read_json

router = APIRouter(tags=["helm"])

Registrar = Annotated[Principal, Depends(require(scopes.REGISTER_FUNCTION))]


@router.post(
    "/helm/validate",
    response_model=HelmValidateResponse,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(HelmValidateRequest),
    summary="Dry-run the helm chart pipeline (fetch, render, restrict) without storing anything",
)
async def validate_helm_chart(
    request: Request,
    session: Session,
    principal: Registrar,
    pipeline: ChartPipelineDep,
    catalog: CatalogDep,
) -> dict[str, Any]:
    dry = await parse_dry_run(await read_json(request), catalog, pipeline.default_kube_version)
    return await dry_run(session, principal.account_id, dry, pipeline, catalog)

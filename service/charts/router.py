"""`POST /helm/validate`: the chart pipeline as a dry-run (helm.md §6).

Bad requests (URL grammar, missing fields, policy shape, unknown cluster, malformed instance
type) are 400 listing every violation: the fields are declared and checked by the request model
(schemas.py), the catalog rules run after and add to the same list. Registry failures are
400/502 as at creation; a chart that breaks rules is a 200 with `valid: false`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.charts.pipeline import PLACEHOLDER_INSTANCE_ID
from service.charts.policy import ValidationPolicy
from service.charts.schemas import HelmValidateRequest, HelmValidateResponse
from service.clusters.catalog import Cluster
from service.clusters.instance_types import InstanceType, parse_instance_type
from service.core.errors import FieldError, ValidationFailed
from service.core.http import inline_body_doc, read_json
from service.core.kube import instance_namespace
from service.core.validation import failed, parse
from service.state import app_state

router = APIRouter(tags=["helm"])

Registrar = Annotated[Principal, Depends(require(scopes.REGISTER_FUNCTION))]


@dataclass
class DryRun:
    """A validated dry-run request."""

    helm_chart: str
    service_name: str
    inference_port: int
    configuration: dict[str, Any] | None
    policy: ValidationPolicy
    instance_type: InstanceType | None
    cluster: Cluster | None
    backend: str | None


def _catalog_errors(request: Request, body: dict[str, Any], bad: set[str]) -> list[FieldError]:
    """The cluster must be in the catalog and offer the instance type; `bad` are the fields
    that already broke a field rule (not checked again)."""
    name = body.get("cluster")
    if name is None or "cluster" in bad:
        return []
    catalog = app_state(request).catalog
    cluster = catalog.cluster(name)
    if cluster is None:
        known = ", ".join(c.name for c in catalog.clusters)
        return [FieldError("cluster", f"unknown cluster {name!r} (known: {known})")]
    raw_type = body.get("instanceType")
    if raw_type is None or "instanceType" in bad:
        return []
    instance_type = parse_instance_type(raw_type)
    if not cluster.offers(instance_type):
        return [
            FieldError(
                "instanceType", f"cluster {cluster.name!r} does not offer {instance_type.name}"
            )
        ]
    return []


async def parse_dry_run(request: Request, body: Any) -> DryRun:
    """Check every field (the request model), then the catalog; raise one 400 listing all
    violations."""
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    model, errors = parse(HelmValidateRequest, body)
    errors += _catalog_errors(request, body, failed(errors))
    if errors or model is None:
        raise ValidationFailed.of(errors)
    catalog = app_state(request).catalog
    cluster = catalog.cluster(model.cluster) if model.cluster is not None else None
    policy = model.helm_validation_policy
    return DryRun(
        helm_chart=model.helm_chart,
        service_name=model.helm_chart_service_name,
        inference_port=model.inference_port,
        configuration=model.configuration,
        policy=policy.policy() if policy is not None else ValidationPolicy(),
        instance_type=(
            parse_instance_type(model.instance_type) if model.instance_type is not None else None
        ),
        cluster=cluster,
        backend=catalog.group_of(cluster).name if cluster is not None else None,
    )


@router.post(
    "/helm/validate",
    response_model=HelmValidateResponse,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(HelmValidateRequest),
    summary="Dry-run the helm chart pipeline (fetch, render, restrict) without storing anything",
)
async def validate_helm_chart(
    request: Request, session: Session, principal: Registrar
) -> dict[str, Any]:
    dry = await parse_dry_run(request, await read_json(request))
    pipeline = app_state(request).chart_pipeline
    namespace = instance_namespace(PLACEHOLDER_INSTANCE_ID) if dry.cluster is not None else None
    result = await pipeline.validate(
        session,
        principal.account_id,
        helm_chart=dry.helm_chart,
        service_name=dry.service_name,
        inference_port=dry.inference_port,
        configuration=dry.configuration,
        policy=dry.policy,
        instance_type=dry.instance_type,
        cluster=dry.cluster,
        namespace=namespace,
    )
    if dry.cluster is not None and dry.backend is not None and result.valid:
        result.objects = pipeline.install_preview(
            result.objects,
            cluster=dry.cluster,
            backend=dry.backend,
            instance_type=dry.instance_type,
            account_id=principal.account_id,
        )
    return result.as_dict()

"""`POST /helm/validate`: the chart pipeline as a dry-run (helm.md §6).

Bad requests (URL grammar, missing fields, policy shape, unknown cluster, malformed instance
type) are 400 listing every violation; registry failures are 400/502 as at creation; a chart
that breaks rules is a 200 with `valid: false`.
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
from service.charts.url import ChartUrlError, parse_chart_url
from service.clusters.catalog import Cluster
from service.clusters.instance_types import InstanceType, InstanceTypeError, parse_instance_type
from service.core.errors import FieldError, ValidationFailed
from service.core.http import read_json
from service.core.kube import instance_namespace
from service.core.validation import DNS_1035_LABEL_RE
from service.state import app_state

router = APIRouter(tags=["helm"])

Registrar = Annotated[Principal, Depends(require(scopes.REGISTER_FUNCTION))]

_POLICY_NAMES = {"default": "Default", "unrestricted": "Unrestricted"}
_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": HelmValidateRequest.model_json_schema(by_alias=True)}
        },
    }
}


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


def _policy(raw: Any, errors: list[FieldError]) -> ValidationPolicy:
    field = "helmValidationPolicy"
    if raw is None:
        return ValidationPolicy()
    if not isinstance(raw, dict):
        errors.append(FieldError(field, "must be an object {name, extraKubernetesTypes}"))
        return ValidationPolicy()
    data = dict(raw)
    name = data.get("name", "Default")
    if not isinstance(name, str) or name.lower() not in _POLICY_NAMES:
        errors.append(FieldError(f"{field}.name", "must be 'Default' or 'Unrestricted'"))
        return ValidationPolicy()
    data["name"] = _POLICY_NAMES[name.lower()]
    extra = data.get("extraKubernetesTypes")
    if extra is not None and not isinstance(extra, list):
        errors.append(FieldError(f"{field}.extraKubernetesTypes", "must be a list"))
        return ValidationPolicy()
    bad = False
    for i, item in enumerate(extra or []):
        where = f"{field}.extraKubernetesTypes[{i}]"
        if not isinstance(item, dict):
            errors.append(FieldError(where, "must be an object {group, version, kind}"))
            bad = True
            continue
        for key in ("version", "kind"):
            if not isinstance(item.get(key), str) or not item[key]:
                errors.append(FieldError(f"{where}.{key}", "is required (a non-empty string)"))
                bad = True
        if item.get("group") is not None and not isinstance(item.get("group"), str):
            errors.append(FieldError(f"{where}.group", "must be a string"))
            bad = True
    if bad:
        return ValidationPolicy()
    try:
        return ValidationPolicy.from_dict(data)
    except ValueError as exc:
        errors.append(FieldError(field, str(exc)))
        return ValidationPolicy()


async def parse_dry_run(request: Request, body: Any) -> DryRun:
    """Check every field; raise one 400 listing all violations."""
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    errors: list[FieldError] = []

    chart = body.get("helmChart")
    if not isinstance(chart, str) or not chart:
        errors.append(FieldError("helmChart", "is required (a chart URL)"))
    else:
        try:
            parse_chart_url(chart)
        except ChartUrlError as exc:
            errors.extend(exc.field_errors())

    service_name = body.get("helmChartServiceName")
    if not isinstance(service_name, str) or not service_name:
        errors.append(FieldError("helmChartServiceName", "is required"))
    elif not DNS_1035_LABEL_RE.match(service_name):
        errors.append(
            FieldError(
                "helmChartServiceName",
                "must be a DNS-1035 label (^[a-z]([-a-z0-9]*[a-z0-9])?$, at most 63 characters)",
            )
        )

    port = body.get("inferencePort")
    if port is None:
        errors.append(FieldError("inferencePort", "is required"))
    elif not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        errors.append(FieldError("inferencePort", "must be an integer from 1 to 65535"))

    configuration = body.get("configuration")
    if configuration is not None and not isinstance(configuration, dict):
        errors.append(FieldError("configuration", "must be a JSON object of Helm values"))

    policy = _policy(body.get("helmValidationPolicy"), errors)

    instance_type: InstanceType | None = None
    raw_type = body.get("instanceType")
    if raw_type is not None:
        if not isinstance(raw_type, str):
            errors.append(FieldError("instanceType", "must be a string"))
        else:
            try:
                instance_type = parse_instance_type(raw_type)
            except InstanceTypeError as exc:
                errors.append(FieldError("instanceType", str(exc)))

    cluster: Cluster | None = None
    backend: str | None = None
    raw_cluster = body.get("cluster")
    if raw_cluster is not None:
        if not isinstance(raw_cluster, str) or not raw_cluster:
            errors.append(FieldError("cluster", "must be a cluster name"))
        else:
            catalog = app_state(request).catalog
            cluster = catalog.cluster(raw_cluster)
            if cluster is None:
                known = ", ".join(c.name for c in catalog.clusters)
                errors.append(
                    FieldError("cluster", f"unknown cluster {raw_cluster!r} (known: {known})")
                )
            else:
                backend = catalog.group_of(cluster).name
                if instance_type is not None and not cluster.offers(instance_type):
                    errors.append(
                        FieldError(
                            "instanceType",
                            f"cluster {cluster.name!r} does not offer {instance_type.name}",
                        )
                    )

    if errors:
        raise ValidationFailed.of(errors)
    assert isinstance(chart, str) and isinstance(service_name, str) and isinstance(port, int)
    return DryRun(
        helm_chart=chart,
        service_name=service_name,
        inference_port=port,
        configuration=configuration,
        policy=policy,
        instance_type=instance_type,
        cluster=cluster,
        backend=backend,
    )


@router.post(
    "/helm/validate",
    response_model=HelmValidateResponse,
    response_model_exclude_none=True,
    openapi_extra=_BODY_DOC,
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

"""Request and response shapes of the helm chart dry-run (helm.md §6), for OpenAPI and output."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from service.core.schemas import CamelModel


class HelmValidateRequest(CamelModel):
    """`POST /helm/validate` body; validated by hand so every violation is a 400."""

    helm_chart: str = Field(description="oci://… or https://… chart URL (api.md §2.2)")
    helm_chart_service_name: str
    inference_port: int = Field(ge=1, le=65535)
    configuration: dict[str, Any] | None = Field(
        default=None, description="Helm values coalesced over the chart's values.yaml"
    )
    helm_validation_policy: dict[str, Any] | None = Field(
        default=None,
        description='{"name": "Default"|"Unrestricted", '
        '"extraKubernetesTypes": [{"group", "version", "kind"}]}',
    )
    instance_type: str | None = None
    cluster: str | None = Field(
        default=None, description="catalog cluster: kube version, NVLink, install preview"
    )


class ChartFindingOut(CamelModel):
    rule: str
    severity: str
    object: str | None = None
    field: str | None = None
    message: str


class HelmValidateResponse(CamelModel):
    valid: bool
    chart_digest: str
    errors: list[ChartFindingOut]
    warnings: list[ChartFindingOut]
    info: list[ChartFindingOut]
    workload_config: dict[str, bool]
    objects: list[dict[str, Any]]
    hooks_skipped: list[str] = Field(default_factory=list)
    crds_skipped: list[str] = Field(default_factory=list)

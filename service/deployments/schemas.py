"""Response shapes of deployments (api.md §3.3) and documentation of their request bodies.

camelCase on the wire; nulls are omitted.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, Field

from service.core.schemas import CamelModel, Timestamp
from service.deployments.models import Deployment, DeploymentEvent, DeploymentSpec


class KubernetesTypeOut(CamelModel):
    group: str = ""
    version: str
    kind: str


class HelmValidationPolicyOut(CamelModel):
    name: str = Field(default="Default", examples=["Default", "Unrestricted"])
    extra_kubernetes_types: list[KubernetesTypeOut] = Field(default_factory=list)


class GpuSpecificationOut(CamelModel):
    gpu_specification_id: uuid.UUID
    gpu: str
    instance_type: str
    backend: str
    clusters: list[str] | None = None
    regions: list[str] | None = None
    attributes: list[str] | None = None
    availability_zones: list[str] | None = None
    min_instances: int
    max_instances: int
    max_request_concurrency: int
    preferred_order: int
    configuration: dict[str, Any] | None = None
    helm_validation_policy: HelmValidationPolicyOut | None = None

    @classmethod
    def of(cls, spec: DeploymentSpec) -> GpuSpecificationOut:
        return cls(
            gpu_specification_id=spec.id,
            gpu=spec.gpu,
            instance_type=spec.instance_type,
            backend=spec.backend,
            clusters=spec.clusters,
            regions=spec.regions,
            attributes=spec.attributes,
            availability_zones=spec.availability_zones,
            min_instances=spec.min_instances,
            max_instances=spec.max_instances,
            max_request_concurrency=spec.max_request_concurrency,
            preferred_order=spec.preferred_order,
            configuration=spec.configuration,
            helm_validation_policy=(
                HelmValidationPolicyOut.model_validate(spec.helm_validation_policy)
                if spec.helm_validation_policy is not None
                else None
            ),
        )


class InstanceOut(CamelModel):
    instance_id: uuid.UUID
    gpu_specification_id: uuid.UUID
    cluster: str | None = None
    phase: str
    reason: str | None = None
    message: str | None = None
    since: Timestamp


class HealthInfo(CamelModel):
    gpu: str
    instance_type: str
    backend: str
    error: str


class DeploymentOut(CamelModel):
    deployment_id: uuid.UUID
    function_id: uuid.UUID
    function_version_id: uuid.UUID
    function_name: str
    nca_id: str
    function_status: str
    deployment_specifications: list[GpuSpecificationOut]
    instances: list[InstanceOut] = Field(default_factory=list)
    health_info: list[HealthInfo] | None = None
    created_at: Timestamp
    last_updated_at: Timestamp

    @classmethod
    def of(
        cls,
        deployment: Deployment,
        *,
        function_status: str,
        instances: list[InstanceOut],
        health_info: list[HealthInfo],
    ) -> DeploymentOut:
        return cls(
            deployment_id=deployment.id,
            function_id=deployment.function_id,
            function_version_id=deployment.version_id,
            function_name=deployment.function_name,
            nca_id=deployment.account_id,
            function_status=function_status,
            deployment_specifications=[GpuSpecificationOut.of(s) for s in deployment.specs],
            instances=instances,
            health_info=health_info or None,
            created_at=deployment.created_at,
            last_updated_at=deployment.updated_at,
        )


class DeploymentEnvelope(CamelModel):
    deployment: DeploymentOut


class DeploymentList(CamelModel):
    deployments: list[DeploymentOut]
    next_cursor: str | None = None


class GpuSpecificationEnvelope(CamelModel):
    gpu_specification: GpuSpecificationOut


class EventOut(CamelModel):
    at: Timestamp
    kind: str
    instance_id: uuid.UUID | None = None
    phase: str | None = None
    reason: str | None = None
    message: str

    @classmethod
    def of(cls, event: DeploymentEvent) -> EventOut:
        return cls(
            at=event.at,
            kind=event.kind,
            instance_id=event.instance_id,
            phase=event.phase,
            reason=event.reason,
            message=event.message,
        )


class EventList(CamelModel):
    events: list[EventOut]
    next_cursor: str | None = None


# --- request bodies (documentation only: bodies are validated by validation.py) -------------


class KubernetesTypeIn(CamelModel):
    group: str = Field(default="", examples=["", "apps", "networking.k8s.io"])
    version: str = Field(examples=["v1"])
    kind: str = Field(examples=["Ingress"])


class HelmValidationPolicyIn(CamelModel):
    name: str = Field(default="Default", examples=["Default", "Unrestricted"])
    extra_kubernetes_types: list[KubernetesTypeIn] | None = None


class GpuSpecificationIn(CamelModel):
    gpu: str = Field(examples=["L40S"])
    instance_type: str | None = Field(default=None, examples=["DGXC.GPU.L40S_1x"])
    backend: str | None = Field(default=None, examples=["nvcf-default"])
    clusters: list[str] | None = None
    regions: list[str] | None = None
    attributes: list[str] | None = Field(default=None, examples=[["NVLinkOptimized"]])
    availability_zones: list[str] | None = None
    min_instances: int = Field(ge=0)
    max_instances: int = Field(ge=1)
    max_request_concurrency: int = Field(default=1, ge=1, le=16384)
    preferred_order: int = Field(default=1, ge=1, le=99)
    configuration: dict[str, Any] | None = None
    helm_validation_policy: HelmValidationPolicyIn | None = None
    gpu_specification_id: uuid.UUID | None = Field(
        default=None, description="PUT only: the specification to update"
    )


class DeploymentCreate(CamelModel):
    """Body of `POST` and `PUT /deployments/functions/{id}/versions/{versionId}`."""

    deployment_specifications: list[GpuSpecificationIn] = Field(min_length=1)


class GpuSpecificationPatch(CamelModel):
    """Body of `PATCH /deployments/{id}/gpu-specifications/{gpuSpecificationId}`."""

    min_instances: int | None = Field(default=None, ge=0)
    max_instances: int | None = Field(default=None, ge=1)


def inline_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI `requestBody` with `model`'s schema inlined (no component references)."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": resolve(schema)}},
        }
    }

"""Response shapes of the function registry (api.md §2.3); nulls are omitted on output."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from service.core.schemas import CamelModel, Timestamp
from service.functions.models import FunctionVersion


class KeyValue(CamelModel):
    key: str
    value: str


class Artifact(CamelModel):
    name: str
    version: str
    uri: str


class Health(CamelModel):
    protocol: str
    uri: str
    port: int
    timeout: str
    expected_status_code: int


class SecretName(CamelModel):
    name: str


class Finding(CamelModel):
    rule: str
    severity: str
    object: str | None = None
    field: str | None = None
    message: str


class ActiveInstance(CamelModel):
    instance_id: uuid.UUID
    phase: str
    instance_type: str
    gpu: str
    backend: str
    cluster: str | None = None
    created_at: Timestamp


class FunctionOut(CamelModel):
    id: uuid.UUID
    nca_id: str
    version_id: uuid.UUID
    name: str
    status: str
    inference_url: str
    inference_port: int | None = None
    container_image: str | None = None
    container_args: str | None = None
    container_environment: list[KeyValue] | None = None
    helm_chart: str | None = None
    helm_chart_service_name: str | None = None
    helm_chart_digest: str | None = None
    models: list[Artifact] | None = None
    resources: list[Artifact] | None = None
    api_body_format: str
    function_type: str
    health: Health
    health_uri: str | None = None
    description: str
    tags: list[str] = Field(default_factory=list)
    secrets: list[SecretName] | None = None
    rate_limit: dict[str, Any] | None = None
    findings: list[Finding] | None = None
    active_instances: list[ActiveInstance] | None = None
    created_at: Timestamp

    @classmethod
    def of(
        cls,
        v: FunctionVersion,
        *,
        details: bool = False,
        active_instances: Sequence[Any] | None = None,
    ) -> FunctionOut:
        """`active_instances` (rows with instance_id, phase, instance_type, gpu, backend,
        cluster, created_at) is shown only with `details`."""
        return cls(
            id=v.function_id,
            nca_id=v.account_id,
            version_id=v.id,
            name=v.name,
            status=v.status,
            inference_url=v.inference_url,
            inference_port=v.inference_port,
            container_image=v.container_image,
            container_args=v.container_args,
            container_environment=v.container_environment,
            helm_chart=v.helm_chart,
            helm_chart_service_name=v.helm_chart_service_name,
            helm_chart_digest=v.helm_chart_digest,
            models=v.models,
            resources=v.resources,
            api_body_format=v.api_body_format,
            function_type=v.function_type,
            health=v.health,
            health_uri=v.health_uri,
            description=v.description,
            tags=list(v.tags),
            secrets=[SecretName(name=str(n)) for n in v.secret_names] or None,
            rate_limit=v.rate_limit,
            findings=v.findings or None,
            active_instances=(
                [
                    ActiveInstance.model_validate(r, from_attributes=True)
                    for r in active_instances or ()
                ]
                if details
                else None
            ),
            created_at=v.created_at,
        )


class FunctionEnvelope(CamelModel):
    function: FunctionOut


class FunctionList(CamelModel):
    functions: list[FunctionOut]
    next_cursor: str | None = None


class FunctionIds(CamelModel):
    function_ids: list[uuid.UUID]


class SecretIn(CamelModel):
    name: str = Field(max_length=48, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
    value: str | dict[str, Any]


class RateLimit(CamelModel):
    rate_limit: str = Field(pattern=r"^[1-9]\d*-[SMHD](,\s*[1-9]\d*-[SMHD])*$", examples=["100-S"])
    exempted_nca_ids: list[str] | None = None
    sync_check: bool | None = None


class FunctionCreate(CamelModel):
    """Body of `POST /functions` and `POST /functions/{id}/versions` (documentation)."""

    name: str = Field(max_length=128, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9\-_]*$")
    inference_url: str
    inference_port: int | None = Field(default=None, ge=1, le=65535)
    container_image: str | None = None
    helm_chart: str | None = Field(
        default=None, examples=["oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz"]
    )
    helm_chart_service_name: str | None = Field(default=None, max_length=63)
    health: Health | None = None
    health_uri: str | None = None
    container_args: str | None = None
    container_environment: list[KeyValue] | None = None
    models: list[Artifact] | None = None
    resources: list[Artifact] | None = None
    api_body_format: str | None = Field(default=None, examples=["CUSTOM", "PREDICT_V2"])
    function_type: str | None = Field(default=None, examples=["DEFAULT", "STREAMING", "LLM"])
    description: str | None = Field(default=None, max_length=256)
    tags: list[str] | None = Field(default=None, max_length=64)
    secrets: list[SecretIn] | None = None
    rate_limit: RateLimit | None = None


class FunctionMetadataUpdate(CamelModel):
    """Body of `PUT /functions/{id}/versions/{versionId}` (documentation)."""

    tags: list[str] | None = None
    description: str | None = Field(default=None, max_length=256)
    rate_limit: RateLimit | None = None


DOC_MODELS: tuple[type[BaseModel], ...] = (FunctionCreate, FunctionMetadataUpdate)

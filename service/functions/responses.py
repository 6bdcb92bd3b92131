"""What the function registry answers (api.md §2.3): functions as a caller sees them and who
they are shared with; nulls are omitted on output."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from service.core.schemas import CamelModel, Timestamp
from service.functions.models import FunctionVersion
from service.health.machine import Phase


class KeyValue(CamelModel):
    key: str
    value: str


class Artifact(CamelModel):
    name: str
    version: str
    uri: str


class LlmConfig(CamelModel):
    """NVCF's `FunctionModelDto.LlmConfigDto`."""

    uris: list[str]
    token_rate_limit: str | None = None
    tokenizer: str | None = None
    routing_method: str | None = None


class FunctionModel(CamelModel):
    """NVCF's `FunctionModelDto`: `version` and `uri` are left out by LLM functions' models."""

    name: str
    version: str | None = None
    uri: str | None = None
    llm_config: LlmConfig | None = None


class Health(CamelModel):
    protocol: str
    uri: str
    port: int
    timeout: str
    expected_status_code: int


class Finding(CamelModel):
    rule: str
    severity: str
    object: str | None = None
    field: str | None = None
    message: str


#: an instance's phase (service.health) as NVCF's `InstanceStatusEnum` names it: NVCF lists
#: instances that are starting or running; a Degraded instance still runs (its worker is not
#: ready), and a Failed one is torn down (it only shows while that is under way)
INSTANCE_STATUS = {
    Phase.SCHEDULING: "STARTING",
    Phase.STARTING: "STARTING",
    Phase.RUNNING: "RUNNING",
    Phase.DEGRADED: "RUNNING",
    Phase.FAILED: "ERRORED",
}


class ActiveInstance(CamelModel):
    """NVCF's `InstanceDto`; the deployment's `instances[]` carries the phase, reason and
    message."""

    instance_id: str
    function_id: uuid.UUID
    function_version_id: uuid.UUID
    instance_type: str
    instance_status: str
    nca_id: str
    gpu: str
    backend: str
    #: the cluster it runs in (NVCF: zone or region)
    location: str | None = None
    instance_created_at: Timestamp
    instance_updated_at: Timestamp

    @classmethod
    def of(cls, version: FunctionVersion, row: Any) -> ActiveInstance:
        """`row`: instance_id, phase, instance_type, gpu, backend, cluster, created_at and
        updated_at of an instance of `version`."""
        return cls(
            instance_id=str(row.instance_id),
            function_id=version.function_id,
            function_version_id=version.id,
            instance_type=row.instance_type,
            instance_status=INSTANCE_STATUS.get(row.phase, "STARTING"),
            nca_id=version.account_id,
            gpu=row.gpu,
            backend=row.backend,
            location=row.cluster,
            instance_created_at=row.created_at,
            instance_updated_at=row.updated_at,
        )


#: what an account a function is shared with does not see of it (NVCF hides the same)
_OWNER_ONLY = (
    "inference_url",
    "inference_port",
    "container_image",
    "container_args",
    "container_environment",
    "helm_chart",
    "helm_chart_service_name",
    "helm_chart_digest",
    "models",
    "resources",
    "secrets",
    "rate_limit",
    "llm_invocation_config",
    "telemetries",
    "findings",
    "active_instances",
)


class FunctionOut(CamelModel):
    id: uuid.UUID
    nca_id: str
    version_id: uuid.UUID
    name: str
    status: str
    inference_url: str | None = None
    #: true when the caller reads another account's function shared with it
    owned_by_different_account: bool | None = None
    inference_port: int | None = None
    container_image: str | None = None
    container_args: str | None = None
    container_environment: list[KeyValue] | None = None
    helm_chart: str | None = None
    helm_chart_service_name: str | None = None
    helm_chart_digest: str | None = None
    models: list[FunctionModel] | None = None
    resources: list[Artifact] | None = None
    api_body_format: str
    function_type: str
    health: Health
    health_uri: str | None = None
    description: str
    tags: list[str] = Field(default_factory=list)
    #: secret names (never values), as NVCF's FunctionDto has them
    secrets: list[str] | None = None
    rate_limit: dict[str, Any] | None = None
    #: NVCF's `LlmInvocationConfigDto` (LLM functions), as given
    llm_invocation_config: dict[str, Any] | None = None
    #: NVCF's `TelemetriesDto`, as given
    telemetries: dict[str, Any] | None = None
    findings: list[Finding] | None = None
    active_instances: list[ActiveInstance] | None = None
    created_at: Timestamp

    @classmethod
    def of(
        cls,
        v: FunctionVersion,
        *,
        viewer: str | None = None,
        details: bool = False,
        active_instances: Sequence[Any] | None = None,
        include_secrets: bool = True,
    ) -> FunctionOut:
        """The version as `viewer` (an account; None: its owner) sees it. `active_instances`
        (rows for `ActiveInstance.of`) are shown only with `details`; another account sees
        neither them nor what runs the function (`_OWNER_ONLY`)."""
        out = cls(
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
            secrets=([str(n) for n in v.secret_names] or None) if include_secrets else None,
            rate_limit=v.rate_limit,
            llm_invocation_config=v.llm_invocation_config,
            telemetries=v.telemetries,
            findings=v.findings or None,
            active_instances=(
                [ActiveInstance.of(v, r) for r in active_instances or ()] if details else None
            ),
            created_at=v.created_at,
        )
        if viewer is None or viewer == v.account_id:
            return out
        hidden: dict[str, Any] = dict.fromkeys(_OWNER_ONLY)
        return out.model_copy(update={**hidden, "owned_by_different_account": True})


class FunctionEnvelope(CamelModel):
    function: FunctionOut


class FunctionList(CamelModel):
    functions: list[FunctionOut]
    next_cursor: str | None = None


class FunctionIds(CamelModel):
    function_ids: list[uuid.UUID]


class AuthorizedPartyOut(CamelModel):
    nca_id: str


class AuthorizedParties(CamelModel):
    """NVCF's `AuthorizedPartiesByFunctionDto`; `versionId` is absent for the whole function."""

    id: uuid.UUID
    nca_id: str
    version_id: uuid.UUID | None = None
    authorized_parties: list[AuthorizedPartyOut] | None = None

    @classmethod
    def of(
        cls,
        function_id: uuid.UUID,
        owner: str,
        version_id: uuid.UUID | None,
        accounts: Sequence[str] | None,
    ) -> AuthorizedParties:
        return cls(
            id=function_id,
            nca_id=owner,
            version_id=version_id,
            authorized_parties=(
                [AuthorizedPartyOut(nca_id=a) for a in accounts] if accounts is not None else None
            ),
        )


class AuthorizedPartiesEnvelope(CamelModel):
    function: AuthorizedParties


class AuthorizedPartiesList(CamelModel):
    functions: list[AuthorizedParties]

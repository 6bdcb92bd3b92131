"""Response shapes of deployments (api.md §3.3) and documentation of their request bodies.

camelCase on the wire; nulls are omitted.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import (
    ConfigDict,
    Field,
    SkipValidation,
)
from pydantic_core import PydanticCustomError

from service.charts.schemas import HelmValidationPolicyIn
from service.core.schemas import CamelModel, Timestamp
from service.core.validation import Check, RequestModel, Rule
from service.deployments.autoscale.policy import PLATFORM
from service.deployments.autoscale.schemas import (
    AutoscalingConfigurationIn,
    AutoscalingConfigurationOut,
    PolicyName,
)
from service.deployments.models import Deployment, DeploymentEvent, DeploymentSpec, SpecRevision


class KubernetesTypeOut(CamelModel):
    group: str = ""
    version: str
    kind: str


class HelmValidationPolicyOut(CamelModel):
    name: str = Field(default="Default", examples=["Default", "Unrestricted"])
    extra_kubernetes_types: list[KubernetesTypeOut] = Field(default_factory=list)


class RolloutOut(CamelModel):
    """The spec's last rollout to a revision (rolling update or rollback)."""

    state: str = Field(examples=["progressing", "completed", "failed"])
    target_revision: int = Field(description="The revision the instances roll to.")
    updated_instances: int | None = Field(
        default=None, description="Wanted instances already on the target revision."
    )
    desired_instances: int | None = Field(
        default=None, description="Instances the spec runs when settled."
    )
    reason: str | None = Field(default=None, description="Why the rollout failed.")
    at: Timestamp | None = Field(default=None, description="When the state last changed.")


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
    autoscaling_configuration_policy: str | None = Field(
        default=None, examples=["PLATFORM_CONFIGURATION", "CUSTOM_CONFIGURATION"]
    )
    autoscaling_configuration: AutoscalingConfigurationOut | None = Field(
        default=None, description="CUSTOM_CONFIGURATION only: the custom scaling policy."
    )
    target_instances: int | None = Field(
        default=None,
        description="How many instances the autoscaler wants now, within [minInstances, "
        "maxInstances] (docs/autoscaling.md).",
    )
    revision: int | None = Field(
        default=None, description="The revision every instance runs once settled."
    )
    target_revision: int | None = Field(
        default=None,
        description="The revision new instances get (differs from `revision` during a rollout).",
    )
    rollout: RolloutOut | None = None

    @classmethod
    def of(
        cls, spec: DeploymentSpec, updated: tuple[int, int] | None = None
    ) -> GpuSpecificationOut:
        """`updated`: (wanted instances on the target revision, desired) when known."""
        rollout = None
        if spec.rollout_state is not None:
            rollout = RolloutOut(
                state=spec.rollout_state,
                target_revision=spec.target_revision,
                updated_instances=updated[0] if updated else None,
                desired_instances=updated[1] if updated else None,
                reason=spec.rollout_reason,
                at=spec.rollout_at,
            )
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
            autoscaling_configuration_policy=spec.autoscaling_policy or PLATFORM,
            autoscaling_configuration=(
                AutoscalingConfigurationOut.model_validate(spec.autoscaling_configuration)
                if spec.autoscaling_configuration is not None
                else None
            ),
            target_instances=spec.desired_instances,
            revision=spec.revision,
            target_revision=spec.target_revision,
            rollout=rollout,
        )


class RevisionOut(CamelModel):
    revision: int
    configuration: dict[str, Any] | None = None
    helm_validation_policy: HelmValidationPolicyOut | None = None
    created_by: str | None = Field(
        default=None, description="Who accepted it: `api-key:<key id>` or `jwt:<subject>`."
    )
    created_at: Timestamp
    current: bool = Field(description="The revision every instance runs once settled.")
    target: bool = Field(description="The revision instances roll to.")

    @classmethod
    def of(cls, row: SpecRevision, spec: DeploymentSpec) -> RevisionOut:
        return cls(
            revision=row.number,
            configuration=row.configuration,
            helm_validation_policy=(
                HelmValidationPolicyOut.model_validate(row.helm_validation_policy)
                if row.helm_validation_policy is not None
                else None
            ),
            created_by=row.created_by,
            created_at=row.created_at,
            current=row.number == spec.revision,
            target=row.number == spec.target_revision,
        )


class RevisionList(CamelModel):
    revisions: list[RevisionOut]


class InstanceOut(CamelModel):
    instance_id: uuid.UUID
    gpu_specification_id: uuid.UUID
    revision: int | None = Field(default=None, description="The spec revision it runs.")
    cluster: str | None = None
    phase: str
    reason: str | None = None
    message: str | None = None
    since: Timestamp
    last_logs: list[str] | None = Field(
        default=None,
        description="The last lines its restarted containers printed before their latest "
        "restart (each `[pod/container previous] line`; secret values masked).",
    )


class HealthInfo(CamelModel):
    gpu: str
    instance_type: str
    backend: str
    error: str
    last_logs: list[str] | None = Field(
        default=None,
        description="The last lines its containers printed, kept when the instance failed "
        "(each `[pod/container] line`; secret values masked).",
    )


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
    failed_instances: list[InstanceOut] | None = Field(
        default=None,
        description="A removed deployment only: the instances that had failed, as they were "
        "when it was removed.",
    )
    removed_at: Timestamp | None = Field(
        default=None, description="A removed deployment only: when it was removed."
    )
    history_expires_at: Timestamp | None = Field(
        default=None,
        description="A removed deployment only: when its history (this object and its "
        "timeline) is purged.",
    )

    @classmethod
    def of(
        cls,
        deployment: Deployment,
        *,
        function_status: str,
        instances: list[InstanceOut],
        health_info: list[HealthInfo],
        updated: dict[uuid.UUID, tuple[int, int]] | None = None,
    ) -> DeploymentOut:
        return cls(
            deployment_id=deployment.id,
            function_id=deployment.function_id,
            function_version_id=deployment.version_id,
            function_name=deployment.function_name,
            nca_id=deployment.account_id,
            function_status=function_status,
            deployment_specifications=[
                GpuSpecificationOut.of(s, (updated or {}).get(s.id)) for s in deployment.specs
            ],
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


# --- request bodies: the single declaration of their fields, used to validate them --------

SPECS = "deploymentSpecifications"
MAX_REQUEST_CONCURRENCY = 16384
#: instances of one GPU specification at most (also bounded by what its clusters can hold)
MAX_INSTANCES = 1000
MAX_PREFERRED_ORDER = 99


@dataclass(frozen=True)
class Count(Rule):
    """An integer from `low` (to `high`); null is `default`, or a violation when `required`."""

    low: int
    high: int | None = None
    required: bool = False
    default: int | None = None

    def json_schema(self) -> Mapping[str, Any]:
        bounds: dict[str, Any] = {"minimum": self.low}
        if self.high is not None:
            bounds["maximum"] = self.high
        return bounds

    def _run(self, value: Any, *_: Any) -> Any:
        low, high = self.low, self.high
        rule = f"an integer ≥ {low}" if high is None else f"an integer from {low} to {high}"
        if value is None:
            if self.required:
                raise PydanticCustomError("rule", f"is required: {rule}")
            return self.default
        if not isinstance(value, int) or isinstance(value, bool):
            raise PydanticCustomError("rule", f"must be {rule}, got {value!r}")
        if value < low or (high is not None and value > high):
            raise PydanticCustomError("rule", f"must be {rule}, got {value}")
        return value


def _object_of_values(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be a JSON object of Helm values overrides"


def _specs_list(value: Any) -> str | None:
    if value is None:
        return "is required: a non-empty list of deployment specifications"
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of deployment specifications"
    return None


#: Checked against the cluster catalog (clusters.catalog.resolve), not by the model.
_CATALOG = "checked against the cluster catalog"


class GpuSpecificationIn(RequestModel):
    null_when_missing: ClassVar[tuple[str, ...]] = ("gpu", "minInstances", "maxInstances")

    gpu: SkipValidation[str] = Field(examples=["L40S"], description=_CATALOG)
    instance_type: SkipValidation[str | None] = Field(
        default=None, examples=["DGXC.GPU.L40S_1x"], description=_CATALOG
    )
    backend: SkipValidation[str | None] = Field(
        default=None, examples=["nvcf-default"], description=_CATALOG
    )
    clusters: SkipValidation[list[str] | None] = Field(default=None, description=_CATALOG)
    regions: SkipValidation[list[str] | None] = Field(default=None, description=_CATALOG)
    attributes: SkipValidation[list[str] | None] = Field(
        default=None, examples=[["NVLinkOptimized"]], description=_CATALOG
    )
    availability_zones: SkipValidation[list[str] | None] = Field(default=None, description=_CATALOG)
    min_instances: Annotated[int, Count(0, MAX_INSTANCES, required=True)]
    max_instances: Annotated[int, Count(1, MAX_INSTANCES, required=True)]
    max_request_concurrency: Annotated[int, Count(1, MAX_REQUEST_CONCURRENCY, default=1)] = 1
    preferred_order: Annotated[int, Count(1, MAX_PREFERRED_ORDER, default=1)] = 1
    configuration: Annotated[dict[str, Any], Check(_object_of_values, before=True)] | None = Field(
        default=None, description="helm functions only: Helm values overrides"
    )
    helm_validation_policy: HelmValidationPolicyIn | None = Field(
        default=None, description="helm functions only"
    )
    gpu_specification_id: SkipValidation[uuid.UUID | None] = Field(
        default=None, description="PUT only: the specification to update"
    )


class DeploymentCreate(RequestModel):
    """Body of `POST` and `PUT /deployments/functions/{id}/versions/{versionId}`."""

    null_when_missing: ClassVar[tuple[str, ...]] = (SPECS,)

    deployment_specifications: Annotated[
        list[GpuSpecificationIn], Check(_specs_list, {"minItems": 1}, before=True)
    ]


#: a field a PUT may repeat but not change (compared with the stored one in validation.py)
_FIXED = "may be repeated as stored, not changed"


class GpuSpecificationUpdate(RequestModel):
    """A specification of a PUT body: the scaling fields change, `gpuSpecificationId` names the
    stored specification, the others may only repeat what is stored."""

    min_instances: Annotated[int | None, Count(0, MAX_INSTANCES)] = None
    max_instances: Annotated[int | None, Count(1, MAX_INSTANCES)] = None
    max_request_concurrency: Annotated[int | None, Count(1, MAX_REQUEST_CONCURRENCY)] = None
    autoscaling_configuration: AutoscalingConfigurationIn | None = None
    autoscaling_configuration_policy: PolicyName = None
    gpu_specification_id: SkipValidation[Any] = Field(
        default=None, description="the stored specification (optional when there is one)"
    )
    gpu: SkipValidation[Any] = Field(default=None, description=_FIXED)
    instance_type: SkipValidation[Any] = Field(default=None, description=_FIXED)
    backend: SkipValidation[Any] = Field(default=None, description=_FIXED)
    clusters: SkipValidation[Any] = Field(default=None, description=_FIXED)
    regions: SkipValidation[Any] = Field(default=None, description=_FIXED)
    attributes: SkipValidation[Any] = Field(default=None, description=_FIXED)
    availability_zones: SkipValidation[Any] = Field(default=None, description=_FIXED)
    preferred_order: SkipValidation[Any] = Field(default=None, description=_FIXED)
    configuration: SkipValidation[Any] = Field(default=None, description=_FIXED)
    helm_validation_policy: SkipValidation[Any] = Field(default=None, description=_FIXED)


class DeploymentUpdate(RequestModel):
    null_when_missing: ClassVar[tuple[str, ...]] = (SPECS,)

    deployment_specifications: Annotated[
        list[GpuSpecificationUpdate], Check(_specs_list, before=True)
    ]


class GpuSpecificationPatch(RequestModel):
    """Body of `PATCH /deployments/{id}/gpu-specifications/{gpuSpecificationId}`."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    min_instances: Annotated[int | None, Count(0, MAX_INSTANCES)] = None
    max_instances: Annotated[int | None, Count(1, MAX_INSTANCES)] = None
    autoscaling_configuration: AutoscalingConfigurationIn | None = Field(
        default=None,
        description="NVCF's custom scaling policy (docs/autoscaling.md); implies "
        "CUSTOM_CONFIGURATION",
    )
    autoscaling_configuration_policy: PolicyName = Field(
        default=None,
        description="CUSTOM_CONFIGURATION (the given or stored autoscalingConfiguration) or "
        "PLATFORM_CONFIGURATION (the platform's policy; discards a custom one)",
    )
    # -- a new revision (helm functions): re-rendered and checked as at deploy, then rolled out
    configuration: Annotated[dict[str, Any], Check(_object_of_values, before=True)] | None = Field(
        default=None,
        description="helm functions only: the new Helm values overrides (replacing the current "
        "ones); the pinned chart is rendered and checked as at deploy, and the instances roll "
        "to the new revision one at a time",
    )
    helm_validation_policy: HelmValidationPolicyIn | None = Field(
        default=None, description="helm functions only: the new revision's policy"
    )

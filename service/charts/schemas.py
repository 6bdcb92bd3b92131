"""Request and response shapes of the helm chart dry-run (helm.md §6).

The request models declare the fields once: pydantic validates the bodies with them and the
OpenAPI document shows them. `HelmValidationPolicyIn` is also the deployments' (api.md §3.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, SkipValidation, ValidationError

from service.charts.policy import KubernetesType, ValidationPolicy
from service.charts.url import ChartUrlError, parse_chart_url
from service.core.http import json_kind
from service.core.schemas import CamelModel
from service.core.validation import (
    DNS_1035_LABEL,
    Check,
    Expect,
    RequestModel,
    Rules,
    field_errors,
    matches,
)

# --- request bodies: the single declaration of their fields, used to validate them --------

POLICY_NAMES = ("Default", "Unrestricted")


def _non_empty_string(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "is required: a non-empty string"


def _group(value: Any) -> str | None:
    # NVCF (helm-reval) refuses an extra type without a group: a core-group kind
    # (PersistentVolume, Namespace…) can never be allowed by a policy.
    if isinstance(value, str) and value:
        return None
    return (
        "is required: a non-empty API group such as apps or networking.k8s.io "
        "(core-group kinds, whose group is empty, cannot be allowed)"
    )


def _policy_name(value: Any) -> str | None:
    if value is None:
        return "is required: Default or Unrestricted"
    if isinstance(value, str) and value in POLICY_NAMES:
        return None
    got = f"'{value}'" if isinstance(value, str) else json_kind(value)
    return f"must be exactly Default or Unrestricted (the names are case-sensitive), got {got}"


_NonEmpty = Check(_non_empty_string, {"minLength": 1}, before=True)


class KubernetesTypeIn(RequestModel):
    """One of `extraKubernetesTypes`: group, version and kind are all required and non-empty,
    as NVCF requires; the group is matched exactly (there is no `core` alias)."""

    shape: ClassVar[str] = "{group, version, kind}"
    null_when_missing: ClassVar[tuple[str, ...]] = ("group", "version", "kind")

    group: Annotated[str, Check(_group, {"minLength": 1}, before=True)] = Field(
        examples=["apps", "networking.k8s.io", "leaderworkerset.x-k8s.io"]
    )
    version: Annotated[str, _NonEmpty] = Field(examples=["v1"])
    kind: Annotated[str, _NonEmpty] = Field(examples=["Ingress"])


class HelmValidationPolicyIn(RequestModel):
    """`helmValidationPolicy` of a deployment specification and of the dry-run: parsed once,
    into its stored form (`stored`) and the chart pipeline's `ValidationPolicy` (`policy`).

    As strict as NVCF: `name` is required and exactly `Default` or `Unrestricted`."""

    shape: ClassVar[str] = "{name: Default|Unrestricted, extraKubernetesTypes}"
    null_when_missing: ClassVar[tuple[str, ...]] = ("name",)

    name: Annotated[Literal["Default", "Unrestricted"], Check(_policy_name, before=True)]
    extra_kubernetes_types: (
        Annotated[
            list[KubernetesTypeIn], Expect((list,), "must be a list of {group, version, kind}")
        ]
        | None
    ) = None

    def stored(self) -> dict[str, Any]:
        """The policy as stored and shown: name as documented, every type with its group."""
        return {
            "name": self.name,
            "extraKubernetesTypes": [t.model_dump() for t in self.extra_kubernetes_types or ()],
        }

    def policy(self) -> ValidationPolicy:
        return ValidationPolicy(
            name=self.name,
            extra_kubernetes_types=tuple(
                KubernetesType(t.group, t.version, t.kind)
                for t in self.extra_kubernetes_types or ()
            ),
        )


def _chart_given(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "is required (a chart URL)"


def _chart_url(value: str) -> tuple[str, list[str]]:
    try:
        parse_chart_url(value)
    except ChartUrlError as exc:
        return value, exc.messages
    return value, []


def _service_name_given(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "is required"


def _port(value: Any) -> str | None:
    if value is None:
        return "is required"
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        return "must be an integer from 1 to 65535"
    return None


def _values(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be a JSON object of Helm values"


def _cluster_name(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a cluster name"


#: Checked against the cluster catalog as a deployment specification's (api.md §3.1).
_CATALOG = "target, checked against the cluster catalog as in a deployment specification"


class HelmValidateRequest(RequestModel):
    """`POST /helm/validate` body. The target fields are a deployment specification's
    (`gpu`, `instanceType`, `backend`, `clusters`, `regions`, `attributes`,
    `availabilityZones`) and are resolved against the catalog the same way after the fields'
    rules, adding to the same list of violations; `cluster` is the older one-cluster form of
    `clusters`."""

    null_when_missing: ClassVar[tuple[str, ...]] = (
        "helmChart",
        "helmChartServiceName",
        "inferencePort",
    )

    helm_chart: Annotated[
        str, Check(_chart_given, {"minLength": 1}, before=True), Rules(_chart_url)
    ] = Field(description="oci://… or https://… chart URL (api.md §2.2)")
    helm_chart_service_name: Annotated[
        str,
        Check(_service_name_given, before=True),
        matches(
            DNS_1035_LABEL,
            "must be a DNS-1035 label (^[a-z]([-a-z0-9]*[a-z0-9])?$, at most 63 characters)",
        ),
    ]
    inference_port: Annotated[int, Check(_port, {"minimum": 1, "maximum": 65535}, before=True)]
    configuration: Annotated[dict[str, Any], Check(_values, before=True)] | None = Field(
        default=None, description="Helm values coalesced over the chart's values.yaml"
    )
    helm_validation_policy: HelmValidationPolicyIn | None = Field(
        default=None, description="must be permitted by a target cluster (catalog)"
    )
    gpu: SkipValidation[str | None] = Field(
        default=None, examples=["L40S"], description=f"{_CATALOG}; taken from instanceType"
    )
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
    cluster: Annotated[str, Check(_cluster_name, {"minLength": 1}, before=True)] | None = Field(
        default=None, description="one catalog cluster (the older form of `clusters`)"
    )


class ChartFindingOut(CamelModel):
    rule: str
    severity: str
    object: str | None = None
    field: str | None = None
    message: str


class CheckNotApplied(CamelModel):
    check: str
    reason: str


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
    #: the catalog clusters the chart was checked for (absent without a target)
    target_clusters: list[str] | None = None
    #: the Kubernetes version it was rendered and schema-checked for (each target's)
    kube_versions: list[str] = Field(default_factory=list)
    #: the checks a deploy would apply that this dry-run could not, and why
    checks_not_applied: list[CheckNotApplied] = Field(default_factory=list)


def parse_policy(raw: Mapping[str, Any] | None) -> ValidationPolicy:
    """A policy from the API shape `{name, extraKubernetesTypes: [{group, version, kind}]}`,
    parsed by the API's own model (`None` is the default policy).

    Raises:
        ValueError: listing every violation (the API answers them as a 400).
    """
    if raw is None:
        return ValidationPolicy()
    try:
        return HelmValidationPolicyIn.model_validate(raw).policy()
    except ValidationError as exc:
        problems = field_errors(exc, "helmValidationPolicy")
        raise ValueError("; ".join(f"{e.field}: {e.message}" for e in problems)) from None

"""Request and response shapes of the helm chart dry-run (helm.md §6).

The request models declare the fields once: pydantic validates the bodies with them and the
OpenAPI document shows them. `HelmValidationPolicyIn` is also the deployments' (api.md §3.1).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from service.charts.policy import KubernetesType, ValidationPolicy
from service.charts.url import ChartUrlError, parse_chart_url
from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.core.http import json_kind
from service.core.schemas import CamelModel
from service.core.validation import (
    DNS_1035_LABEL,
    Check,
    Expect,
    RequestModel,
    Rules,
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


def _instance_type(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    try:
        parse_instance_type(value)
    except InstanceTypeError as exc:
        return str(exc)
    return None


def _cluster_name(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a cluster name"


class HelmValidateRequest(RequestModel):
    """`POST /helm/validate` body. The catalog rules (the cluster exists and offers the
    instance type) run after the fields' and add to the same list of violations."""

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
    helm_validation_policy: HelmValidationPolicyIn | None = None
    instance_type: Annotated[str, Check(_instance_type, before=True)] | None = Field(
        default=None, examples=["DGXC.GPU.L40S_1x"]
    )
    cluster: Annotated[str, Check(_cluster_name, {"minLength": 1}, before=True)] | None = Field(
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

"""The cluster catalog's file schema (operations.md §3): pydantic models of cluster groups,
clusters, node shapes and adapter settings, with the field-level checks."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from service.backends.simulated.model import SimulationDelays
from service.clusters.instance_types import (
    CSPS,
    InstanceType,
    normalize_csp,
    normalize_gpu,
    offered_instance_types,
    shape_offers,
)
from service.core.kube import normalize_attributes
from service.core.quantities import quantity

_DELAYS = SimulationDelays()  # the simulated adapter owns its defaults

# Fixed namespaces so ids survive restarts and re-deploys of the same catalog.
_GROUP_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:nvcf-server:cluster-group")
_CLUSTER_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:nvcf-server:cluster")

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise PydanticCustomError(
            "name",
            "{value} is not a valid name: use 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
            {"value": repr(value)},
        )
    return value


def _check_provider(value: Any) -> Any:
    if isinstance(value, str):
        csp = normalize_csp(value)
        if csp is None:
            raise PydanticCustomError(
                "provider",
                "unknown provider {value} (allowed: {allowed})",
                {"value": repr(value), "allowed": ", ".join(CSPS)},
            )
        return csp
    return value


def _check_gpu(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise PydanticCustomError(
            "gpu",
            "GPU name {value} may contain only letters, digits and '_'",
            {"value": repr(value)},
        )
    return normalize_gpu(value)


def _quantity(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    parsed = quantity(value) if isinstance(value, str) else None
    if isinstance(value, str) and (parsed is None or parsed < 0):  # a node has no negative CPU
        raise PydanticCustomError(
            "quantity",
            "{value} is not a Kubernetes quantity such as 64, 500m or 512Gi",
            {"value": repr(value)},
        )
    return value


def lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


Name = Annotated[str, AfterValidator(_check_name)]
NonEmpty = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
Seconds = Annotated[float, Field(ge=0)]
Quantity = Annotated[str, BeforeValidator(_quantity)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class NodeShape(_Model):
    """`count` identical nodes with `gpus_per_node` GPUs of model `gpu` each."""

    gpu: Annotated[str, AfterValidator(_check_gpu)]
    gpus_per_node: PositiveInt = Field(alias="gpusPerNode")
    count: PositiveInt
    cpu: Quantity | None = None
    memory: Quantity | None = None


#: an upstream's schemes: `grpc`/`grpcs` name a gRPC server (reached over h2c/TLS), which
#: is `http`/`https` to every endpoint
UPSTREAM_SCHEMES = ("http", "https", "grpc", "grpcs")


def _check_upstream(value: str) -> str:
    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in UPSTREAM_SCHEMES or not parts.hostname or not port_ok:
        raise PydanticCustomError(
            "upstream",
            "{value} is not an upstream server address such as http://127.0.0.1:9000 (or "
            "grpc://127.0.0.1:9000 for a gRPC server)",
            {"value": repr(value)},
        )
    if parts.query or parts.fragment:
        raise PydanticCustomError(
            "upstream", "{value}: an upstream address has no query or fragment", {"value": value}
        )
    return value.rstrip("/")


class SimulationSettings(_Model):
    """Delays of the simulated adapter's pod lifecycle, in seconds, and an optional real
    server that answers for every instance instead of the built-in simulated worker."""

    schedule_seconds: Seconds = Field(default=_DELAYS.schedule_seconds, alias="scheduleSeconds")
    pull_seconds: Seconds = Field(default=_DELAYS.pull_seconds, alias="pullSeconds")
    ready_seconds: Seconds = Field(default=_DELAYS.ready_seconds, alias="readySeconds")
    upstream: Annotated[str, AfterValidator(_check_upstream)] | None = None
    #: the upstream is an `nvcf-server worker-utils` sidecar in front of the worker: requests
    #: get their files as a Kubernetes pod's worker does (docs/assets.md)
    worker_utils: bool = Field(default=False, alias="workerUtils")


class KubernetesSettings(_Model):
    """How to reach a real cluster: a kubeconfig file (and context), or in-cluster config;
    and how invocations reach an instance's worker: `serviceDns` (the Service's cluster DNS
    name, for a control plane running in the cluster) or `apiServerProxy` (the API server's
    service proxy); by default the first with `inCluster`, else the second."""

    kubeconfig: NonEmpty | None = None
    context: NonEmpty | None = None
    in_cluster: bool = Field(default=False, alias="inCluster")
    worker_access: Literal["serviceDns", "apiServerProxy"] | None = Field(
        default=None, alias="workerAccess"
    )
    cluster_domain: NonEmpty = Field(default="cluster.local", alias="clusterDomain")


_KUBE_VERSION = re.compile(r"v?\d+\.\d+(\.\d+)?([-+][0-9A-Za-z.+-]*)?")
_API_VERSION = re.compile(
    r"(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+[a-z0-9]*(/[A-Za-z][A-Za-z0-9]*)?"
)


def _check_kube_version(value: str) -> str:
    if not _KUBE_VERSION.fullmatch(value):
        raise PydanticCustomError(
            "k8s_version",
            '{value} is not a Kubernetes version such as "1.30.0"',
            {"value": repr(value)},
        )
    return value


def _check_api_version(value: str) -> str:
    if not _API_VERSION.fullmatch(value):
        raise PydanticCustomError(
            "api_version",
            "{value} is not an API version as `kubectl api-versions` lists them "
            "(v1, apps/v1, monitoring.coreos.com/v1) or one with its kind (apps/v1/Deployment)",
            {"value": repr(value)},
        )
    return value


PolicyName = Literal["Default", "Unrestricted"]


class ExtraType(_Model):
    """A kind (group/version/kind) a cluster lets `helmValidationPolicy.extraKubernetesTypes`
    add; group "" (or "core") is the core group."""

    group: str = ""
    version: NonEmpty
    kind: NonEmpty

    @property
    def key(self) -> tuple[str, str, str]:
        return ("" if self.group in ("", "core") else self.group, self.version, self.kind)


class HelmValidation(_Model):
    """Which `helmValidationPolicy` requests a cluster (or every cluster of a group) accepts:
    the policy names and the extra types. Fields a cluster leaves out come from its group,
    then from these defaults: `Default` only, no extra types."""

    allowed_policies: list[PolicyName] = Field(
        default_factory=lambda: list[PolicyName](["Default"]), alias="allowedPolicies", min_length=1
    )
    allowed_extra_types: list[ExtraType] = Field(default_factory=list, alias="allowedExtraTypes")


class Cluster(_Model):
    name: Name
    adapter: Annotated[Literal["simulated", "kubernetes"], BeforeValidator(lower)]
    provider: Annotated[str, BeforeValidator(_check_provider)]
    region: NonEmpty
    k8s_version: Annotated[str, AfterValidator(_check_kube_version)] | None = Field(
        default=None, alias="k8sVersion"
    )
    # Compared case-insensitively everywhere; known ones stored in their canonical spelling.
    attributes: Annotated[list[NonEmpty], AfterValidator(normalize_attributes)] = Field(
        default_factory=list
    )
    availability_zones: list[NonEmpty] = Field(default_factory=list, alias="availabilityZones")
    nodes: list[NodeShape] = Field(min_length=1)
    simulation: SimulationSettings = Field(default_factory=SimulationSettings)
    kubernetes: KubernetesSettings | None = None
    #: the API versions the cluster serves (`kubectl api-versions`, kinds optional): what
    #: Helm's `.Capabilities.APIVersions` holds; unset: the standard set of `k8sVersion`
    api_versions: list[Annotated[str, AfterValidator(_check_api_version)]] | None = Field(
        default=None, alias="apiVersions"
    )
    helm_validation: HelmValidation | None = Field(default=None, alias="helmValidation")

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(_CLUSTER_NAMESPACE, self.name.lower())

    @property
    def carries_grpc(self) -> bool:
        """Its workers can take gRPC calls: simulated ones, and Kubernetes ones reached by
        cluster DNS — not through the API server's service proxy (no HTTP/2 trailers), the
        default outside the cluster (as backends/kubernetes.py decides)."""
        settings = self.kubernetes
        if self.adapter != "kubernetes" or settings is None:
            return True
        access = settings.worker_access or (
            "serviceDns" if settings.in_cluster else "apiServerProxy"
        )
        return access == "serviceDns"

    def offered_instance_types(self) -> list[InstanceType]:
        """Every type the cluster's node shapes offer, in node-shape order, without repeats."""
        seen: dict[str, InstanceType] = {}
        for shape in self.nodes:
            for it in offered_instance_types(
                self.provider, shape.gpu, shape.gpus_per_node, shape.count
            ):
                seen.setdefault(it.name, it)
        return list(seen.values())

    def offers(self, instance_type: InstanceType) -> bool:
        return any(
            shape_offers(self.provider, s.gpu, s.gpus_per_node, s.count, instance_type)
            for s in self.nodes
        )

    def capacity(self, instance_type: InstanceType) -> int:
        """How many instances of the type fit on the empty cluster (0 if not offered).

        `_kx` takes k GPUs of one node; `_Gx.x<k>` takes k whole nodes.
        """
        if not self.offers(instance_type):
            return 0
        shapes = [s for s in self.nodes if s.gpu == instance_type.gpu]
        if instance_type.is_multi_node:
            nodes = sum(s.count for s in shapes if s.gpus_per_node == instance_type.gpus_per_node)
            return nodes // instance_type.nodes
        return sum(
            s.count * (s.gpus_per_node // instance_type.gpus_per_node)
            for s in shapes
            if s.gpus_per_node >= instance_type.gpus_per_node
        )


class ClusterGroup(_Model):
    """A "backend": a named set of clusters a deployment specification can target."""

    name: Name
    clusters: list[Cluster] = Field(min_length=1)
    #: inherited by the clusters of the group (field by field) unless they set their own
    helm_validation: HelmValidation | None = Field(default=None, alias="helmValidation")

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(_GROUP_NAMESPACE, self.name.lower())


class CatalogFile(_Model):
    cluster_groups: list[ClusterGroup] = Field(alias="clusterGroups", min_length=1)

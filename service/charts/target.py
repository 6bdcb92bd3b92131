"""What a chart is rendered and checked for: the target cluster's capabilities.

Helm renders with `.Capabilities.KubeVersion` and `.Capabilities.APIVersions`; the schema
check (kube_schema) validates against the same Kubernetes version. For a catalog cluster those
are its `k8sVersion` and its `apiVersions` (or, when it lists none, the standard set of its
version); without a target (function creation, a dry-run naming none) the configured default
version (`NVCF_DEFAULT_KUBE_VERSION`) and its standard set.

Helm's `--api-versions` adds to the set compiled into Helm (every group/version of the Go
client it was built with), it cannot take any away: a version the client knows but the
cluster does not serve still answers `Has` true, with `helm template` and in NVCF alike. The
schema check closes that gap where it matters: an object of a built-in group/version the
target does not serve is an `api-version-unsupported` error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.charts.findings import (
    Finding,
    KubeObject,
    metadata,
    object_name,
    object_ref,
    pod_templates,
)
from service.charts.kube_schema import standard_api_versions
from service.charts.mutate import NVLINK_INDEX_ANNOTATION
from service.charts.policy import ValidationPolicy
from service.charts.schemas import parse_policy
from service.clusters.catalog.lookups import type_label
from service.core.kube import is_nvlink

if TYPE_CHECKING:
    from service.clusters.catalog import Catalog, Cluster


@dataclass(frozen=True)
class ChartTarget:
    """The capabilities a render and its checks are for."""

    kube_version: str
    #: `.Capabilities.APIVersions` additions: the cluster's declared list or the standard one
    api_versions: tuple[str, ...]
    #: the catalog's `apiVersions` of the cluster (they count as served), empty when none
    declared_api_versions: tuple[str, ...] = ()
    nvlink: bool = False
    #: the catalog cluster's name, None without a target
    cluster: str | None = None

    @classmethod
    def of(cls, cluster: Cluster | None, default_kube_version: str) -> ChartTarget:
        """The target of a catalog cluster, or the default target without one."""
        if cluster is None:
            return cls(default_kube_version, standard_api_versions(default_kube_version))
        kube = cluster.k8s_version or default_kube_version
        declared = tuple(cluster.api_versions or ())
        return cls(
            kube_version=kube,
            api_versions=declared or standard_api_versions(kube),
            declared_api_versions=declared,
            nvlink=is_nvlink(cluster.attributes),
            cluster=cluster.name,
        )

    @property
    def key(self) -> tuple[object, ...]:
        """The capabilities: clusters with equal keys render and check alike (but for the
        cluster named in a finding)."""
        return (self.kube_version, self.api_versions, self.declared_api_versions, self.nvlink)


# --- which clusters permit a helmValidationPolicy (helm.md §3: the operator's decision) ----


def policy_keys(policy: ValidationPolicy) -> list[tuple[str, str, str]]:
    return [t.key for t in policy.extra_kubernetes_types]


def stored_policy(raw: Mapping[str, Any] | None) -> ValidationPolicy:
    """A stored `helmValidationPolicy` (as deployments keep it) as the pipeline's policy."""
    try:
        return parse_policy(raw)
    except ValueError:
        return ValidationPolicy()


def describe_policy(policy: ValidationPolicy) -> str:
    keys = policy_keys(policy)
    return policy.name + (
        f" with extra types {', '.join(type_label(k) for k in keys)}" if keys else ""
    )


def permitted_clusters(
    catalog: Catalog, clusters: Sequence[Cluster], policy: ValidationPolicy
) -> list[Cluster]:
    """The clusters among `clusters` whose catalog entry permits `policy`."""
    return catalog.permitting(clusters, policy.name, policy_keys(policy))


def not_permitted_message(
    catalog: Catalog, clusters: Sequence[Cluster], policy: ValidationPolicy
) -> str:
    """Why no cluster of `clusters` accepts `policy`, naming each and what it permits."""
    each = "; ".join(f"{c.name}: {catalog.permission(c).describe()}" for c in clusters)
    return (
        f"asks for {describe_policy(policy)}, which none of the candidate clusters permits "
        f"({each}); the cluster operator decides which policies a cluster accepts "
        "(catalog field helmValidation)"
    )


# --- the NVLink annotation (helm.md §5) ------------------------------------------------------


def nvlink_annotation_findings(objects: Sequence[KubeObject], target: ChartTarget) -> list[Finding]:
    """Warnings where `dra.nvcf.nvidia.io/required-nvlink-domain-index` will not do what it
    seems to: set on a controller's own metadata (only a Pod's or a pod template's counts),
    or used for a cluster without the `NVLinkOptimized` attribute (no ComputeDomain, no
    NVLink affinity at all). Without a target cluster the second is not known (the dry-run
    lists it as not applied)."""
    out: list[Finding] = []
    for obj in objects:
        templates = list(pod_templates(obj))
        own = NVLINK_INDEX_ANNOTATION in _annotations(obj)
        on_template = [
            path
            for path, template in templates
            if NVLINK_INDEX_ANNOTATION in _annotations(template)
        ]
        ref = object_ref(obj)
        short = f"{obj.get('kind') or '?'}/{object_name(obj) or '?'}"
        if own and obj.get("kind") != "Pod" and templates and not on_template:
            path = templates[0][0]
            out.append(
                Finding(
                    "nvlink-annotation-ignored",
                    "warning",
                    ref,
                    f"metadata.annotations.{NVLINK_INDEX_ANNOTATION}",
                    f"{short} carries {NVLINK_INDEX_ANNOTATION} on its own metadata, where it "
                    f"has no effect: only the pod template's ({path}.metadata.annotations) "
                    "counts. Its pods get the NVLink partition label and a preferred (not a "
                    "required) pod affinity to their partition on NVLinkOptimized clusters",
                )
            )
        if (own or on_template) and target.cluster is not None and not target.nvlink:
            out.append(
                Finding(
                    "nvlink-annotation-unused",
                    "warning",
                    ref,
                    (
                        f"{on_template[0]}.metadata.annotations.{NVLINK_INDEX_ANNOTATION}"
                        if on_template
                        else f"metadata.annotations.{NVLINK_INDEX_ANNOTATION}"
                    ),
                    f"{short} asks for an NVLink domain ({NVLINK_INDEX_ANNOTATION}), but cluster "
                    f"{target.cluster} does not have the NVLinkOptimized attribute: no "
                    "ComputeDomain is created, no NVLink affinity or resource claim is added, "
                    "and the annotation has no effect there",
                )
            )
    return out


def _annotations(obj: KubeObject) -> dict[str, Any]:
    annotations = metadata(obj).get("annotations")
    return annotations if isinstance(annotations, dict) else {}

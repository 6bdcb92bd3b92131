"""Cluster catalog, instance types and the cluster-groups view (runtime.md §1-2)."""

from service.clusters.catalog import (
    Catalog,
    CatalogError,
    Cluster,
    ClusterGroup,
    NodeShape,
    Offering,
    ResolvedTarget,
    TargetRequest,
    check_catalog,
    load_catalog,
    resolve,
    resolve_spec,
)
from service.clusters.instance_types import (
    InstanceType,
    InstanceTypeError,
    offered_instance_types,
    parse_instance_type,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "Cluster",
    "ClusterGroup",
    "InstanceType",
    "InstanceTypeError",
    "NodeShape",
    "Offering",
    "ResolvedTarget",
    "TargetRequest",
    "check_catalog",
    "load_catalog",
    "offered_instance_types",
    "parse_instance_type",
    "resolve",
    "resolve_spec",
]

"""The cluster catalog: file schema (operations.md §3), loading with line-accurate errors,
offered instance types per group and GPU (runtime.md §2), and the deployment-spec resolver
(api.md §3.1).

Modules: `schema` (the pydantic models), `problems` (field and cross-field problems, described),
`loader` (YAML with line numbers, `load_catalog`, `check_catalog`), `lookups` (`Catalog`,
`Offering`), `resolution` (`TargetRequest`, `resolve`).
"""

from service.clusters.catalog.loader import BUILTIN_SOURCE, check_catalog, load_catalog
from service.clusters.catalog.lookups import Catalog, Offering, PolicyPermission
from service.clusters.catalog.problems import CatalogError
from service.clusters.catalog.resolution import (
    ResolvedTarget,
    TargetRequest,
    resolve,
    resolve_spec,
)
from service.clusters.catalog.schema import (
    CatalogFile,
    Cluster,
    ClusterGroup,
    ExtraType,
    HelmValidation,
    KubernetesSettings,
    NodeShape,
    SimulationSettings,
)

__all__ = [
    "BUILTIN_SOURCE",
    "Catalog",
    "CatalogError",
    "CatalogFile",
    "Cluster",
    "ClusterGroup",
    "ExtraType",
    "HelmValidation",
    "KubernetesSettings",
    "NodeShape",
    "Offering",
    "PolicyPermission",
    "ResolvedTarget",
    "SimulationSettings",
    "TargetRequest",
    "check_catalog",
    "load_catalog",
    "resolve",
    "resolve_spec",
]

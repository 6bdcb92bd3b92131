"""HTTP routes of the cluster catalog (api.md §4).

`router` is served under every API prefix; `v3_router` carries the `ngcsdk` alias
`/v3/orgs/{org}/ngc/nvcf/deployments/available/instanceTypes` and is included at the root.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from service.auth import scopes
from service.auth.deps import require
from service.auth.service import Principal
from service.clusters.deps import CatalogDep
from service.clusters.groups import SupportedGpu, cluster_groups_view, supported_gpus

router = APIRouter(tags=["clusters"])
v3_router = APIRouter(tags=["clusters"])

Viewer = Annotated[Principal, Depends(require(scopes.LIST_CLUSTER_GROUPS, scopes.DEPLOY_FUNCTION))]
Registrar = Annotated[Principal, Depends(require(scopes.REGISTER_FUNCTION))]


@router.get("/clusterGroups", summary="Cluster groups, their GPUs, instance types and clusters")
async def list_cluster_groups(principal: Viewer, catalog: CatalogDep) -> dict[str, Any]:
    return cluster_groups_view(catalog, principal.account_id)


@router.get(
    "/supportedGpus",
    deprecated=True,
    summary="GPUs and the backends (cluster groups) offering them; use clusterGroups",
)
async def list_supported_gpus(principal: Registrar, catalog: CatalogDep) -> list[SupportedGpu]:
    # NVCF's shape: a bare list of {gpu, backend}; its scope is register_function.
    return supported_gpus(catalog)


@v3_router.get(
    "/v3/orgs/{org}/ngc/nvcf/deployments/available/instanceTypes",
    summary="Cluster groups and instance types (ngcsdk alias of GET /v2/nvcf/clusterGroups)",
)
async def list_available_instance_types(
    org: str, principal: Viewer, catalog: CatalogDep
) -> dict[str, Any]:
    # The dependency already refused an `org` other than the caller's account (403).
    return cluster_groups_view(catalog, principal.account_id)

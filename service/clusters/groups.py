"""The `GET /v2/nvcf/clusterGroups` body (api.md §4), generated from the cluster catalog.

Every group of a self-hosted catalog is shared by all accounts, hence `authorizedNcaIds: ["*"]`
and `ncaId` set to the caller's own account.
"""

from __future__ import annotations

from typing import Any

from service.clusters.catalog import Catalog, Cluster, ClusterGroup
from service.core.schemas import CamelModel

ALL_ACCOUNTS = "*"


def cluster_groups_view(catalog: Catalog, account_id: str) -> dict[str, Any]:
    """`{"clusterGroups": [...]}` as the caller `account_id` sees it (JSON-ready dicts)."""
    return {"clusterGroups": [_group(catalog, g, account_id) for g in catalog.groups]}


class SupportedGpu(CamelModel):
    gpu: str
    backend: str


def supported_gpus(catalog: Catalog) -> list[SupportedGpu]:
    """NVCF's `GET /supportedGpus` (deprecated there for cluster groups): every GPU a group
    offers, with the group as its backend."""
    return [
        SupportedGpu(gpu=gpu, backend=group.name)
        for group in catalog.groups
        for gpu in catalog.gpus(group.name)
    ]


def _group(catalog: Catalog, group: ClusterGroup, account_id: str) -> dict[str, Any]:
    return {
        "id": str(group.id),
        "name": group.name,
        "ncaId": account_id,
        "authorizedNcaIds": [ALL_ACCOUNTS],
        "gpus": [
            {
                "name": gpu,
                "instanceTypes": [
                    {
                        "name": o.instance_type.name,
                        "description": o.instance_type.description,
                        "default": o.default,
                    }
                    for o in catalog.offerings(group.name, gpu)
                ],
            }
            for gpu in catalog.gpus(group.name)
        ],
        "clusters": [_cluster(c) for c in group.clusters],
    }


def _cluster(cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(cluster.id),
        "name": cluster.name,
        "region": cluster.region,
        "attributes": list(cluster.attributes),
    }
    # Responses omit null fields (api.md §0).
    if cluster.k8s_version is not None:
        out["k8sVersion"] = cluster.k8s_version
    return out

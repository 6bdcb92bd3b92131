"""The `GET /v2/nvcf/clusterGroups` view of the catalog."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from service.clusters.catalog import load_catalog
from service.clusters.groups import cluster_groups_view

DATA = Path(__file__).parent / "data"


def test_builtin_catalog_view() -> None:
    catalog = load_catalog(None)
    view = cluster_groups_view(catalog, "acct-1")
    json.dumps(view)  # JSON-ready as is
    [group] = view["clusterGroups"]
    assert uuid.UUID(group["id"]) == catalog.groups[0].id
    assert (group["name"], group["ncaId"], group["authorizedNcaIds"]) == (
        "nvcf-default",
        "acct-1",
        ["*"],
    )
    gpus = {g["name"]: g["instanceTypes"] for g in group["gpus"]}
    assert list(gpus) == ["H100", "L40S", "L40", "B200"]
    assert gpus["B200"] == [
        {"name": "ON-PREM.GPU.B200_1x", "description": "1x B200 GPU", "default": True},
        {"name": "ON-PREM.GPU.B200_2x", "description": "2x B200 GPUs", "default": False},
        {"name": "ON-PREM.GPU.B200_4x", "description": "4x B200 GPUs", "default": False},
        {"name": "ON-PREM.GPU.B200_8x", "description": "8x B200 GPUs", "default": False},
        {
            "name": "ON-PREM.GPU.B200_8x.x2",
            "description": "2 nodes x 8x B200 GPUs",
            "default": False,
        },
    ]
    assert gpus["L40S"][0] == {
        "name": "DGXC.GPU.L40S_1x",
        "description": "1x L40S GPU",
        "default": True,
    }
    assert gpus["L40"][0]["name"] == "DGXC.GPU.L40_1x"
    assert gpus["H100"][0]["name"] == "NCP.GPU.H100_1x"
    # Exactly one default per GPU.
    assert all(sum(t["default"] for t in types) == 1 for types in gpus.values())
    assert [(c["name"], c["attributes"], c["k8sVersion"]) for c in group["clusters"]] == [
        ("sim-ncp", [], "1.30.0"),
        ("sim-dgxc", [], "1.30.0"),
        ("sim-onprem", ["NVLinkOptimized"], "1.30.0"),
    ]
    assert [uuid.UUID(c["id"]) for c in group["clusters"]] == [c.id for c in catalog.clusters]
    assert all(c["region"] for c in group["clusters"])


def test_view_follows_the_caller_and_omits_unknown_k8s_versions() -> None:
    catalog = load_catalog(DATA / "valid_catalog.yaml")
    view = cluster_groups_view(catalog, "acct-2")
    assert [g["name"] for g in view["clusterGroups"]] == ["local", "edge"]
    assert {g["ncaId"] for g in view["clusterGroups"]} == {"acct-2"}
    local = view["clusterGroups"][0]
    assert local["clusters"][1] == {
        "id": str(catalog.groups[0].clusters[1].id),
        "name": "prod-a",
        "region": "us-west-2",
        "attributes": [],
    }
    assert [g["name"] for g in local["gpus"]] == ["H100", "L40S"]
    l40s = [t["name"] for t in local["gpus"][1]["instanceTypes"]][:2]
    assert l40s == ["ON-PREM.GPU.L40S_1x", "DGXC.GPU.L40S_1x"]

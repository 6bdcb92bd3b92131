"""Placement uses only the candidate clusters whose catalog entry permits the specification's
helmValidationPolicy (the operator's decision, read at every placement)."""

from __future__ import annotations

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.deployments.reconcile.placement import permitted_candidates
from tests.support.reconcile import Harness, catalog_data, workload

UNRESTRICTED = {"name": "Unrestricted", "extraKubernetesTypes": []}


def _catalog() -> Catalog:
    """sim-a (4 H100 nodes, Default only) and sim-b (1 node, Unrestricted permitted)."""
    data = catalog_data(
        extra_clusters=[
            {
                "name": "sim-b",
                "adapter": "simulated",
                "provider": "NCP",
                "region": "us-east-1",
                "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
                "simulation": {"scheduleSeconds": 1, "pullSeconds": 1, "readySeconds": 1},
                "helmValidation": {"allowedPolicies": ["Default", "Unrestricted"]},
            }
        ]
    )
    return Catalog.from_data(data)


def test_permitted_candidates_keep_order_and_unknown_names() -> None:
    catalog = _catalog()
    names = ["sim-a", "gone", "sim-b"]
    assert permitted_candidates(catalog, names, None) == names
    assert permitted_candidates(catalog, names, {"name": "Default"}) == names
    assert permitted_candidates(catalog, names, UNRESTRICTED) == ["gone", "sim-b"]
    ingress = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }
    assert permitted_candidates(catalog, names, ingress) == ["gone", "sim-b"]


async def test_placement_skips_clusters_that_do_not_permit_the_policy(harness: Harness) -> None:
    harness.catalog = _catalog()
    harness.registry = AdapterRegistry.from_catalog(harness.catalog, clock=harness.clock)
    rec = harness.new_reconciler()
    # sim-a has the most free GPUs and comes first, but does not permit Unrestricted
    dep = await harness.deploy([workload()], candidates=("sim-a", "sim-b"), policy=UNRESTRICTED)
    await harness.until_status(dep, "ACTIVE", reconciler=rec)
    [inst] = await harness.instances(dep)
    assert inst.cluster == "sim-b"
    # no candidate permits it (the catalog changed since the deploy): the instance fails
    stuck = await harness.deploy([workload()], candidates=("sim-a",), policy=UNRESTRICTED)
    await harness.until_status(stuck, "ERROR", reconciler=rec)
    [failed] = await harness.instances(stuck)
    assert failed.reason == "PolicyNotPermitted"
    assert "sim-a" in (failed.message or "")

"""The catalog's per-cluster chart settings: which helmValidationPolicy requests a cluster
permits (`helmValidation`, inherited from its group), its `apiVersions` and `k8sVersion`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.clusters.catalog import Catalog, CatalogError, check_catalog, load_catalog
from tests.support.catalogs import catalog_data

INGRESS = ("networking.k8s.io", "v1", "Ingress")
INGRESS_IN = {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}


def test_the_builtin_catalog_permits_the_default_policy_only() -> None:
    catalog = load_catalog(None)
    for cluster in catalog.clusters:
        permission = catalog.permission(cluster)
        assert permission.permits("Default")
        assert not permission.permits("Unrestricted")
        assert not permission.permits("Default", [INGRESS])
        assert permission.describe() == "Default only, no extra types"


def test_clusters_inherit_their_group_field_by_field() -> None:
    catalog = Catalog.from_data(
        catalog_data(
            {"allowedPolicies": ["Default"], "allowedExtraTypes": [INGRESS_IN]},
            sim_ncp={"helmValidation": {"allowedPolicies": ["Default", "Unrestricted"]}},
            sim_dgxc={"helmValidation": {"allowedExtraTypes": []}},
        )
    )
    ncp, dgxc, onprem = (catalog.permission(n) for n in ("sim-ncp", "SIM-DGXC", "sim-onprem"))
    # sim-ncp: its own policies; Unrestricted permits any extra type too
    assert ncp.permits("Unrestricted") and ncp.permits("Default", [("", "v1", "Namespace")])
    assert ncp.describe() == "Default and Unrestricted"
    # sim-dgxc: the group's policies, its own (empty) extra types
    assert not dgxc.permits("Default", [INGRESS]) and not dgxc.permits("Unrestricted")
    # sim-onprem: everything from the group
    assert onprem.permits("Default", [INGRESS]) and not onprem.permits("Unrestricted")
    assert onprem.describe() == "Default only, extra types networking.k8s.io/v1.Ingress"
    assert onprem.refused("Default", [INGRESS, ("", "v1", "Namespace")]) == ["v1.Namespace"]
    assert onprem.refused("Unrestricted") == ["policy Unrestricted"]
    assert [c.name for c in catalog.permitting(catalog.clusters, "Unrestricted")] == ["sim-ncp"]
    # a core-group extra type may be written with group "" or "core"
    core = Catalog.from_data(
        catalog_data({"allowedExtraTypes": [{"group": "core", "version": "v1", "kind": "Node"}]})
    )
    assert core.permission("sim-ncp").permits("Default", [("", "v1", "Node")])


def test_bad_settings_are_catalog_problems(tmp_path: Path) -> None:
    data = catalog_data(
        {"allowedPolicies": ["Lenient"], "allowedExtraTypes": [{"group": "x", "kind": ""}]},
        sim_ncp={"k8sVersion": "latest", "apiVersions": ["apps/v1", "not an api version"]},
        sim_dgxc={"helmValidation": {"allowedPolicies": []}},
    )
    with pytest.raises(CatalogError) as caught:
        Catalog.from_data(data)
    problems = "\n".join(caught.value.problems)
    for expected in (
        "clusterGroups[0].helmValidation.allowedPolicies[0]: Input should be 'Default' or "
        "'Unrestricted', not 'Lenient'",
        "clusterGroups[0].helmValidation.allowedExtraTypes[0]: missing required field 'version'",
        "clusterGroups[0].helmValidation.allowedExtraTypes[0].kind: String should have at least "
        "1 character",
        "clusterGroups[0].clusters[0].k8sVersion: 'latest' is not a Kubernetes version",
        "clusterGroups[0].clusters[0].apiVersions[1]: 'not an api version' is not an API version",
        "clusterGroups[0].clusters[1].helmValidation.allowedPolicies: must not be empty",
    ):
        assert expected in problems, problems
    # the file check says the same, with lines
    f = tmp_path / "catalog.yaml"

    f.write_text(yaml.safe_dump(data, sort_keys=False))
    assert len(check_catalog(f)) == len(caught.value.problems)


def test_api_versions_and_versions_are_read() -> None:
    catalog = Catalog.from_data(
        catalog_data(
            sim_ncp={"k8sVersion": "v1.28.3-eks.1", "apiVersions": ["v1", "apps/v1/Deployment"]}
        )
    )
    ncp = catalog.cluster("sim-ncp")
    assert ncp is not None and ncp.k8s_version == "v1.28.3-eks.1"
    assert ncp.api_versions == ["v1", "apps/v1/Deployment"]
    dgxc = catalog.cluster("sim-dgxc")
    assert dgxc is not None and dgxc.api_versions is None

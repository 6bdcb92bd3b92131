"""Test catalogs: the built-in catalog with the operator's helmValidation permissions (and
other cluster fields) changed, as data, as a `Catalog` or as a file for `clusters_file`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from service.clusters.catalog import Catalog

DEFAULT_CATALOG = Path(__file__).parents[2] / "service" / "clusters" / "default_catalog.yaml"
#: every policy and the extra types the tests use
PERMISSIVE = {"allowedPolicies": ["Default", "Unrestricted"]}


def catalog_data(group: dict[str, Any] | None = None, **clusters: dict[str, Any]) -> dict[str, Any]:
    """The built-in catalog with the group's `helmValidation` set to `group` (when given) and
    each named cluster's fields updated (`sim_onprem={...}` for sim-onprem)."""
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEFAULT_CATALOG.read_text()))
    (nvcf_default,) = data["clusterGroups"]
    if group is not None:
        nvcf_default["helmValidation"] = group
    for cluster in nvcf_default["clusters"]:
        cluster.update(clusters.get(cluster["name"].replace("-", "_"), {}))
    return data


def permissive_catalog() -> Catalog:
    """The built-in catalog permitting Unrestricted (and so any extra type) everywhere."""
    return Catalog.from_data(catalog_data(PERMISSIVE))


def write_catalog(
    tmp_path: Path, group: dict[str, Any] | None = None, **clusters: dict[str, Any]
) -> Path:
    """`catalog_data` as a file (JSON is YAML) for the `clusters_file` setting."""
    path = tmp_path / f"catalog-{len(list(tmp_path.glob('catalog-*')))}.yaml"
    path.write_text(json.dumps(catalog_data(group, **clusters)))
    return path

"""Deployment body validation (api.md §3.1) and the container workload, without HTTP."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.clusters.catalog import Catalog, load_catalog
from service.clusters.instance_types import parse_instance_type
from service.core.errors import ValidationFailed
from service.deployments.validation import (
    StoredSpec,
    revision_change,
    validate_create,
    validate_patch,
    validate_update,
)
from service.deployments.workload import duration_seconds, instance_resources
from tests.support.catalogs import permissive_catalog

CATALOG: Catalog = load_catalog(None)
OK = {"gpu": "L40S", "minInstances": 1, "maxInstances": 2}


def errors_of(body: Any, *, is_helm: bool = False) -> dict[str, str]:
    with pytest.raises(ValidationFailed) as caught:
        validate_create(body, catalog=CATALOG, is_helm=is_helm)
    return {e.field: e.message for e in caught.value.errors}


def specs(*items: dict[str, Any]) -> dict[str, Any]:
    return {"deploymentSpecifications": list(items)}


def test_defaults_and_resolution() -> None:
    (spec,) = validate_create(specs({**OK, "unknown": 1}), catalog=CATALOG, is_helm=False)
    assert spec.target.instance_type.name == "DGXC.GPU.L40S_1x"
    assert spec.target.group.name == "nvcf-default"
    assert [c.name for c in spec.target.clusters] == ["sim-dgxc"]
    assert (spec.max_request_concurrency, spec.preferred_order) == (1, 1)
    assert spec.configuration is None and spec.helm_validation_policy is None


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"gpu": None}, "gpu", "is required"),
        ({"minInstances": None}, "minInstances", "is required"),
        ({"minInstances": -1}, "minInstances", "from 0 to 1000, got -1"),
        ({"minInstances": True}, "minInstances", "an integer"),
        ({"maxInstances": None}, "maxInstances", "is required"),
        ({"maxInstances": 0}, "maxInstances", "from 1 to 1000, got 0"),
        ({"maxInstances": 2**31}, "maxInstances", "from 1 to 1000, got 2147483648"),
        ({"minInstances": 2**63}, "minInstances", "from 0 to 1000, got 9223372036854775808"),
        ({"maxInstances": 5}, "maxInstances", "at most 4: the candidate clusters (sim-dgxc)"),
        ({"minInstances": 3}, "maxInstances", "≥ minInstances (3)"),
        ({"maxRequestConcurrency": 0}, "maxRequestConcurrency", "1 to 16384"),
        ({"maxRequestConcurrency": 16385}, "maxRequestConcurrency", "1 to 16384"),
        ({"preferredOrder": 100}, "preferredOrder", "1 to 99"),
        ({"preferredOrder": "1"}, "preferredOrder", "1 to 99"),
        ({"clusters": "sim-dgxc"}, "clusters", "list of non-empty strings"),
        ({"regions": [""]}, "regions", "list of non-empty strings"),
        ({"attributes": {}}, "attributes", "list of non-empty strings"),
        ({"availabilityZones": [3]}, "availabilityZones", "list of non-empty strings"),
        ({"backend": "nowhere"}, "backend", "unknown cluster group"),
        ({"backend": "nvcf-default", "clusters": ["sim-dgxc"]}, "backend", "together"),
        ({"instanceType": "DGXC.GPU.L40S"}, "instanceType", "'_<N>x'"),
        ({"instanceType": "DGXC.GPU.H100_1x"}, "instanceType", "is for GPU H100"),
        ({"instanceType": "DGXC.GPU.L40S_2x"}, "instanceType", "offered: "),
        ({"attributes": ["NVLinkOptimized"]}, "attributes", "no cluster offering"),
    ],
)
def test_each_rule(change: dict[str, Any], field: str, fragment: str) -> None:
    errors = errors_of(specs({**OK, **change}))
    key = f"deploymentSpecifications[0].{field}"
    assert key in errors, errors
    assert fragment in errors[key]


def test_all_specs_are_reported_together() -> None:
    errors = errors_of(specs({**OK, "minInstances": -1}, OK, {**OK, "maxInstances": 0}))
    assert set(errors) == {
        "deploymentSpecifications[0].minInstances",
        "deploymentSpecifications[2].maxInstances",
    }


def test_helm_only_fields() -> None:
    errors = errors_of(specs({**OK, "configuration": {}, "helmValidationPolicy": {}}))
    assert set(errors) == {
        "deploymentSpecifications[0].configuration",
        "deploymentSpecifications[0].helmValidationPolicy",
    }
    (spec,) = validate_create(
        specs(
            {
                **OK,
                "configuration": {"a": {"b": 1}},
                "helmValidationPolicy": {
                    "name": "Unrestricted",
                    "extraKubernetesTypes": [
                        {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
                    ],
                },
            }
        ),
        catalog=permissive_catalog(),
        is_helm=True,
    )
    assert spec.configuration == {"a": {"b": 1}}
    assert spec.helm_validation_policy == {
        "name": "Unrestricted",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }
    helm_errors = errors_of(
        specs(
            {
                **OK,
                "configuration": [1],
                "helmValidationPolicy": {
                    "name": "Lax",
                    "extraKubernetesTypes": [{"group": 1, "kind": ""}, "x"],
                },
            }
        ),
        is_helm=True,
    )
    p = "deploymentSpecifications[0]"
    assert set(helm_errors) == {
        f"{p}.configuration",
        f"{p}.helmValidationPolicy.name",
        f"{p}.helmValidationPolicy.extraKubernetesTypes[0].group",
        f"{p}.helmValidationPolicy.extraKubernetesTypes[0].version",
        f"{p}.helmValidationPolicy.extraKubernetesTypes[0].kind",
        f"{p}.helmValidationPolicy.extraKubernetesTypes[1]",
    }


def test_multi_node_only_for_helm() -> None:
    # sim-onprem has two B200 nodes: room for one two-node instance
    multi = {**OK, "gpu": "B200", "instanceType": "ON-PREM.GPU.B200_8x.x2", "maxInstances": 1}
    assert "multi-node" in errors_of(specs(multi))["deploymentSpecifications[0].instanceType"]
    (spec,) = validate_create(specs(multi), catalog=CATALOG, is_helm=True)
    assert spec.target.instance_type.nodes == 2


STORED = StoredSpec(
    id=uuid.uuid4(),
    min_instances=1,
    max_instances=2,
    max_request_concurrency=1,
    fixed={
        "gpu": "L40S",
        "instanceType": "DGXC.GPU.L40S_1x",
        "backend": "nvcf-default",
        "clusters": None,
        "preferredOrder": 1,
        "configuration": None,
        "helmValidationPolicy": None,
    },
)


def test_update_allows_scaling_only() -> None:
    (change,) = validate_update(
        specs(
            {
                "gpu": "l40s",
                "instanceType": "dgxc.gpu.l40s_1x",
                "minInstances": 2,
                "maxInstances": 3,
                "backend": "NVCF-DEFAULT",
                "clusters": [],
            }
        ),
        [STORED],
    )
    assert (change.min_instances, change.max_instances) == (2, 3)
    with pytest.raises(ValidationFailed) as caught:
        validate_update(specs({**OK, "gpu": "H100", "preferredOrder": 2}), [STORED])
    assert {e.field for e in caught.value.errors} == {
        "deploymentSpecifications[0].gpu",
        "deploymentSpecifications[0].preferredOrder",
    }
    other = StoredSpec(uuid.uuid4(), 1, 1, 1, STORED.fixed)
    with pytest.raises(ValidationFailed) as caught:
        validate_update(specs(OK), [STORED, other])
    assert "gpuSpecificationId" in caught.value.errors[0].field


def test_patch() -> None:
    assert validate_patch({"minInstances": 0}, STORED).min_instances == 0
    bodies: list[Any] = [{}, {"minInstances": 3}, {"maxInstances": 0}, []]
    for body in bodies:
        with pytest.raises(ValidationFailed):
            validate_patch(body, STORED)


def test_patch_with_a_new_revision() -> None:
    change = validate_patch({"configuration": {"replicaCount": 2}}, STORED)
    assert (change.min_instances, change.max_instances) == (None, None)
    with pytest.raises(ValidationFailed) as refused:
        validate_patch(
            {"configuration": {}, "helmValidationPolicy": {"name": "Default"}},
            STORED,
            is_helm=False,
        )
    assert [e.field for e in refused.value.errors or []] == [
        "configuration",
        "helmValidationPolicy",
    ]
    assert revision_change({"minInstances": 1}) is None
    configured = revision_change({"configuration": {"replicaCount": 2}})
    assert configured is not None and configured.configuration_given
    assert configured.configuration == {"replicaCount": 2} and configured.policy is None
    policy_only = revision_change({"helmValidationPolicy": {"name": "Unrestricted"}})
    assert policy_only is not None and not policy_only.configuration_given
    assert policy_only.helm_validation_policy is not None
    assert policy_only.helm_validation_policy["name"] == "Unrestricted"


def test_workload_helpers() -> None:
    assert duration_seconds("PT10S") == 10
    assert duration_seconds("pt0.5s") == 1  # at least one second
    assert duration_seconds("PT1M30S") == 90
    assert duration_seconds("bogus") == 10
    cluster = CATALOG.cluster("sim-ncp")
    assert cluster is not None
    limits = instance_resources(cluster, parse_instance_type("NCP.GPU.H100_2x"))
    assert limits["nvidia.com/gpu"] == "2"
    # 192 CPUs and 2000Gi over 8 GPUs, 2 of them, 90 % of the node's share
    assert limits["cpu"] == "43200m"
    assert limits["memory"] == f"{int(2000 * 1024 * 2 / 8 * 0.9)}Mi"


def _kube_catalog(**kubernetes: Any) -> Catalog:
    cluster = {
        "name": "kube-a",
        "adapter": "kubernetes",
        "provider": "NCP",
        "region": "r",
        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
        "kubernetes": {"kubeconfig": "/nonexistent/kubeconfig", **kubernetes},
    }
    return Catalog.from_data({"clusterGroups": [{"name": "k", "clusters": [cluster]}]})


def test_a_grpc_function_is_refused_on_clusters_reached_through_the_api_servers_proxy() -> None:
    body = specs({"gpu": "H100", "backend": "k", "minInstances": 1, "maxInstances": 1})
    proxied = _kube_catalog()  # outside the cluster: apiServerProxy by default
    with pytest.raises(ValidationFailed) as caught:
        validate_create(body, catalog=proxied, is_helm=False, is_grpc=True)
    (error,) = caught.value.errors
    assert error.field == "deploymentSpecifications[0]"
    assert "kube-a" in error.message and "cannot carry gRPC" in error.message
    # an HTTP function there is fine, and so is a gRPC one reached by cluster DNS
    assert validate_create(body, catalog=proxied, is_helm=False)
    by_dns = _kube_catalog(workerAccess="serviceDns")
    assert validate_create(body, catalog=by_dns, is_helm=False, is_grpc=True)
    assert validate_create(specs(OK), catalog=CATALOG, is_helm=False, is_grpc=True)

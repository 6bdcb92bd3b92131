"""Install-time mutations (helm.md §5) as table tests over object dicts."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from typing import Any

import pytest

from service.charts.mutate import (
    instance_type_base,
    instance_type_nodes,
    mutate_for_install,
    partition_label,
)

NS = "sr-inst-1"
LABELS = {
    "nvcf.nvidia.com/function-id": "fn-1",
    "nvcf.nvidia.com/function-version-id": "ver-1",
    "nvcf.nvidia.com/instance-id": "inst-1",
    "nvcf.nvidia.com/nca-id": "nca-1",
}
ANNOTATIONS = {
    "nvcf.nvidia.com/function-name": "echo",
    "nvcf.nvidia.com/instance-type": "ON-PREM.GPU.B200_8x.x2",
    "nvcf.nvidia.com/backend": "nvcf-default",
    "nvcf.nvidia.com/region": "us-east-1",
}
NVCF_ENV = [
    {"name": "NVCF_FUNCTION_ID", "value": "fn-1"},
    {"name": "NVCF_FUNCTION_VERSION_ID", "value": "ver-1"},
    {"name": "NVCF_FUNCTION_NAME", "value": "echo"},
    {"name": "NVCF_NCA_ID", "value": "nca-1"},
    {"name": "NVCF_INSTANCETYPE", "value": "ON-PREM.GPU.B200_8x.x2"},
    {"name": "NVCF_BACKEND", "value": "nvcf-default"},
    {"name": "NVCF_REGION", "value": "us-east-1"},
]
INDEX = "dra.nvcf.nvidia.io/required-nvlink-domain-index"
PARTITION = "dra.nvcf.nvidia.io/nvlink-domain-partition"


def mutate(objects: list[dict[str, Any]], **overrides: Any) -> list[dict[str, Any]]:
    kwargs: dict[str, Any] = {
        "namespace": NS,
        "instance_id": "inst-1",
        "function_id": "fn-1",
        "version_id": "ver-1",
        "function_name": "echo",
        "nca_id": "nca-1",
        "instance_type": "ON-PREM.GPU.B200_8x.x2",
        "backend": "nvcf-default",
        "region": "us-east-1",
        "pull_secrets": [],
        "nvlink": False,
    }
    kwargs.update(overrides)
    return mutate_for_install(objects, **kwargs)


def deployment(
    template_annotations: dict[str, str] | None = None,
    own_annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {"containers": [{"name": "app", "image": "x"}]}
    pod_spec.update(spec)
    template: dict[str, Any] = {"metadata": {"labels": {"app": "a"}}, "spec": pod_spec}
    if template_annotations:
        template["metadata"]["annotations"] = template_annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "annotations": dict(own_annotations or {})},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template},
    }


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    ("instance_type", "base", "nodes"),
    [
        ("ON-PREM.GPU.B200_8x.x2", "ON-PREM.GPU.B200", 2),
        ("DGXC.GPU.L40S_1x", "DGXC.GPU.L40S", 1),
        ("NCP.GPU.A100_80GB_4x", "NCP.GPU.A100_80GB", 1),
        ("GCP.GPU.H100_8x.x16", "GCP.GPU.H100", 16),
    ],
)
def test_instance_type_parts(instance_type: str, base: str, nodes: int) -> None:
    assert instance_type_base(instance_type) == base
    assert instance_type_nodes(instance_type) == nodes


def test_every_object_gets_labels_annotations_and_namespace() -> None:
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"x": "y"}}},
        deployment(),
    ]
    original = copy.deepcopy(objects)
    out = mutate(objects)
    assert objects == original  # the input is never modified
    for obj in out:
        assert obj["metadata"]["namespace"] == NS
        assert LABELS.items() <= obj["metadata"]["labels"].items()
        assert obj["metadata"]["annotations"] == ANNOTATIONS
    assert out[0]["metadata"]["labels"]["x"] == "y"
    assert LABELS.items() <= out[1]["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("chart_secrets", "credentials", "expected"),
    [
        ([], [], []),
        ([], [("reg-b", {}), ("reg-a", {})], ["reg-a", "reg-b"]),
        ([{"name": "zeta"}, {"name": "reg-a"}], [("reg-a", {})], ["reg-a", "zeta"]),
        ([{"name": "mine"}, {"name": "mine"}], [], ["mine"]),
    ],
)
def test_image_pull_secrets_union_sorted(
    chart_secrets: list[dict[str, str]],
    credentials: list[tuple[str, dict[str, Any]]],
    expected: list[str],
) -> None:
    out = mutate([deployment(imagePullSecrets=chart_secrets)], pull_secrets=credentials)
    assert pod_spec_of(out[-1])["imagePullSecrets"] == [{"name": n} for n in expected]
    secrets = [o for o in out if o["kind"] == "Secret"]
    assert [s["metadata"]["name"] for s in secrets] == [n for n, _ in credentials]


def test_pull_secret_objects() -> None:
    config = {"auths": {"nvcr.io": {"auth": base64.b64encode(b"$oauthtoken:k").decode()}}}
    [secret, _] = mutate([deployment()], pull_secrets=[("nvcr-io", config)])
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["namespace"] == NS
    decoded = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert decoded == config


@pytest.mark.parametrize(
    ("env", "expected_prefix"),
    [
        (None, []),
        ([{"name": "A", "value": "1"}], [{"name": "A", "value": "1"}]),
        (
            [{"name": "NVCF_REGION", "value": "spoofed"}, {"name": "B", "value": "2"}],
            [{"name": "B", "value": "2"}],
        ),
    ],
)
def test_env_replaces_same_named(env: list[dict[str, str]] | None, expected_prefix: Any) -> None:
    obj = deployment()
    if env is not None:
        obj["spec"]["template"]["spec"]["containers"][0]["env"] = env
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "init", "image": "x"}]
    [out] = mutate([obj])
    spec = pod_spec_of(out)
    assert spec["containers"][0]["env"] == expected_prefix + NVCF_ENV
    assert spec["initContainers"][0]["env"] == NVCF_ENV


INSTANCE_TERM = {
    "key": "nvca.nvcf.nvidia.io/instance-type",
    "operator": "In",
    "values": ["ON-PREM.GPU.B200"],
}
CLIQUE_TERM = {"key": "nvidia.com/gpu.clique", "operator": "Exists"}


@pytest.mark.parametrize(
    ("nvlink", "existing_terms", "expected_terms"),
    [
        (False, None, [{"matchExpressions": [INSTANCE_TERM]}]),
        (True, None, [{"matchExpressions": [INSTANCE_TERM, CLIQUE_TERM]}]),
        (
            False,
            [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}],
            [
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]},
                        INSTANCE_TERM,
                    ]
                }
            ],
        ),
    ],
)
def test_required_node_affinity(
    nvlink: bool, existing_terms: list[dict[str, Any]] | None, expected_terms: Any
) -> None:
    extra: dict[str, Any] = {}
    if existing_terms is not None:
        extra["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": existing_terms
                }
            }
        }
    out = mutate([deployment(**extra)], nvlink=nvlink)
    affinity = pod_spec_of(out[-1])["affinity"]
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == expected_terms


def test_no_nvlink_no_compute_domain() -> None:
    out = mutate([deployment(resources={})])
    assert [o["kind"] for o in out] == ["Deployment"]
    spec = pod_spec_of(out[0])
    assert "podAffinity" not in spec["affinity"]
    assert "resourceClaims" not in spec
    assert PARTITION not in out[0]["spec"]["template"]["metadata"]["labels"]


def expected_partition(value: str) -> str:
    return "x" + hashlib.sha256((NS + value).encode()).hexdigest()[:18] + "x"


def gpu_container(resource: str, section: str = "limits") -> dict[str, Any]:
    return {"name": "gpu", "image": "x", "resources": {section: {resource: 1}}}


@pytest.mark.parametrize(
    ("template_annotations", "own_annotations", "required", "index_value"),
    [
        ({INDEX: "3"}, None, True, "3"),
        (None, None, False, ""),
        (None, {INDEX: "3"}, False, ""),  # on the controller's own metadata: no effect
        ({"other": "x"}, {INDEX: "5"}, False, ""),
    ],
)
def test_nvlink_partition_and_pod_affinity(
    template_annotations: dict[str, str] | None,
    own_annotations: dict[str, str] | None,
    required: bool,
    index_value: str,
) -> None:
    out = mutate([deployment(template_annotations, own_annotations)], nvlink=True)
    assert [o["kind"] for o in out] == ["ComputeDomain", "Deployment"]
    obj = out[1]
    label = expected_partition(index_value)
    assert len(label) == 20
    assert obj["spec"]["template"]["metadata"]["labels"][PARTITION] == label
    assert partition_label(NS, index_value or None) == label
    term = {
        "labelSelector": {
            "matchExpressions": [{"key": PARTITION, "operator": "In", "values": [label]}]
        },
        "topologyKey": "nvidia.com/gpu.clique",
    }
    pod_affinity = pod_spec_of(obj)["affinity"]["podAffinity"]
    if required:
        assert pod_affinity == {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    else:
        assert pod_affinity == {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": term}
            ]
        }


def test_compute_domain_object() -> None:
    [domain, _] = mutate([deployment()], nvlink=True)
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["metadata"]["name"] == "nvcf-cd-index-0"
    assert domain["metadata"]["namespace"] == NS
    assert domain["spec"]["channel"] == {"resourceClaimTemplate": {"name": "nvcf-cd-channel-0"}}
    assert domain["spec"]["numNodes"] == 2


@pytest.mark.parametrize(
    ("container", "claimed"),
    [
        (gpu_container("nvidia.com/gpu"), True),
        (gpu_container("nvidia.com/pgpu", "requests"), True),
        (gpu_container("nvidia.com/gpu.shared"), True),
        (gpu_container("nvidia.com/mig-1g.10gb"), True),
        (gpu_container("cpu"), False),
        ({"name": "plain", "image": "x"}, False),
    ],
)
def test_gpu_containers_get_resource_claims(container: dict[str, Any], claimed: bool) -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"].append(container)
    [_, out] = mutate([obj], nvlink=True)
    spec = pod_spec_of(out)
    app, other = spec["containers"]
    assert "claims" not in app.get("resources", {})
    if claimed:
        assert other["resources"]["claims"] == [{"name": "nvcf-cd-index-0"}]
        assert spec["resourceClaims"] == [
            {"name": "nvcf-cd-index-0", "resourceClaimTemplateName": "nvcf-cd-channel-0"}
        ]
    else:
        assert "claims" not in other.get("resources", {})
        assert "resourceClaims" not in spec


def test_gpu_claims_without_nvlink_are_not_added() -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"] = [gpu_container("nvidia.com/gpu")]
    [out] = mutate([obj])
    assert "claims" not in pod_spec_of(out)["containers"][0]["resources"]


def test_plain_pod_and_cronjob_are_mutated() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": {INDEX: "0"}},
        "spec": {"containers": [gpu_container("nvidia.com/gpu")]},
    }
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}},
    }
    _, out_pod, out_cron = mutate([pod, cron], nvlink=True)
    # a Pod's own metadata is its pod template metadata
    assert out_pod["metadata"]["labels"][PARTITION] == expected_partition("0")
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        in out_pod["spec"]["affinity"]["podAffinity"]
    )
    assert out_pod["spec"]["resourceClaims"][0]["name"] == "nvcf-cd-index-0"
    cron_spec = out_cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert cron_spec["containers"][0]["env"] == NVCF_ENV
    assert cron_spec["imagePullSecrets"] == []


# --- the version's secrets (Secret nvcf-secrets, /var/secrets/secrets.json) ---------------


def test_secrets_secret_and_mount_in_every_container() -> None:
    pod = deployment(
        initContainers=[{"name": "init", "image": "x"}],
        volumes=[
            {"name": "nvcf-secrets", "emptyDir": {}},  # the chart's same-named volume goes
            {"name": "data", "emptyDir": {}},
        ],
    )
    pod["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/var/secrets"},  # reserved path: replaced
        {"name": "data", "mountPath": "/data"},
    ]
    [secret, out] = mutate([pod], secrets={"B": "2", "A": "1"})
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "nvcf-secrets"
    assert secret["type"] == "Opaque" and secret["metadata"]["namespace"] == NS
    assert secret["metadata"]["labels"] == LABELS
    content = base64.b64decode(secret["data"]["secrets.json"]).decode()
    assert content == '{"A":"1","B":"2"}'  # sorted, compact
    spec = out["spec"]["template"]["spec"]
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}},
    ]
    mount = {"name": "nvcf-secrets", "mountPath": "/var/secrets", "readOnly": True}
    assert spec["initContainers"][0]["volumeMounts"] == [mount]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        mount,
    ]


def test_no_secrets_argument_adds_nothing() -> None:
    [out] = mutate([deployment()])
    assert "volumes" not in out["spec"]["template"]["spec"]


def test_secrets_mutation_is_stable_whatever_the_values() -> None:
    """Pod templates do not depend on the values: a rotation changes only the Secret, so
    workloads are not restarted."""
    [_, first] = mutate([deployment()], secrets={"A": "1"})
    [_, second] = mutate([deployment()], secrets={"A": "2", "B": "3"})
    assert first == second


def test_a_chart_secret_of_the_reserved_name_gives_way() -> None:
    theirs = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nvcf-secrets"}}
    out = mutate([theirs, deployment()], secrets={"A": "1"})
    [secret] = [o for o in out if o["kind"] == "Secret"]
    assert "secrets.json" in secret["data"]

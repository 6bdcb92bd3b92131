"""Restriction rules over real corpus charts (exact rule ids, objects and fields) and tables."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.charts.findings import Finding
from service.charts.policy import ValidationPolicy, restrict
from service.charts.render import ChartRenderer
from tests.support.charts import BASE, FAILING, ArchiveFactory, Row, validate


@pytest.fixture
async def renderer() -> AsyncIterator[ChartRenderer]:
    # every render of two documents or more is decoded half in the worker
    async with ChartRenderer(workers=1, split_decode_min_bytes=0) as r:
        yield r


def rows(findings: list[Finding]) -> list[Row]:
    return [(f.rule, f.severity, f.object, f.field) for f in findings]


@pytest.mark.parametrize("name", sorted(FAILING))
async def test_failing_chart_reports_exactly_its_rule(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory, name: str
) -> None:
    result = await validate(renderer, corpus_archive(name))
    assert rows(result.errors + result.warnings) == FAILING[name]
    assert result.valid == all(severity != "error" for _, severity, _, _ in FAILING[name])


async def test_messages_name_what_is_wrong(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    kinds = await validate(renderer, corpus_archive("kind-not-allowed"))
    message = kinds.errors[0].message
    assert message.startswith("kinds not allowed: v1.Namespace, networking.k8s.io/v1.Ingress")
    security = await validate(renderer, corpus_archive("security"))
    inherited = [f for f in security.warnings if f.rule == "security-run-as-user"]
    assert [f.message for f in inherited] == [
        "container 'root': runAsUser must not be 0 (root)",
        "container 'inherits': runAsUser must not be 0 (root)",
    ]
    missing = await validate(renderer, corpus_archive("service-not-found"))
    assert "Services: mini-service-entrypoint" in missing.errors[0].message


async def test_enforced_security_turns_warnings_into_errors(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive("security"), enforce_security=True)
    assert result.warnings == []
    assert rows(result.errors) == [(r, "error", o, f) for r, _, o, f in FAILING["security"]]


async def test_unrestricted_policy_skips_kinds_and_security_but_not_size(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    unrestricted = ValidationPolicy.from_dict({"name": "Unrestricted"})
    security = await validate(
        renderer, corpus_archive("security"), policy=unrestricted, enforce_security=True
    )
    assert security.valid and security.errors == [] and security.warnings == []
    # NVCF's Unrestricted: no kind restriction either (the cluster must permit it)
    kinds = await validate(renderer, corpus_archive("kind-not-allowed"), policy=unrestricted)
    assert kinds.valid and rows(kinds.errors) == []
    many = await validate(renderer, corpus_archive("too-many-objects"), policy=unrestricted)
    assert rows(many.errors) == FAILING["too-many-objects"]


async def test_extra_kubernetes_types_allow_kinds(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    policy = ValidationPolicy.from_dict(
        {
            "name": "Default",
            "extraKubernetesTypes": [
                {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"},
                {"group": "", "version": "v1", "kind": "Namespace"},
            ],
        }
    )
    result = await validate(renderer, corpus_archive("kind-not-allowed"), policy=policy)
    assert result.valid and rows(result.errors + result.warnings) == []
    only_ingress = ValidationPolicy.from_dict(
        {
            "extraKubernetesTypes": [
                {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
            ]
        }
    )
    result = await validate(renderer, corpus_archive("kind-not-allowed"), policy=only_ingress)
    assert [f.message.split(" (")[0] for f in result.errors] == ["kinds not allowed: v1.Namespace"]


async def test_override_introducing_forbidden_objects_is_caught(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    values = {
        "service": {"type": "LoadBalancer"},
        "extraObjects": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "admin-ish"},
            },
        ],
    }
    archive = corpus_archive(BASE)
    assert (await validate(renderer, archive)).valid
    result = await validate(renderer, archive, values)
    assert rows(result.errors) == [
        ("kind-not-allowed", "error", None, "kind"),
        ("service-type", "error", "v1/Service/entrypoint", "spec.type"),
    ]
    assert "v1.Namespace, rbac.authorization.k8s.io/v1.ClusterRole" in result.errors[0].message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"service": {"targetPort": 8000}}, []),
        ({"containerPort": 9000}, []),  # the named targetPort follows the container
        (
            {"containerPort": 9000, "service": {"targetPort": 8000}},
            [("service-target", "error", "v1/Service/entrypoint", "spec.ports[0].targetPort")],
        ),
        (
            {"service": {"port": 80}},
            [("service-port", "error", "v1/Service/entrypoint", "spec.ports")],
        ),
        (
            {"service": {"name": "other"}},
            [("service-not-found", "error", None, "helmChartServiceName")],
        ),
    ],
)
async def test_inference_service_checks_follow_values(
    renderer: ChartRenderer,
    corpus_archive: ArchiveFactory,
    values: dict[str, Any],
    expected: list[Row],
) -> None:
    result = await validate(renderer, corpus_archive(BASE), values)
    assert rows(result.errors) == expected


async def test_multi_node_full_node(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    archive = corpus_archive(BASE)
    deployment = "apps/v1/Deployment/mini-service-inference"
    full = {"gpus": 8, "replicaCount": 2}
    multi = {"instance_type_nodes": 2, "gpus_per_node": 8}
    assert rows((await validate(renderer, archive, full, nvlink=True, **multi)).errors) == []
    partial = await validate(renderer, archive, {"gpus": 4, "replicaCount": 3}, **multi)
    expected = [
        ("multi-node-full-node", "warning", deployment, "spec.template.spec.containers"),
        ("multi-node-full-node", "warning", None, None),
    ]
    assert rows(partial.warnings) == expected
    assert partial.valid
    nvlink = await validate(renderer, archive, {"gpus": 4, "replicaCount": 3}, nvlink=True, **multi)
    assert rows(nvlink.errors) == [(r, "error", o, f) for r, _, o, f in expected]
    single = await validate(
        renderer, archive, {"gpus": 4, "replicaCount": 3}, instance_type_nodes=1, gpus_per_node=8
    )
    assert single.valid and single.warnings == []


# --- table tests over object dicts ----------------------------------------------------------


def secure_container(name: str = "app", **overrides: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": "x",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
    }
    container.update(overrides)
    return container


def cronjob(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "cron"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": {"spec": pod_spec}}},
        },
    }


POD_SC = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
ENTRYPOINT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "entrypoint"},
    "spec": {"selector": {"app": "x"}, "ports": [{"port": 8000}]},
}
CJ = "spec.jobTemplate.spec.template.spec"


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [
        ({"securityContext": POD_SC, "containers": [secure_container()]}, []),
        (
            # container-level settings override an insecure pod-level default
            {
                "securityContext": {"runAsNonRoot": False, "runAsUser": 0},
                "containers": [
                    secure_container(
                        securityContext={
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                            "runAsNonRoot": True,
                            "runAsUser": 1000,
                            "seccompProfile": {"type": "Localhost", "localhostProfile": "p"},
                            "seLinuxOptions": {"type": "container_t"},
                            "procMount": "Default",
                        }
                    )
                ],
            },
            [],
        ),
        (
            {
                "securityContext": POD_SC,
                "initContainers": [secure_container("init", resources={})],
                "containers": [secure_container()],
                "volumes": [{"name": "d", "downwardAPI": {"items": []}}],
            },
            [
                ("volume-type", "error", "batch/v1/CronJob/cron", f"{CJ}.volumes[0].downwardAPI"),
                (
                    "resources-limits",
                    "warning",
                    "batch/v1/CronJob/cron",
                    f"{CJ}.initContainers[0].resources.limits",
                ),
            ],
        ),
        (
            {
                "securityContext": {**POD_SC, "seLinuxOptions": {"role": "r"}},
                "containers": [secure_container(), secure_container("b")],
            },
            [
                (
                    "security-selinux",
                    "warning",
                    "batch/v1/CronJob/cron",
                    f"{CJ}.securityContext.seLinuxOptions.role",
                )
            ]
            * 2,
        ),
    ],
)
def test_restrict_tables(pod_spec: dict[str, Any], expected: list[Row]) -> None:
    _, findings, _ = restrict([ENTRYPOINT, cronjob(pod_spec)], service_name="x", inference_port=1)
    assert rows([f for f in findings if f.rule != "service-not-found"]) == expected


def test_service_selector_must_match_pod_labels() -> None:
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "y"}},
                "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 8000}]}]},
            }
        },
    }
    _, findings, _ = restrict(
        [ENTRYPOINT, deployment],
        service_name="entrypoint",
        inference_port=8000,
        policy=ValidationPolicy(name="Unrestricted"),
    )
    assert rows(findings) == [
        ("service-target", "error", "v1/Service/entrypoint", "spec.ports[0].targetPort")
    ]
    assert "no Pod or pod template matches its selector" in findings[0].message
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": "x", "extra": "1"}
    _, findings, _ = restrict(
        [ENTRYPOINT, deployment],
        service_name="entrypoint",
        inference_port=8000,
        policy=ValidationPolicy(name="Unrestricted"),
    )
    assert findings == []


def test_crds_from_templates_are_dropped() -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "a.example.com"},
    }
    kept, findings, dropped = restrict(
        [crd, ENTRYPOINT], service_name="entrypoint", inference_port=8000
    )
    assert kept == [ENTRYPOINT]
    assert dropped == ["apiextensions.k8s.io/v1/CustomResourceDefinition/a.example.com"]
    assert ("crd-skipped", "warning", dropped[0], None) in rows(findings)


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "Strict"},
        {"extraKubernetesTypes": [{"group": "x"}]},
        {"extraKubernetesTypes": ["apps/v1/DaemonSet"]},
    ],
)
def test_policy_from_dict_rejects_malformed(raw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ValidationPolicy.from_dict(raw)


def test_policy_core_group_alias() -> None:
    policy = ValidationPolicy.from_dict(
        {"extraKubernetesTypes": [{"group": "core", "version": "v1", "kind": "Namespace"}]}
    )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}
    _, findings, _ = restrict(
        [ENTRYPOINT, namespace], service_name="x", inference_port=1, policy=policy
    )
    assert "kind-not-allowed" not in {f.rule for f in findings}

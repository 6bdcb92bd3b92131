"""Restriction rules over real corpus charts (exact rule ids, objects and fields) and tables."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.charts.findings import Finding
from service.charts.policy import POD_INDEX_LABEL as POD_INDEX
from service.charts.policy import ValidationPolicy, restrict
from service.charts.render import ChartRenderer
from service.charts.schemas import parse_policy
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
    unrestricted = ValidationPolicy(name="Unrestricted")
    security = await validate(
        renderer, corpus_archive("security"), policy=unrestricted, enforce_security=True
    )
    assert security.valid and security.errors == [] and security.warnings == []
    # NVCF's Unrestricted: no kind restriction either (the cluster must permit it)
    kinds = await validate(renderer, corpus_archive("kind-not-allowed"), policy=unrestricted)
    assert kinds.valid and rows(kinds.errors) == []
    many = await validate(renderer, corpus_archive("too-many-objects"), policy=unrestricted)
    assert rows(many.errors) == FAILING["too-many-objects"]


async def test_extra_kubernetes_types_allow_kinds_of_named_groups_only(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    ingress = {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
    # `core` is not an alias of the empty core group (NVCF matches the group exactly), so
    # v1 Namespace stays refused, and the message says it cannot be allowed
    policy = parse_policy(
        {
            "name": "Default",
            "extraKubernetesTypes": [
                ingress,
                {"group": "core", "version": "v1", "kind": "Namespace"},
            ],
        }
    )
    result = await validate(renderer, corpus_archive("kind-not-allowed"), policy=policy)
    assert rows(result.errors) == FAILING["kind-not-allowed"]
    message = result.errors[0].message
    assert message.startswith("kinds not allowed: v1.Namespace (")
    assert "core-group (v1) kinds outside the allowed list cannot be allowed" in message
    only_ingress = parse_policy({"name": "Default", "extraKubernetesTypes": [ingress]})
    result = await validate(renderer, corpus_archive("kind-not-allowed"), policy=only_ingress)
    assert [f.message.split(" (")[0] for f in result.errors] == ["kinds not allowed: v1.Namespace"]
    extra_objects = {
        "extraObjects": [
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": "public"},
            }
        ]
    }
    result = await validate(renderer, corpus_archive(BASE), extra_objects, policy=only_ingress)
    assert result.valid and rows(result.errors + result.warnings) == []


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
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
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
                            "readOnlyRootFilesystem": True,
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
                "spec": {
                    "containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 8000}]}]
                },
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
    ("raw", "fields"),
    [
        ({"name": "Strict"}, ["name"]),
        # names are case-sensitive and required, as in NVCF
        ({"name": "default"}, ["name"]),
        ({"name": "UNRESTRICTED"}, ["name"]),
        ({}, ["name"]),
        (
            {"name": "Default", "extraKubernetesTypes": [{"group": "x"}]},
            ["[0].version", "[0].kind"],
        ),
        # an empty (core) group would let a hostPath PersistentVolume through
        (
            {
                "name": "Default",
                "extraKubernetesTypes": [
                    {"group": "", "version": "v1", "kind": "PersistentVolume"}
                ],
            },
            ["[0].group"],
        ),
        (
            {"name": "Default", "extraKubernetesTypes": [{"version": "v1", "kind": "Namespace"}]},
            ["[0].group"],
        ),
        ({"name": "Default", "extraKubernetesTypes": ["apps/v1/DaemonSet"]}, ["[0]"]),
    ],
)
def test_policy_from_dict_rejects_malformed(raw: dict[str, Any], fields: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_policy(raw)
    named = [part.split(": ")[0] for part in str(info.value).split("; ")]
    prefix = "helmValidationPolicy."
    assert named == [
        prefix + ("extraKubernetesTypes" + f if f.startswith("[") else f) for f in fields
    ]


def test_core_group_kinds_cannot_be_allowed() -> None:
    policy = parse_policy(
        {
            "name": "Default",
            "extraKubernetesTypes": [
                {"group": "core", "version": "v1", "kind": "PersistentVolume"}
            ],
        }
    )
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "host"},
        "spec": {"hostPath": {"path": "/"}},
    }
    _, findings, _ = restrict(
        [ENTRYPOINT, volume], service_name="entrypoint", inference_port=8000, policy=policy
    )
    [kinds] = [f for f in findings if f.rule == "kind-not-allowed"]
    assert kinds.severity == "error"
    assert kinds.message.startswith("kinds not allowed: v1.PersistentVolume (")


def statefulset(labels: dict[str, str], kind: str = "StatefulSet") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "workers"},
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 8000}]}]
                },
            },
        },
    }


def leader_service(selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "entrypoint"},
        "spec": {"selector": selector, "ports": [{"port": 8000}]},
    }


@pytest.mark.parametrize(
    ("selector", "kind", "labels", "selected"),
    [
        # the StatefulSet controller adds the pod's ordinal at run time
        ({"app": "x", POD_INDEX: "0"}, "StatefulSet", {"app": "x"}, True),
        ({POD_INDEX: "0"}, "StatefulSet", {"app": "x"}, True),
        ({"app": "x", POD_INDEX: "0"}, "StatefulSet", {"app": "y"}, False),
        # an empty value is no ordinal: never set on a pod
        ({"app": "x", POD_INDEX: ""}, "StatefulSet", {"app": "x"}, False),
        # other controllers never add it
        ({"app": "x", POD_INDEX: "0"}, "Deployment", {"app": "x"}, False),
        ({"app": "x", POD_INDEX: "0"}, "Deployment", {"app": "x", POD_INDEX: "0"}, True),
    ],
)
def test_pod_index_selector_matches_statefulset_pods(
    selector: dict[str, str], kind: str, labels: dict[str, str], selected: bool
) -> None:
    _, findings, _ = restrict(
        [leader_service(selector), statefulset(labels, kind)],
        service_name="entrypoint",
        inference_port=8000,
        policy=ValidationPolicy(name="Unrestricted"),
    )
    assert [f.rule for f in findings] == ([] if selected else ["service-target"])


async def test_multi_node_statefulset_chart_passes(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(
        renderer,
        corpus_archive("multi-node-statefulset"),
        instance_type_nodes=2,
        gpus_per_node=8,
        nvlink=True,
    )
    assert rows(result.errors + result.warnings) == []


LWS = {"group": "leaderworkerset.x-k8s.io", "version": "v1", "kind": "LeaderWorkerSet"}
OPERATOR_MANAGED = parse_policy({"name": "Default", "extraKubernetesTypes": [LWS]})


def test_operator_managed_workloads_make_the_inference_service_checks_warnings() -> None:
    """With extra types (an operator such as LeaderWorkerSet creates the Service and the
    pods), a missing Service or unserved port is a warning; without them, an error."""
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "lws"},
        "spec": {},
    }
    for policy, severity in ((OPERATOR_MANAGED, "warning"), (ValidationPolicy(), "error")):
        _, findings, _ = restrict(
            [lws], service_name="entrypoint", inference_port=8000, policy=policy
        )
        assert rows([f for f in findings if f.rule != "kind-not-allowed"]) == [
            ("service-not-found", severity, None, "helmChartServiceName")
        ]
        _, findings, _ = restrict(
            [lws, ENTRYPOINT], service_name="entrypoint", inference_port=8000, policy=policy
        )
        assert rows([f for f in findings if f.rule != "kind-not-allowed"]) == [
            ("service-target", severity, "v1/Service/entrypoint", "spec.ports[0].targetPort")
        ]
    _, findings, _ = restrict(
        [lws], service_name="entrypoint", inference_port=8000, policy=OPERATOR_MANAGED
    )
    assert "operator-managed workload" in findings[0].message
    # the port of a Service the chart does render is still checked
    _, findings, _ = restrict(
        [lws, ENTRYPOINT], service_name="entrypoint", inference_port=9000, policy=OPERATOR_MANAGED
    )
    assert rows(findings) == [("service-port", "error", "v1/Service/entrypoint", "spec.ports")]


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 8000}], **spec},
    }


def serving_pod(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "server", "labels": {"app": "x"}},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "ports": [{"containerPort": 8000}], **container}
            ]
        },
    }


def test_inference_service_type_and_uniqueness() -> None:
    def check(*objects: dict[str, Any]) -> list[Row]:
        _, findings, _ = restrict(
            [*objects, serving_pod()],
            service_name="entrypoint",
            inference_port=8000,
            policy=ValidationPolicy(),
        )
        return rows([f for f in findings if not f.rule.startswith(("security-", "resources-"))])

    # Kubernetes defaults an empty type to ClusterIP
    assert check(service("entrypoint", type="")) == []
    assert check(service("entrypoint", type="ClusterIP"), service("other", type="")) == []
    assert check(service("entrypoint", type="NodePort")) == [
        ("service-type", "error", "v1/Service/entrypoint", "spec.type")
    ]
    # two Services with the inference name: which one serves is ambiguous
    assert check(service("entrypoint"), service("entrypoint", ports=[{"port": 9000}])) == [
        ("service-duplicate", "error", "v1/Service/entrypoint", "metadata.name")
    ]


@pytest.mark.parametrize("image", [None, "", "  ", 5])
def test_container_without_image_is_an_error(image: Any) -> None:
    pod = serving_pod()
    pod["spec"]["initContainers"] = [{"name": "init", "image": image}]
    if image is None:
        del pod["spec"]["initContainers"][0]["image"]
    pod["spec"]["containers"][0]["image"] = image
    for policy in (ValidationPolicy(), ValidationPolicy(name="Unrestricted")):
        _, findings, _ = restrict(
            [ENTRYPOINT, pod], service_name="entrypoint", inference_port=8000, policy=policy
        )
        errors = [f for f in findings if f.severity == "error"]
        assert rows(errors) == [
            ("container-image", "error", "v1/Pod/server", "spec.initContainers[0].image"),
            ("container-image", "error", "v1/Pod/server", "spec.containers[0].image"),
        ]
        assert errors[1].message == "container 'c' has no image"


@pytest.mark.parametrize("enforce", [False, True])
def test_read_only_root_filesystem_and_repeated_capabilities(enforce: bool) -> None:
    severity = "error" if enforce else "warning"
    field = f"{CJ}.containers[0].securityContext"

    def findings_of(**security: Any) -> list[Finding]:
        container = secure_container()
        container["securityContext"].update(security)
        _, found, _ = restrict(
            [ENTRYPOINT, cronjob({"securityContext": POD_SC, "containers": [container]})],
            service_name="x",
            inference_port=1,
            enforce_security=enforce,
        )
        return [f for f in found if f.rule.startswith("security-")]

    assert findings_of() == []
    for value in (False, None, "true"):
        assert rows(findings_of(readOnlyRootFilesystem=value)) == [
            (
                "security-read-only-root-filesystem",
                severity,
                "batch/v1/CronJob/cron",
                f"{field}.readOnlyRootFilesystem",
            )
        ]
    twice = findings_of(
        capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "NET_BIND_SERVICE"]}
    )
    assert rows(twice) == [
        ("security-capabilities", severity, "batch/v1/CronJob/cron", f"{field}.capabilities.add")
    ]
    assert "NET_BIND_SERVICE more than once" in twice[0].message
    both = findings_of(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_ADMIN"]})
    assert [f.message for f in both] == [
        "container 'app': capabilities SYS_ADMIN may not be added (only "
        "NET_BIND_SERVICE); capabilities.add lists SYS_ADMIN more than once"
    ]


@pytest.mark.parametrize("value", [5, True, "ALL"])
def test_list_fields_rendered_as_scalars_do_not_crash_the_checks(value: Any) -> None:
    """A chart may render anything where Kubernetes expects a list; the checks read it as
    empty (Kubernetes refuses the object later) instead of failing with a 500."""
    pod = serving_pod(ports=value, securityContext={"capabilities": {"drop": value, "add": value}})
    pod["spec"]["securityContext"] = {"sysctls": value}
    entry = service("entrypoint", ports=value)
    _, findings, _ = restrict([entry, pod], service_name="entrypoint", inference_port=8000)
    assert "service-port" in {f.rule for f in findings}

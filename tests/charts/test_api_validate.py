"""The dry-run endpoint `POST /v2/nvcf/helm/validate` (helm.md §6) against real registries.

A dry run stores nothing: the tests on `client` share one app per database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.auth import scopes
from service.charts.mutate import NVLINK_PARTITION_LABEL
from service.charts.pipeline import PLACEHOLDER_INSTANCE_ID
from service.charts.render import PLACEHOLDER_NAMESPACE
from service.core.kube import LABEL_INSTANCE_ID
from tests.support.api import bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.catalogs import PERMISSIVE, write_catalog
from tests.support.charts import HOOK, PushCorpus, flat_chart, push_archive
from tests.support.registry import RegistryServer

pytestmark = [pytest.mark.registry, pytest.mark.asyncio(loop_scope="module")]
# the tests that build their own apps run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

URL = "/v2/nvcf/helm/validate"
BASE = "inference-ok"
INGRESS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "Ingress",
    "metadata": {"name": "public"},
    "spec": {"rules": []},
}


def body(url: str, **changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "helmChart": url,
        "helmChartServiceName": "entrypoint",
        "inferencePort": 8000,
    }
    out.update(changes)
    return out


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def permissive(registry: RegistryServer, directory: Path) -> dict[str, Any]:
    """Settings of a server whose catalog permits every policy (the permission rules have own
    tests)."""
    host = registry.host
    return {
        "registry_allowlist": host,
        "insecure_registries": host,
        "clusters_file": write_catalog(directory, PERMISSIVE),
    }


@pytest.fixture(scope="module")
def module_settings(
    anon_registry: RegistryServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return permissive(anon_registry, tmp_path_factory.mktemp("catalog"))


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


@pytest.fixture
async def own_client(
    client_factory: ClientFactory, anon_registry: RegistryServer, tmp_path: Path
) -> AppClient:
    return await client_factory(**permissive(anon_registry, tmp_path))


async def dry_run(client: AppClient, payload: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(URL, json=payload)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def test_passing_chart_and_configuration_changes_the_render(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    default = await dry_run(client, body(chart.file_url))
    assert default["valid"] is True and default["chartDigest"] == chart.digest
    assert default["errors"] == [] and default["warnings"] == []
    assert [(f["rule"], f["severity"]) for f in default["info"]] == [("modified", "info")]
    assert default["workloadConfig"] == {}
    objects = by_kind(default["objects"])
    assert sorted(objects) == [
        "ConfigMap/mini-service-extras",
        "Deployment/mini-service-inference",
        "Service/entrypoint",
    ]
    assert objects["ConfigMap/mini-service-extras"]["data"]["namespace"] == PLACEHOLDER_NAMESPACE

    configuration = {
        "replicaCount": 3,
        "image": {"tag": "2.0"},
        "workloadConfig": {"featureFlags": {"StatusByWorkerReadiness": True}},
    }
    changed = await dry_run(client, body(chart.ref_url, configuration=configuration))
    assert changed["valid"] is True and changed["chartDigest"] == chart.digest
    assert changed["objects"] != default["objects"]
    deployment = by_kind(changed["objects"])["Deployment/mini-service-inference"]
    assert deployment["spec"]["replicas"] == 3
    # Helm coalescing: maps deep-merge, so the repository survives an override of the tag
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "nvcr.io/nvidia/inference-test:2.0"
    # the workload ConfigMap is consumed, never returned as an object
    assert changed["workloadConfig"] == {"StatusByWorkerReadiness": True}
    assert "ConfigMap/nvcf-workload-config" not in by_kind(changed["objects"])
    # nothing was stored
    assert (await client.get("/v2/nvcf/functions")).json()["functions"] == []


async def test_override_introducing_a_forbidden_object_is_caught(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    result = await dry_run(client, body(chart.file_url, configuration={"extraObjects": [INGRESS]}))
    assert result["valid"] is False
    assert [(e["rule"], e["field"]) for e in result["errors"]] == [("kind-not-allowed", "kind")]
    assert "networking.k8s.io/v1.Ingress" in result["errors"][0]["message"]

    # the policy's extra types allow it (group, version and kind matched exactly)
    policy = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }
    allowed = await dry_run(
        client,
        body(
            chart.file_url,
            configuration={"extraObjects": [INGRESS]},
            helmValidationPolicy=policy,
        ),
    )
    assert allowed["valid"] is True, allowed["errors"]
    assert "Ingress/public" in by_kind(allowed["objects"])


HOST_PATH_VOLUME = {
    "apiVersion": "v1",
    "kind": "PersistentVolume",
    "metadata": {"name": "host"},
    "spec": {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "hostPath": {"path": "/"},
    },
}


async def test_helm_validation_policy_is_parsed_as_strictly_as_nvcf(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    configuration = {"extraObjects": [HOST_PATH_VOLUME]}
    resp = await client.post(
        URL,
        json=body(
            chart.file_url,
            configuration=configuration,
            helmValidationPolicy={
                "name": "default",
                "extraKubernetesTypes": [
                    {"group": "", "version": "v1", "kind": "PersistentVolume"},
                    {"version": "v1", "kind": "Namespace"},
                    {"group": "apps", "version": "", "kind": ""},
                ],
            },
        ),
    )
    assert resp.status_code == 400, resp.text
    problem = resp.json()
    assert resp.headers["content-type"].startswith("application/problem+json")
    p = "helmValidationPolicy"
    assert [e["field"] for e in problem["errors"]] == [
        f"{p}.name",
        f"{p}.extraKubernetesTypes[0].group",
        f"{p}.extraKubernetesTypes[1].group",
        f"{p}.extraKubernetesTypes[2].version",
        f"{p}.extraKubernetesTypes[2].kind",
    ]
    assert "case-sensitive" in problem["errors"][0]["message"]
    assert "core-group kinds" in problem["errors"][1]["message"]
    for name in ("unrestricted", "DEFAULT", None, 1):
        policy: dict[str, Any] = {} if name is None else {"name": name}
        resp = await client.post(URL, json=body(chart.file_url, helmValidationPolicy=policy))
        assert resp.status_code == 400, (name, resp.text)
        assert [e["field"] for e in resp.json()["errors"]] == [f"{p}.name"], name

    # `core` is accepted (a named group) but is not the empty core group: the hostPath
    # PersistentVolume stays refused
    core = {
        "name": "Default",
        "extraKubernetesTypes": [{"group": "core", "version": "v1", "kind": "PersistentVolume"}],
    }
    result = await dry_run(
        client, body(chart.file_url, configuration=configuration, helmValidationPolicy=core)
    )
    assert result["valid"] is False
    assert [e["rule"] for e in result["errors"]] == ["kind-not-allowed"]
    assert "v1.PersistentVolume" in result["errors"][0]["message"]


LEADER_WORKER_SET = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "inference"},
    "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}},
}


async def test_operator_managed_extra_types_make_a_missing_service_a_warning(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    """The operator of an extra type (here LeaderWorkerSet) creates the inference Service, so
    the chart need not render it (as in NVCF)."""
    chart = push_corpus(anon_registry, BASE)
    configuration = {"service": {"name": "other"}, "extraObjects": [LEADER_WORKER_SET]}
    refused = await dry_run(client, body(chart.file_url, configuration=configuration))
    assert [(e["rule"], e["severity"]) for e in refused["errors"]] == [
        ("kind-not-allowed", "error"),
        ("service-not-found", "error"),
    ]
    policy = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "leaderworkerset.x-k8s.io", "version": "v1", "kind": "LeaderWorkerSet"}
        ],
    }
    allowed = await dry_run(
        client, body(chart.file_url, configuration=configuration, helmValidationPolicy=policy)
    )
    assert allowed["valid"] is True and allowed["errors"] == []
    [warning] = allowed["warnings"]
    assert (warning["rule"], warning["severity"]) == ("service-not-found", "warning")
    assert "operator-managed" in warning["message"]
    assert "LeaderWorkerSet/inference" in by_kind(allowed["objects"])
    # two Services named like the inference Service stay an error
    twin = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "entrypoint"},
        "spec": {"ports": [{"port": 8000}]},
    }
    doubled = await dry_run(
        client,
        body(chart.file_url, configuration={"extraObjects": [twin]}, helmValidationPolicy=policy),
    )
    assert [(e["rule"], e["object"]) for e in doubled["errors"]] == [
        ("service-duplicate", "v1/Service/entrypoint")
    ]


async def test_render_errors_and_failing_charts_are_valid_false(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    failed = await dry_run(client, body(chart.file_url, configuration={"boom": True}))
    assert failed["valid"] is False and failed["objects"] == []
    [error] = failed["errors"]
    assert error["rule"] == "render-error"
    assert "inference-test/templates/checks.yaml:2:4" in error["message"]
    assert "boom was requested" in error["message"]

    wrong_port = await dry_run(client, body(chart.file_url, inferencePort=9000))
    assert [(e["rule"], e["object"]) for e in wrong_port["errors"]] == [
        ("service-port", "v1/Service/entrypoint")
    ]
    security = push_corpus(anon_registry, "security")
    relaxed = await dry_run(client, body(security.file_url))
    assert relaxed["valid"] is True and relaxed["warnings"]
    unrestricted = await dry_run(
        client, body(security.file_url, helmValidationPolicy={"name": "Unrestricted"})
    )
    assert unrestricted["valid"] is True and unrestricted["warnings"] == []


async def test_cluster_gives_the_install_time_objects(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    namespace = f"sr-{PLACEHOLDER_INSTANCE_ID}"
    result = await dry_run(
        client,
        body(
            chart.file_url,
            cluster="sim-onprem",
            instanceType="ON-PREM.GPU.B200_8x.x2",
            configuration={"gpus": 8},
        ),
    )
    assert result["valid"] is True, result["errors"]
    objects = by_kind(result["objects"])
    # the NVLink-optimised cluster adds its ComputeDomain
    assert "ComputeDomain/nvcf-cd-index-0" in objects
    extras = objects["ConfigMap/mini-service-extras"]
    assert extras["metadata"]["namespace"] == namespace
    # rendered for the instance namespace and the cluster's kube version
    assert extras["data"]["namespace"] == namespace
    assert extras["data"]["kubeVersion"] == "v1.30.0"
    pod = objects["Deployment/mini-service-inference"]["spec"]["template"]
    assert pod["metadata"]["labels"][LABEL_INSTANCE_ID] == PLACEHOLDER_INSTANCE_ID
    assert NVLINK_PARTITION_LABEL in pod["metadata"]["labels"]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["NVCF_INSTANCETYPE"] == "ON-PREM.GPU.B200_8x.x2"
    assert env["NVCF_BACKEND"] == "nvcf-default"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert {
        "key": "nvca.nvcf.nvidia.io/instance-type",
        "operator": "In",
        "values": ["ON-PREM.GPU.B200"],
    } in terms["nodeSelectorTerms"][0]["matchExpressions"]
    # the version's secrets: a Secret of an empty secrets.json (never values in a dry-run),
    # mounted read-only at /var/secrets in every container
    assert objects["Secret/nvcf-secrets"]["data"] == {"secrets.json": "e30="}  # "{}"
    assert {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}} in pod["spec"][
        "volumes"
    ]
    for container in pod["spec"]["containers"]:
        assert {"name": "nvcf-secrets", "mountPath": "/var/secrets", "readOnly": True} in (
            container["volumeMounts"]
        )

    # multi-node: a GPU pod not taking a whole node is an error on an NVLink cluster
    partial = await dry_run(
        client,
        body(
            chart.file_url,
            cluster="sim-onprem",
            instanceType="ON-PREM.GPU.B200_8x.x2",
            configuration={"gpus": 2},
        ),
    )
    assert [e["rule"] for e in partial["errors"]] == ["multi-node-full-node"]


async def test_bad_requests_list_every_violation_without_network(client: AppClient) -> None:
    resp = await client.post(
        URL,
        json={
            "helmChart": "oci://127.0.0.1:9/acme/inference-test-v1-test.tgz",
            "helmChartServiceName": "Entry_Point",
            "inferencePort": 0,
            "configuration": [1, 2],
            "helmValidationPolicy": {"name": "Lenient", "extraKubernetesTypes": "Ingress"},
            "instanceType": "H100",
            "cluster": "no-such-cluster",
        },
    )
    assert resp.status_code == 400, resp.text
    fields = [e["field"] for e in resp.json()["errors"]]
    assert fields == [
        "helmChart",
        "helmChartServiceName",
        "inferencePort",
        "configuration",
        "helmValidationPolicy.name",
        "helmValidationPolicy.extraKubernetesTypes",
        "instanceType",
        "cluster",
    ]
    resp = await client.post(
        URL,
        json={
            "helmValidationPolicy": {"extraKubernetesTypes": [{"group": "x"}, "Ingress"]},
        },
    )
    assert resp.status_code == 400, resp.text
    assert [e["field"] for e in resp.json()["errors"]] == [
        "helmChart",
        "helmChartServiceName",
        "inferencePort",
        "helmValidationPolicy.name",  # required, as in NVCF
        "helmValidationPolicy.extraKubernetesTypes[0].version",
        "helmValidationPolicy.extraKubernetesTypes[0].kind",
        "helmValidationPolicy.extraKubernetesTypes[1]",
    ]
    resp = await client.post(
        URL,
        json=body(
            "oci://127.0.0.1:9/acme/inference-test-1.0.0.tgz",
            cluster="sim-dgxc",
            instanceType="NCP.GPU.H100_1x",
        ),
    )
    assert resp.status_code == 400, resp.text
    # resolved as a deployment specification's target (the older `cluster` keeps its name)
    [error] = resp.json()["errors"]
    assert error["field"] == "cluster"
    assert error["message"] == (
        "none of the clusters sim-dgxc offers NCP.GPU.H100_1x; it is offered by: sim-ncp"
    )


@own_app
async def test_registry_failures_have_the_creation_codes(
    client_factory: ClientFactory, own_client: AppClient, start_extra_registry: Any
) -> None:
    server: RegistryServer = start_extra_registry()
    host = server.host
    missing = f"oci://{host}/acme/absent-1.0.0.tgz"
    stopped = await client_factory(registry_allowlist=host, insecure_registries=host)
    resp = await stopped.post(URL, json=body(missing))
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"] == (
        f"chart {missing} not found: registry {host} has no repository 'acme/absent'"
    )
    server.stop()
    resp = await stopped.post(URL, json=body(missing))
    assert resp.status_code == 502, resp.text
    # not allow-listed: the SSRF guard refuses the loopback host
    resp = await own_client.post(URL, json=body(missing))
    assert resp.status_code == 400, resp.text
    assert "NVCF_REGISTRY_ALLOWLIST" in resp.json()["detail"]


@own_app
async def test_registry_messages_say_what_to_do(
    client_factory: ClientFactory,
    own_client: AppClient,
    anon_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    # Helm reads an unquoted `version: 1.0` as the number 1: the chart is pushed as tag 1
    archive = flat_chart(
        tmp_path, None, {"Chart.yaml": "apiVersion: v2\nname: unquoted\nversion: 1.0\n"}
    )
    chart = push_archive(anon_registry, archive, "versions", workdir=tmp_path / "push")
    assert chart.version == "1"
    url = f"oci://{anon_registry.host}/versions/unquoted:1.0"
    resp = await own_client.post(URL, json=body(url))
    assert resp.status_code == 400, resp.text
    problem = resp.json()
    assert problem["detail"].startswith(f"chart {url} not found: ")
    [error] = problem["errors"]
    assert error["field"] == "helmChart"
    assert error["message"].startswith(
        f"registry {anon_registry.host} has no tag or digest '1.0' in repository "
        "'versions/unquoted'; its tags are: 1; note that Helm reads an unquoted "
        "`version: 1.0` in Chart.yaml as the number 1"
    )
    assert (await dry_run(own_client, body(chart.ref_url)))["valid"] is True

    # a plain-HTTP registry not listed as insecure: reached over TLS, it answers in plain text
    tls = await client_factory(registry_allowlist=anon_registry.host)
    resp = await tls.post(URL, json=body(chart.ref_url))
    assert resp.status_code == 502, resp.text
    detail = resp.json()["detail"]
    assert "seems to speak plain HTTP" in detail and "NVCF_INSECURE_REGISTRIES" in detail
    assert "WRONG_VERSION_NUMBER" not in detail


async def test_scope_register_function_is_required(client: AppClient) -> None:
    key = await new_key(client, [scopes.LIST_FUNCTIONS])
    resp = await client.post(
        URL, json=body("oci://127.0.0.1:9/acme/x-1.0.0.tgz"), headers=bearer(key)
    )
    assert resp.status_code == 403, resp.text
    assert "register_function" in resp.json()["detail"]
    org = await client.post(
        "/v2/orgs/nvcf-default/nvcf/helm/validate",
        json={"helmChart": "nope"},
    )
    assert org.status_code == 400, org.text


async def test_charts_are_ordered_like_helm_with_or_without_the_engine_path(
    client: AppClient, anon_registry: RegistryServer, tmp_path: Path
) -> None:
    """A chart takes the engine path (test_engine_render) unless a document could read
    differently in Helm; here a `Kind:` key, which Go's JSON decoder would read as `kind`,
    sends it through Helm's install action. Both answer in Helm's order and leave the test
    hook out."""
    files: dict[str, str | None] = {
        "templates/a-config.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1}\n---\n"
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s1}\n"
        ),
        "templates/tests/test.yaml": HOOK.format(name="check", events="test"),
        "templates/z-sa.yaml": "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa}\n",
    }
    doubled = "apiVersion: v1\nkind: ConfigMap\nKind: ConfigMap\nmetadata: {name: c2}\n"
    head = [("ServiceAccount", "sa"), ("Secret", "s1"), ("ConfigMap", "c1")]
    tail = [("Service", "entrypoint"), ("Deployment", "mini-service-inference")]
    cases: list[tuple[str, dict[str, str], list[tuple[str, str]]]] = [
        ("engine", {}, [*head, *tail]),
        (
            "fallback",
            {"templates/b-doubled.yaml": doubled},
            [*head, ("ConfigMap", "c2"), *tail],
        ),
    ]
    for name, extra, expected in cases:
        workdir = tmp_path / name
        archive = flat_chart(workdir, None, {**files, **extra})
        chart = push_archive(anon_registry, archive, f"flat-{name}", workdir=workdir / "push")
        for _ in range(2):  # the second answer comes from the pipeline's cache
            result = await dry_run(client, body(chart.file_url, configuration={"replicaCount": 2}))
            assert result["valid"] is True, result["errors"]
            kinds = [(o["kind"], o["metadata"]["name"]) for o in result["objects"]]
            assert kinds == expected, name
            assert result["hooksSkipped"] == ["batch/v1/Job/check"], name
            assert [w["rule"] for w in result["warnings"]] == ["hook-skipped"], name
            deployment = by_kind(result["objects"])["Deployment/mini-service-inference"]
            assert deployment["spec"]["replicas"] == 2

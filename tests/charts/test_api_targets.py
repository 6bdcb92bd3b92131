"""Charts checked for their target through the API (helm.md §2, §3, §6): the Kubernetes schema
of the target's version, Helm's capabilities of the target cluster, the policy the cluster
permits, and the dry-run's deployment-specification target fields.

The tests on `client` share one app per database (the built-in catalog, the anonymous registry
allow-listed), each in an account of its own; those needing a catalog build their own."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from service.charts.mutate import NVLINK_INDEX_ANNOTATION
from tests.support.app import AppClient, ClientFactory
from tests.support.catalogs import PERMISSIVE, write_catalog
from tests.support.charts import PushCorpus
from tests.support.registry import RegistryServer

pytestmark = [pytest.mark.registry, pytest.mark.asyncio(loop_scope="module")]
# the tests that build their own apps run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

URL = "/v2/nvcf/helm/validate"
BASE = "inference-ok"
INGRESS = """apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
spec:
  defaultBackend:
    service:
      name: entrypoint
      port:
        number: 8000
"""

_names = itertools.count()

CAPS = """apiVersion: v1
kind: ConfigMap
metadata:
  name: caps
data:
  kube: {{ .Capabilities.KubeVersion.Version | quote }}
  monitoring: {{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" | quote }}
  deploymentKind: {{ .Capabilities.APIVersions.Has "apps/v1/Deployment" | quote }}
"""
Y_POD = """apiVersion: v1
kind: Pod
metadata:
  name: sidecar
spec:
  hostNetwork: y
  containers:
    - name: sidecar
      image: busybox
"""
HPA = {
    "apiVersion": "autoscaling/v2beta2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {"name": "scale"},
    "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 2},
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


def rules(findings: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    return [(f["rule"], f.get("object"), f.get("field")) for f in findings]


@pytest.fixture(scope="module")
def module_settings(anon_registry: RegistryServer) -> dict[str, Any]:
    return {"registry_allowlist": anon_registry.host, "insecure_registries": anon_registry.host}


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


async def server(
    client_factory: ClientFactory, registry: RegistryServer, catalog: Path | None = None
) -> AppClient:
    host = registry.host
    return await client_factory(
        registry_allowlist=host, insecure_registries=host, clusters_file=catalog
    )


async def dry_run(client: AppClient, payload: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(URL, json=payload)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def refused(client: AppClient, payload: dict[str, Any]) -> dict[str, str]:
    resp = await client.post(URL, json=payload)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return {e["field"]: e["message"] for e in resp.json()["errors"]}


# --- 9: the Kubernetes schema ---------------------------------------------------------------


async def test_wrongly_typed_fields_are_errors_naming_object_and_path(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    extra = {"hostNetwork": "true", "terminationGracePeriodSeconds": "two"}
    result = await dry_run(client, body(chart.file_url, configuration={"podSpecExtra": extra}))
    assert result["valid"] is False
    deployment = "apps/v1/Deployment/mini-service-inference"
    assert rules(result["errors"]) == [
        ("schema-invalid", deployment, "spec.template.spec.hostNetwork"),
        ("schema-invalid", deployment, "spec.template.spec.terminationGracePeriodSeconds"),
    ]
    assert result["errors"][1]["message"] == (
        "Deployment/mini-service-inference: spec.template.spec.terminationGracePeriodSeconds "
        'must be an integer, not the string "two" (Kubernetes 1.30 schema)'
    )
    assert "must be a boolean, not the string" in result["errors"][0]["message"]


async def test_function_creation_refuses_a_yaml_1_1_y_string(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(
        anon_registry, BASE, namespace=f"y/{next(_names)}", files={"templates/pod.yaml": Y_POD}
    )
    resp = await client.post(
        "/v2/nvcf/functions",
        json={
            "name": "y-string",
            "inferenceUrl": "/infer",
            "inferencePort": 8000,
            "helmChart": chart.file_url,
            "helmChartServiceName": "entrypoint",
        },
    )
    assert resp.status_code == 400, resp.text
    [error] = [e for e in resp.json()["errors"] if e["rule"] == "schema-invalid"]
    assert (error["field"], error["object"], error["path"]) == (
        "helmChart",
        "v1/Pod/sidecar",
        "spec.hostNetwork",
    )
    assert 'Pod/sidecar: spec.hostNetwork must be a boolean, not the string "y"' in error["message"]
    assert (await client.get("/v2/nvcf/functions")).json()["functions"] == []


@own_app
async def test_the_target_clusters_version_decides_what_is_served(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    catalog = write_catalog(
        tmp_path,
        PERMISSIVE,
        sim_dgxc={"k8sVersion": "1.25.4"},
        sim_ncp={"k8sVersion": "1.24.0"},
    )
    client = await server(client_factory, anon_registry, catalog)
    chart = push_corpus(anon_registry, BASE)
    unrestricted = {"name": "Unrestricted"}
    config = {"extraObjects": [HPA]}
    old = await dry_run(
        client,
        body(
            chart.file_url,
            configuration=config,
            helmValidationPolicy=unrestricted,
            clusters=["sim-dgxc"],
        ),
    )
    assert old["valid"] is True, old["errors"]
    assert old["kubeVersions"] == ["1.25.4"]
    new = await dry_run(
        client,
        body(
            chart.file_url,
            configuration=config,
            helmValidationPolicy=unrestricted,
            clusters=["sim-onprem"],
        ),
    )
    assert rules(new["errors"]) == [
        (
            "api-version-unsupported",
            "autoscaling/v2beta2/HorizontalPodAutoscaler/scale",
            "apiVersion",
        )
    ]
    # 1.24 has no bundled schema: the nearest one checks, and an info says so
    nearest = await dry_run(client, body(chart.file_url, clusters=["sim-ncp"]))
    [note] = [f for f in nearest["info"] if f["rule"] == "schema-version"]
    assert "validated against Kubernetes 1.25, the nearest" in note["message"]


# --- 10: Helm's capabilities ------------------------------------------------------------------


@own_app
async def test_helm_renders_with_the_target_clusters_capabilities(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    declared = ["v1", "apps/v1", "apps/v1/Deployment", "monitoring.coreos.com/v1"]
    catalog = write_catalog(tmp_path, sim_dgxc={"k8sVersion": "1.28.3", "apiVersions": declared})
    client = await server(client_factory, anon_registry, catalog)
    chart = push_corpus(
        anon_registry, BASE, namespace=f"caps/{next(_names)}", files={"templates/caps.yaml": CAPS}
    )
    cluster = await dry_run(client, body(chart.file_url, clusters=["sim-dgxc"]))
    caps = by_kind(cluster["objects"])["ConfigMap/caps"]["data"]
    assert caps == {"kube": "v1.28.3", "monitoring": "true", "deploymentKind": "true"}
    # without a target: the default version and its standard API versions
    default = await dry_run(client, body(chart.file_url))
    caps = by_kind(default["objects"])["ConfigMap/caps"]["data"]
    assert caps == {"kube": "v1.30.0", "monitoring": "false", "deploymentKind": "true"}
    # a cluster without apiVersions: the standard set of its version
    onprem = await dry_run(client, body(chart.file_url, cluster="sim-onprem"))
    assert by_kind(onprem["objects"])["ConfigMap/caps"]["data"]["monitoring"] == "false"


# --- 11: the policy the clusters permit -------------------------------------------------------


@own_app
async def test_dry_run_policy_must_be_permitted_by_the_target(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    catalog = write_catalog(
        tmp_path, sim_onprem={"helmValidation": {"allowedPolicies": ["Default", "Unrestricted"]}}
    )
    client = await server(client_factory, anon_registry, catalog)
    chart = push_corpus(anon_registry, BASE)
    unrestricted = {"name": "Unrestricted"}
    errors = await refused(
        client, body(chart.file_url, helmValidationPolicy=unrestricted, clusters=["sim-dgxc"])
    )
    assert list(errors) == ["helmValidationPolicy"]
    assert "sim-dgxc: Default only, no extra types" in errors["helmValidationPolicy"]
    ingress = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }
    errors = await refused(
        client,
        body(chart.file_url, helmValidationPolicy=ingress, backend="nvcf-default", gpu="L40S"),
    )
    assert "Default with extra types networking.k8s.io/v1.Ingress" in errors["helmValidationPolicy"]
    # permitted by the target, and without a target by some cluster of the catalog
    ok = await dry_run(
        client, body(chart.file_url, helmValidationPolicy=unrestricted, clusters=["sim-onprem"])
    )
    assert ok["valid"] is True and ok["targetClusters"] == ["sim-onprem"]
    anywhere = await dry_run(client, body(chart.file_url, helmValidationPolicy=unrestricted))
    assert anywhere["valid"] is True and "targetClusters" not in anywhere
    # a group's candidates are narrowed to those permitting it
    group = await dry_run(
        client, body(chart.file_url, helmValidationPolicy=unrestricted, backend="nvcf-default")
    )
    assert group["targetClusters"] == ["sim-onprem"]
    # nobody permits it
    strict = await server(client_factory, anon_registry)
    errors = await refused(strict, body(chart.file_url, helmValidationPolicy=unrestricted))
    assert "sim-ncp: Default only" in errors["helmValidationPolicy"]
    assert "sim-onprem: Default only" in errors["helmValidationPolicy"]


# --- 12: the dry-run's target ------------------------------------------------------------------


async def test_dry_run_targets_like_a_deployment_specification(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    # gpu and instanceType resolve as a deploy's: multi-node full-node on an NVLink cluster
    partial = await dry_run(
        client,
        body(
            chart.file_url,
            gpu="B200",
            instanceType="ON-PREM.GPU.B200_8x.x2",
            configuration={"gpus": 2},
        ),
    )
    assert partial["targetClusters"] == ["sim-onprem"]
    assert [e["rule"] for e in partial["errors"]] == ["multi-node-full-node"]
    assert [c["check"] for c in partial["checksNotApplied"]] == []
    whole = await dry_run(
        client,
        body(
            chart.file_url,
            gpu="b200",
            instanceType="ON-PREM.GPU.B200_8x.x2",
            configuration={"gpus": 8},
        ),
    )
    assert whole["valid"] is True and "ComputeDomain/nvcf-cd-index-0" in by_kind(whole["objects"])
    # the GPU's default instance type of the group
    default_type = await dry_run(client, body(chart.file_url, gpu="L40S", backend="nvcf-default"))
    assert default_type["targetClusters"] == ["sim-dgxc"]
    env = {
        e["name"]: e["value"]
        for e in by_kind(default_type["objects"])["Deployment/mini-service-inference"]["spec"][
            "template"
        ]["spec"]["containers"][0]["env"]
    }
    assert env["NVCF_INSTANCETYPE"] == "DGXC.GPU.L40S_1x"
    # clusters alone: no instance type, so no multi-node checks
    named = await dry_run(client, body(chart.file_url, clusters=["sim-onprem", "sim-dgxc"]))
    assert named["targetClusters"] == ["sim-onprem", "sim-dgxc"]
    assert [c["check"] for c in named["checksNotApplied"]] == ["multi-node-full-node"]
    # no target: the checks it could not apply
    bare = await dry_run(client, body(chart.file_url))
    assert [c["check"] for c in bare["checksNotApplied"]] == [
        "capabilities",
        "schema",
        "cluster-policy",
        "nvlink",
        "install-preview",
        "multi-node-full-node",
    ]
    assert bare["kubeVersions"] == ["1.30.0"]


async def test_dry_run_target_problems_are_one_400(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    errors = await refused(client, body(chart.file_url, gpu="A100", instanceType="NCP.GPU.H100_1x"))
    assert set(errors) == {"gpu", "instanceType"}  # as a deploy reports them
    errors = await refused(client, body(chart.file_url, gpu="Z9", backend="nope"))
    assert set(errors) == {"backend"}
    errors = await refused(
        client, body(chart.file_url, backend="nvcf-default", clusters=["sim-ncp", "ghost"])
    )
    assert set(errors) == {"backend", "clusters[1]"}
    errors = await refused(
        client, body(chart.file_url, regions=["us-east-1"], cluster="x", clusters=["y"])
    )
    assert set(errors) == {"cluster"}
    errors = await refused(client, body(chart.file_url, regions=["us-east-1"]))
    assert errors == {"regions": "narrows the clusters offering a GPU: give gpu or instanceType"}
    errors = await refused(
        client, body(chart.file_url, gpu="L40S", regions=["mars-1"], inferencePort=0)
    )
    assert set(errors) == {"inferencePort", "regions"}


def _annotated(on_template: bool) -> dict[str, Any]:
    labels = {"app": "worker"}
    meta: dict[str, Any] = {"labels": labels}
    if on_template:
        meta["annotations"] = {NVLINK_INDEX_ANNOTATION: "0"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "worker",
            **({} if on_template else {"annotations": {NVLINK_INDEX_ANNOTATION: "0"}}),
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": meta,
                "spec": {"containers": [{"name": "worker", "image": "busybox"}]},
            },
        },
    }


async def test_nvlink_annotation_warnings_say_what_will_happen(
    client: AppClient, anon_registry: RegistryServer, push_corpus: PushCorpus
) -> None:
    chart = push_corpus(anon_registry, BASE)
    on_controller = {"extraObjects": [_annotated(on_template=False)]}
    on_template = {"extraObjects": [_annotated(on_template=True)]}
    annotation = f"metadata.annotations.{NVLINK_INDEX_ANNOTATION}"

    nvlink = await dry_run(
        client, body(chart.file_url, cluster="sim-onprem", configuration=on_controller)
    )
    [ignored] = [w for w in nvlink["warnings"] if w["rule"].startswith("nvlink")]
    assert (ignored["rule"], ignored["object"], ignored["field"]) == (
        "nvlink-annotation-ignored",
        "apps/v1/Deployment/worker",
        annotation,
    )
    assert "preferred (not a required) pod affinity" in ignored["message"]
    # the install preview does what the warning says: a preferred term only
    pod = by_kind(nvlink["objects"])["Deployment/worker"]["spec"]["template"]["spec"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAffinity"]

    plain = await dry_run(
        client, body(chart.file_url, cluster="sim-dgxc", configuration=on_controller)
    )
    assert [w["rule"] for w in plain["warnings"] if w["rule"].startswith("nvlink")] == [
        "nvlink-annotation-ignored",
        "nvlink-annotation-unused",
    ]
    template = await dry_run(
        client, body(chart.file_url, cluster="sim-dgxc", configuration=on_template)
    )
    [unused] = [w for w in template["warnings"] if w["rule"].startswith("nvlink")]
    assert unused["rule"] == "nvlink-annotation-unused"
    assert unused["field"] == f"spec.template.{annotation}"
    assert "sim-dgxc does not have the NVLinkOptimized attribute" in unused["message"]
    # on the pod template of an NVLink cluster: no warning, a required affinity
    fine = await dry_run(
        client, body(chart.file_url, cluster="sim-onprem", configuration=on_template)
    )
    assert [w for w in fine["warnings"] if w["rule"].startswith("nvlink")] == []


@own_app
async def test_function_creation_policy_must_be_permitted_somewhere(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    chart = push_corpus(
        anon_registry,
        BASE,
        namespace=f"kinds/{next(_names)}",
        files={"templates/ing.yaml": INGRESS},
    )
    kinds = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }

    def create(**changes: Any) -> dict[str, Any]:
        return {
            "name": f"kinds-{next(_names)}",
            "inferenceUrl": "/infer",
            "inferencePort": 8000,
            "helmChart": chart.file_url,
            "helmChartServiceName": "entrypoint",
            **changes,
        }

    strict = await server(client_factory, anon_registry)
    resp = await strict.post("/v2/nvcf/functions", json=create())
    assert resp.status_code == 400, resp.text
    assert [e["rule"] for e in resp.json()["errors"]] == ["kind-not-allowed"]
    resp = await strict.post("/v2/nvcf/functions", json=create(helmValidationPolicy=kinds))
    assert resp.status_code == 400, resp.text
    [error] = resp.json()["errors"]
    assert error["field"] == "helmValidationPolicy"
    assert "sim-ncp: Default only, no extra types" in error["message"]
    resp = await strict.post(
        "/v2/nvcf/functions",
        json={**create(helmValidationPolicy=kinds), "helmChart": None, "containerImage": "x/y:1"},
    )
    assert resp.status_code == 400, resp.text
    assert "helmValidationPolicy" in [e["field"] for e in resp.json()["errors"]]

    catalog = write_catalog(
        tmp_path, sim_dgxc={"helmValidation": {"allowedExtraTypes": kinds["extraKubernetesTypes"]}}
    )
    permitting = await server(client_factory, anon_registry, catalog)
    resp = await permitting.post("/v2/nvcf/functions", json=create(helmValidationPolicy=kinds))
    assert resp.status_code == 200, resp.text
    assert "helmValidationPolicy" not in resp.json()["function"]


@own_app
async def test_candidates_rendering_differently_are_named(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    catalog = write_catalog(tmp_path, sim_dgxc={"k8sVersion": "1.28.3"})
    client = await server(client_factory, anon_registry, catalog)
    chart = push_corpus(
        anon_registry, BASE, namespace=f"caps/{next(_names)}", files={"templates/caps.yaml": CAPS}
    )
    result = await dry_run(client, body(chart.file_url, clusters=["sim-dgxc", "sim-onprem"]))
    assert result["kubeVersions"] == ["1.28.3", "1.30.0"]
    [differs] = [w for w in result["warnings"] if w["rule"] == "render-differs"]
    assert differs["message"] == (
        "the chart renders different objects for sim-onprem (Kubernetes 1.30.0) than for "
        "sim-dgxc (Kubernetes 1.28.3); instances install the objects rendered for sim-dgxc"
    )
    caps = by_kind(result["objects"])["ConfigMap/caps"]["data"]
    assert caps["kube"] == "v1.28.3"

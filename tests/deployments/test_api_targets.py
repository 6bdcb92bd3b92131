"""Deploying helm functions for their target clusters (api.md §3, helm.md §2–§3): the schema
and capabilities of every candidate cluster, and the helmValidationPolicy the clusters permit
(the operator's decision) at deploy, at scale-up and in the candidates stored for placement."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.clusters.catalog import Catalog
from service.deployments.models import Deployment
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory, without_reconciler
from tests.support.catalogs import catalog_data, write_catalog
from tests.support.charts import PushCorpus
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry

V = "/v2/nvcf"
_names = itertools.count()
UNRESTRICTED = {"name": "Unrestricted"}
CAPS = """apiVersion: v1
kind: ConfigMap
metadata:
  name: caps
data:
  kube: {{ .Capabilities.KubeVersion.Version | quote }}
  monitoring: {{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" | quote }}
"""
HPA = {
    "apiVersion": "autoscaling/v2beta2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {"name": "scale"},
    "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 2},
}
#: sim-ncp turned into a second L40S cluster of the DGXC provider (Kubernetes 1.25), so that
#: DGXC.GPU.L40S_1x has two candidates: sim-ncp and sim-dgxc (1.30)
TWO_L40S = {
    "provider": "DGXC",
    "k8sVersion": "1.25.0",
    "nodes": [{"gpu": "L40S", "gpusPerNode": 1, "count": 2}],
}


def dep_url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


def spec(**changes: Any) -> dict[str, Any]:
    return {"gpu": "L40S", "minInstances": 1, "maxInstances": 1, **changes}


async def setup(
    client_factory: ClientFactory,
    registry: RegistryServer,
    push: PushCorpus,
    catalog: Path | None = None,
    files: dict[str, str] | None = None,
) -> tuple[AppClient, dict[str, Any]]:
    client = await client_factory(
        reconcile_interval=3600,
        registry_allowlist=registry.host,
        insecure_registries=registry.host,
        clusters_file=catalog,
    )
    await without_reconciler(client)
    chart = push(registry, "inference-ok", namespace=f"targets/{next(_names)}", files=files)
    fn = await create_fn(
        client,
        name=f"helm-{next(_names)}",
        inferenceUrl="/v2/models/m/infer",
        inferencePort=8000,
        containerImage=None,
        helmChart=chart.file_url,
        helmChartServiceName="entrypoint",
    )
    return client, fn


async def stored(client: AppClient, version_id: str) -> list[Deployment]:
    async with client.app.state.sessionmaker() as session:
        stmt = select(Deployment).where(Deployment.version_id == uuid.UUID(version_id))
        return list((await session.execute(stmt)).scalars().all())


async def refused(client: AppClient, fn: dict[str, Any], *specs: dict[str, Any]) -> list[Any]:
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": list(specs)})
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert await stored(client, fn["versionId"]) == []
    return list(resp.json()["errors"])


async def test_deploy_refuses_wrong_types_and_renders_with_the_clusters_capabilities(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    catalog = write_catalog(
        tmp_path,
        sim_dgxc={
            "k8sVersion": "1.28.3",
            "apiVersions": ["v1", "apps/v1", "monitoring.coreos.com/v1"],
        },
    )
    client, fn = await setup(
        client_factory, anon_registry, push_corpus, catalog, {"templates/caps.yaml": CAPS}
    )
    [error] = await refused(
        client, fn, spec(configuration={"podSpecExtra": {"hostNetwork": "yes"}})
    )
    assert (error["field"], error["rule"], error["object"], error["path"]) == (
        "deploymentSpecifications[0].configuration",
        "schema-invalid",
        "apps/v1/Deployment/mini-service-inference",
        "spec.template.spec.hostNetwork",
    )
    assert "(Kubernetes 1.28 schema)" in error["message"]
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [spec()]})
    assert resp.status_code == 200, resp.text
    (row,) = await stored(client, fn["versionId"])
    caps = next(o for o in row.specs[0].objects if o["metadata"]["name"] == "caps")
    assert caps["data"] == {"kube": "v1.28.3", "monitoring": "true"}


async def test_every_candidate_cluster_is_checked_and_named(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    catalog = write_catalog(
        tmp_path,
        {"allowedPolicies": ["Default", "Unrestricted"]},
        sim_ncp=TWO_L40S,
    )
    client, fn = await setup(client_factory, anon_registry, push_corpus, catalog)
    hpa = spec(configuration={"extraObjects": [HPA]}, helmValidationPolicy=UNRESTRICTED)
    [error] = await refused(client, fn, hpa)
    # served by sim-ncp's 1.25, not by sim-dgxc's 1.30: the finding names the cluster
    assert error["rule"] == "api-version-unsupported"
    assert error["message"].endswith("(on sim-dgxc (Kubernetes 1.30.0))")
    # pinned to the 1.25 cluster it deploys
    resp = await client.post(
        dep_url(fn), json={"deploymentSpecifications": [{**hpa, "clusters": ["sim-ncp"]}]}
    )
    assert resp.status_code == 200, resp.text


async def test_the_policy_must_be_permitted_by_a_candidate_cluster(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    permits = {"helmValidation": {"allowedPolicies": ["Default", "Unrestricted"]}}
    catalog = write_catalog(tmp_path, sim_ncp={**TWO_L40S, **permits})
    client, fn = await setup(client_factory, anon_registry, push_corpus, catalog)
    ingress = {
        "name": "Default",
        "extraKubernetesTypes": [
            {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
        ],
    }
    errors = await refused(
        client,
        fn,
        spec(gpu="L40", helmValidationPolicy=UNRESTRICTED),
        spec(
            gpu="B200",
            instanceType="ON-PREM.GPU.B200_8x.x2",
            helmValidationPolicy=ingress,
            configuration={"gpus": 8},
        ),
    )
    assert [(e["field"], e.get("rule")) for e in errors] == [
        ("deploymentSpecifications[0].helmValidationPolicy", None),
        ("deploymentSpecifications[1].helmValidationPolicy", None),
    ]
    assert errors[0]["message"].startswith("asks for Unrestricted, which none of the candidate")
    assert "(sim-dgxc: Default only, no extra types)" in errors[0]["message"]
    assert "networking.k8s.io/v1.Ingress" in errors[1]["message"]
    assert "sim-onprem: Default only, no extra types" in errors[1]["message"]

    # L40S: sim-ncp permits it, sim-dgxc does not; placement will only use sim-ncp
    resp = await client.post(
        dep_url(fn),
        json={
            "deploymentSpecifications": [
                spec(helmValidationPolicy=UNRESTRICTED),
            ]
        },
    )
    assert resp.status_code == 200, resp.text
    (row,) = await stored(client, fn["versionId"])
    assert row.specs[0].candidate_clusters == ["sim-ncp"]
    dep = resp.json()["deployment"]
    gpu_spec = dep["deploymentSpecifications"][0]

    # the operator takes the permission back: scaling up is refused naming the cluster,
    # scaling down is not
    client.app.state.catalog = Catalog.from_data(catalog_data(sim_ncp=TWO_L40S))
    body = {"deploymentSpecifications": [{**gpu_spec, "maxInstances": 2}]}
    resp = await client.put(dep_url(fn), json=body)
    assert resp.status_code == 400, resp.text
    [error] = resp.json()["errors"]
    assert error["field"] == "deploymentSpecifications[0].helmValidationPolicy"
    assert "sim-ncp: Default only" in error["message"]
    patch = (
        f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{gpu_spec['gpuSpecificationId']}"
    )
    resp = await client.patch(patch, json={"maxInstances": 2})
    assert resp.status_code == 400, resp.text
    assert resp.json()["errors"][0]["field"] == "helmValidationPolicy"
    body = {"deploymentSpecifications": [{**gpu_spec, "minInstances": 0}]}
    resp = await client.put(dep_url(fn), json=body)
    assert resp.status_code == 200, resp.text

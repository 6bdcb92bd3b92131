"""Cluster groups over HTTP (api.md §4), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.api import bearer, new_key
from tests.support.app import AppClient

# one app per database for the module: the tests read the catalog and make their own keys
pytestmark = pytest.mark.asyncio(loop_scope="module")

V = "/v2/nvcf"
V3 = "/v3/orgs/{org}/ngc/nvcf/deployments/available/instanceTypes"


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def _with_v3(client: AppClient) -> None:
    # Until create_app includes `v3_router` at the root, include it here (idempotent).
    from service.clusters.router import v3_router

    if not any(getattr(r, "path", None) == V3 for r in client.app.routes):
        client.app.include_router(v3_router)


def _offered(body: dict[str, Any]) -> dict[str, list[str]]:
    group = next(g for g in body["clusterGroups"] if g["name"] == "nvcf-default")
    return {g["name"]: [t["name"] for t in g["instanceTypes"]] for g in group["gpus"]}


async def test_cluster_groups_offer_every_documented_example(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{V}/clusterGroups")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    (group,) = body["clusterGroups"]
    assert group["name"] == "nvcf-default"
    assert group["ncaId"] == "nvcf-default"
    assert group["authorizedNcaIds"] == ["*"]
    offered = _offered(body)
    assert "NCP.GPU.H100_1x" in offered["H100"]
    assert "DGXC.GPU.L40S_1x" in offered["L40S"]
    assert "DGXC.GPU.L40_1x" in offered["L40"]
    assert "ON-PREM.GPU.B200_8x.x2" in offered["B200"]
    defaults = {
        g["name"]: [t["name"] for t in g["instanceTypes"] if t["default"]] for g in group["gpus"]
    }
    assert defaults["L40"] == ["DGXC.GPU.L40_1x"]
    assert defaults["H100"] == ["NCP.GPU.H100_1x"]
    clusters = {c["name"]: c for c in group["clusters"]}
    assert set(clusters) == {"sim-ncp", "sim-dgxc", "sim-onprem"}
    assert clusters["sim-onprem"]["attributes"] == ["NVLinkOptimized"]
    assert clusters["sim-ncp"]["k8sVersion"] == "1.30.0"
    assert {"id", "region"} <= set(clusters["sim-dgxc"])


async def test_cluster_groups_scopes(client: httpx.AsyncClient) -> None:
    for scope in ("list_cluster_groups", "deploy_function"):
        key = await new_key(client, [scope])
        resp = await client.get(f"{V}/clusterGroups", headers=bearer(key))
        assert resp.status_code == 200, (scope, resp.text)
    key = await new_key(client, ["list_functions"])
    resp = await client.get(f"{V}/clusterGroups", headers=bearer(key))
    assert resp.status_code == 403
    assert "list_cluster_groups" in resp.json()["detail"]


async def test_cluster_groups_org_aliases(client: httpx.AsyncClient) -> None:
    ok = await client.get("/v2/orgs/nvcf-default/nvcf/clusterGroups")
    assert ok.status_code == 200
    team = await client.get("/v2/orgs/nvcf-default/teams/t1/nvcf/clusterGroups")
    assert team.status_code == 200
    other = await client.get("/v2/orgs/someone-else/nvcf/clusterGroups")
    assert other.status_code == 403


async def test_v3_instance_types_alias(client: AppClient) -> None:
    _with_v3(client)
    resp = await client.get(V3.format(org="nvcf-default"))
    assert resp.status_code == 200, resp.text
    direct = await client.get(f"{V}/clusterGroups")
    assert resp.json() == direct.json()
    other = await client.get(V3.format(org="another-org"))
    assert other.status_code == 403
    assert other.headers["content-type"].startswith("application/problem+json")
    key = await new_key(client, ["list_cluster_groups"], account="acct-b")
    mine = await client.get(V3.format(org="acct-b"), headers=bearer(key))
    assert mine.status_code == 200
    assert mine.json()["clusterGroups"][0]["ncaId"] == "acct-b"
    unauth = await client.get(V3.format(org="nvcf-default"), headers={"Authorization": ""})
    assert unauth.status_code == 401


async def test_supported_gpus_as_nvcf_from_the_catalog(client: AppClient) -> None:
    resp = await client.get(f"{V}/supportedGpus")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert isinstance(body, list) and all(set(g) == {"gpu", "backend"} for g in body)
    groups = (await client.get(f"{V}/clusterGroups")).json()["clusterGroups"]
    assert body == [{"gpu": g["name"], "backend": cg["name"]} for cg in groups for g in cg["gpus"]]
    assert {"gpu": "L40S", "backend": "nvcf-default"} in body
    # NVCF's scope for it is register_function
    lister = bearer(await new_key(client, ["list_cluster_groups"]))
    assert (await client.get(f"{V}/supportedGpus", headers=lister)).status_code == 403
    registrar = bearer(await new_key(client, ["register_function"]))
    assert (await client.get(f"{V}/supportedGpus", headers=registrar)).json() == body

"""Per-account quotas (service/core/quotas.py) and the bounds of instance counts: each refusal
is a 400 naming the quota (or the field), and nothing is stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.core import quotas
from service.functions import service
from tests.support.api import CONTAINER_FN, create_fn
from tests.support.app import ClientFactory
from tests.support.nvcf_cli import add_request

V = "/v2/nvcf"
L40 = {"gpu": "L40", "backend": "nvcf-default", "minInstances": 0, "maxInstances": 2}


def quota_refusal(resp: httpx.Response, name: str) -> str:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["type"].endswith("quota-exceeded")
    [error] = body["errors"]
    assert error["field"] == f"quota.{name}"
    assert f"NVCF_QUOTA_{name.upper()}" in error["message"]
    return str(error["message"])


def deployment_url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def test_functions_and_versions_quotas(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_functions=2, quota_versions_per_function=2)
    first = await create_fn(client)
    await create_fn(client, name="second")
    message = quota_refusal(await client.post(f"{V}/functions", json=CONTAINER_FN), "functions")
    assert message.startswith("the account has 2 functions and may have at most 2")
    assert len((await client.get(f"{V}/functions/ids")).json()["functionIds"]) == 2

    versions = f"{V}/functions/{first['id']}/versions"
    assert (await client.post(versions, json=CONTAINER_FN)).status_code == 200
    quota_refusal(await client.post(versions, json=CONTAINER_FN), "versions_per_function")
    assert len((await client.get(versions)).json()["functions"]) == 2


async def test_functions_counted_by_the_insert_then_under_the_lock(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Far from the limit the insert counts the account's functions itself; within SLACK of it
    # the account is locked and counted again. With SLACK 1 and a limit of 3: two inserts
    # take the first way, the third the second, the fourth is refused.
    monkeypatch.setattr(quotas, "SLACK", 1)
    client = await client_factory(quota_functions=3)
    counted: list[int] = []
    original = service.count_functions

    async def count(session: Any, account_id: str) -> int:
        counted.append(n := await original(session, account_id))
        return n

    monkeypatch.setattr(service, "count_functions", count)
    for n in range(3):
        await create_fn(client, name=f"fn-{n}")
    assert counted == [2, 2]  # only the third create counted: before and under the lock
    quota_refusal(await client.post(f"{V}/functions", json=CONTAINER_FN), "functions")
    assert counted == [2, 2, 3, 3]  # the fourth: full
    assert len((await client.get(f"{V}/functions/ids")).json()["functionIds"]) == 3


async def test_registry_credentials_and_api_keys_quotas(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_registry_credentials=1, quota_api_keys=2)
    cred = add_request("nvcr.io", "$oauthtoken", "pw", ["CONTAINER"])
    assert (await client.post(f"{V}/registry-credentials", json=cred)).status_code == 200
    other = add_request("nvcr.io", "$oauthtoken", "pw", ["HELM"], name="other")
    refused = await client.post(f"{V}/registry-credentials", json=other)
    quota_refusal(refused, "registry_credentials")
    listed = (await client.get(f"{V}/registry-credentials")).json()["registryCredentials"]
    assert len(listed) == 1
    # the bootstrap key is the first of the account's two keys
    assert (await client.post(f"{V}/api-keys", json={"scopes": ["admin"]})).status_code == 200
    quota_refusal(await client.post(f"{V}/api-keys", json={"scopes": ["admin"]}), "api_keys")
    assert len((await client.get(f"{V}/api-keys")).json()["apiKeys"]) == 2


async def test_instances_quota_counts_max_instances_of_live_deployments(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(quota_instances=3, reconciler_enabled=False)
    a, b = await create_fn(client), await create_fn(client, name="b")
    resp = await client.post(deployment_url(a), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 200, resp.text
    deployment = resp.json()["deployment"]
    refused = await client.post(deployment_url(b), json={"deploymentSpecifications": [L40]})
    assert quota_refusal(refused, "instances").startswith("the account has 2 instances")
    assert (await client.get(deployment_url(b))).status_code == 404
    # scaling up past the quota is refused too; scaling within it is fine
    spec_id = deployment["deploymentSpecifications"][0]["gpuSpecificationId"]
    patch = f"{V}/deployments/{deployment['deploymentId']}/gpu-specifications/{spec_id}"
    assert (await client.patch(patch, json={"maxInstances": 3})).status_code == 200
    quota_refusal(await client.patch(patch, json={"maxInstances": 4}), "instances")
    assert (await client.patch(patch, json={"maxInstances": 1})).status_code == 200


async def test_huge_instance_counts_are_400_on_both_databases(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconciler_enabled=False)
    fn = await create_fn(client)
    for value in (2**31, 2**63, 10**30):
        spec = {**L40, "minInstances": value, "maxInstances": value}
        resp = await client.post(deployment_url(fn), json={"deploymentSpecifications": [spec]})
        assert resp.status_code == 400, resp.text
        fields = {e["field"] for e in resp.json()["errors"]}
        assert fields == {
            "deploymentSpecifications[0].minInstances",
            "deploymentSpecifications[0].maxInstances",
        }
    assert (await client.get(deployment_url(fn))).status_code == 404


async def test_environment_secrets_and_artifacts_are_capped(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory()
    body = {
        **CONTAINER_FN,
        "containerEnvironment": [{"key": f"K{i}", "value": "v"} for i in range(257)],
        "secrets": [{"name": f"s{i}", "value": "v"} for i in range(129)],
        "models": [{"name": f"m{i}", "version": "1", "uri": "ngc://m"} for i in range(65)],
    }
    resp = await client.post(f"{V}/functions", json=body)
    assert resp.status_code == 400
    assert {(e["field"], e["message"]) for e in resp.json()["errors"]} == {
        ("containerEnvironment", "must have at most 256 items, got 257"),
        ("secrets", "must have at most 128 items, got 129"),
        ("models", "must have at most 64 items, got 65"),
    }
    assert (await client.get(f"{V}/functions")).json()["functions"] == []

"""A function's traffic split through the API: set and read, applied to the invocations that
name no version (an explicit version still wins), refused with every violation named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, until_status
from tests.support.invocation import deployed, invocation_app, pexec_url, spec


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(
        client_factory, tmp_path, invoke_route_cache_seconds=60, jwt_secret=None
    )


def traffic_url(fn: dict[str, Any]) -> str:
    return f"{V}/functions/{fn['id']}/traffic"


async def second_version(client: AppClient, fn: dict[str, Any], *, deploy: bool) -> dict[str, Any]:
    resp = await client.post(f"{V}/functions/{fn['id']}/versions", json=CONTAINER_FN)
    assert resp.status_code == 200, resp.text
    version = dict(resp.json()["function"])
    if deploy:
        resp = await client.post(dep_url(version), json={"deploymentSpecifications": [spec()]})
        assert resp.status_code == 200, resp.text
        await until_status(client, version, "ACTIVE")
    return version


async def landed(client: AppClient, fn: dict[str, Any], *, version: bool = False) -> str:
    resp = await client.post(pexec_url(fn, version=version), json={})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"])


async def test_a_split_sends_the_versionless_invocations_and_an_explicit_version_wins(
    client: AppClient,
) -> None:
    stable = await deployed(client)
    canary = await second_version(client, stable, deploy=True)
    # without a split, the newest invocable version takes them all
    assert (await client.get(traffic_url(stable))).json() == {
        "functionId": stable["id"],
        "traffic": [],
    }
    assert await landed(client, stable) == canary["versionId"]
    split = [
        {"versionId": stable["versionId"], "weight": 100},
        {"versionId": canary["versionId"], "weight": 0},
    ]
    resp = await client.put(traffic_url(stable), json={"traffic": split})
    assert resp.status_code == 200, resp.text
    assert resp.json() == (await client.get(traffic_url(stable))).json()
    assert resp.json()["traffic"] == split
    assert {await landed(client, stable) for _ in range(20)} == {stable["versionId"]}
    assert await landed(client, canary, version=True) == canary["versionId"]
    # an empty split: today's rule again
    resp = await client.put(traffic_url(stable), json={"traffic": []})
    assert resp.status_code == 200, resp.text
    assert await landed(client, stable) == canary["versionId"]


async def test_a_bad_split_is_refused_naming_each_violation_and_changes_nothing(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    idle = await second_version(client, fn, deploy=False)
    other = await create_fn(client)
    split = [
        {"versionId": fn["versionId"], "weight": 50},
        {"versionId": idle["versionId"], "weight": 20},
        {"versionId": other["versionId"], "weight": 20},
        {"versionId": fn["versionId"], "weight": 5},
        {"versionId": "nope", "weight": 101},
    ]
    problem = assert_problem(await client.put(traffic_url(fn), json={"traffic": split}), 400)
    fields = [e["field"] for e in problem["errors"]]  # type: ignore[attr-defined]
    assert fields == ["traffic[4].versionId", "traffic[4].weight"], problem
    problem = assert_problem(await client.put(traffic_url(fn), json={"traffic": split[:4]}), 400)
    messages = {e["field"]: e["message"] for e in problem["errors"]}  # type: ignore[attr-defined]
    assert "INACTIVE" in messages["traffic[1].versionId"]
    assert f"not a version of function {fn['id']}" in messages["traffic[2].versionId"]
    assert "more than once" in messages["traffic[3].versionId"]
    assert "sum to 100, got 95" in messages["traffic"]
    assert (await client.get(traffic_url(fn))).json()["traffic"] == []
    assert_problem(await client.put(traffic_url(other), json={}), 400)


async def test_a_token_sees_the_split_of_the_versions_it_may_invoke(client: AppClient) -> None:
    old = await deployed(client)
    new = await second_version(client, old, deploy=True)
    split = [
        {"versionId": old["versionId"], "weight": 30},
        {"versionId": new["versionId"], "weight": 70},
    ]
    assert (await client.put(traffic_url(old), json={"traffic": split})).status_code == 200
    resp = await client.post(
        f"{V}/tokens/functions/{old['id']}/versions/{old['versionId']}", json={"clientId": "c"}
    )
    assert resp.status_code == 200, resp.text
    token = bearer(resp.json()["access_token"])
    for _ in range(10):
        resp = await client.post(pexec_url(old, version=False), json={}, headers=token)
        assert resp.status_code == 200, resp.text
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == old["versionId"]
    # the owner's view holds both: both take some of 40 requests
    assert {await landed(client, old) for _ in range(40)} == {old["versionId"], new["versionId"]}

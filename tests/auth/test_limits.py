"""Limits per account (service/auth/limits.py): the operator's value for an account, else the
setting's; each refused at the account's own boundary in NVCF's words while another account
with a higher limit goes on."""

from __future__ import annotations

from typing import Any

from service.auth.limits import LIMITS, account_limit
from tests.support.api import CONTAINER_FN, assert_problem, bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.nvcf_cli import add_request

V = "/v2/nvcf"
ACCOUNTS = f"{V}/accounts"


async def account_key(client: AppClient, account: str, **limits: float) -> dict[str, str]:
    resp = await client.post(f"{ACCOUNTS}/{account}", json={"name": account, **limits})
    assert resp.status_code == 200, resp.text
    scopes = ["register_function", "list_functions", "manage_registry_credentials", "admin"]
    return bearer(await new_key(client, scopes, account=account))


async def test_the_lookup_is_the_accounts_value_else_the_settings(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(quota_functions=7, quota_tasks=9)
    await client.post(f"{ACCOUNTS}/team-a", json={"name": "a", "maxTasksAllowed": 3})
    settings = client.app.state.settings
    async with client.app.state.sessionmaker() as session:
        assert await account_limit(session, settings, "team-a", "maxTasksAllowed") == 3
        assert await account_limit(session, settings, "team-a", "maxFunctionsAllowed") == 7
        assert await account_limit(session, settings, "never-seen", "maxTasksAllowed") == 9
    assert set(LIMITS) >= {
        "maxFunctionsAllowed",
        "maxTasksAllowed",
        "maxTelemetriesAllowed",
        "maxRegistryCredentialsAllowed",
    }


async def test_each_account_is_refused_at_its_own_limit(client_factory: ClientFactory) -> None:
    client = await client_factory(quota_functions=100)
    low = await account_key(
        client, "team-low", maxFunctionsAllowed=1, maxRegistryCredentialsAllowed=1
    )
    high = await account_key(client, "team-high", maxFunctionsAllowed=2)

    async def create(headers: dict[str, str], name: str) -> Any:
        return await client.post(
            f"{V}/functions", json={**CONTAINER_FN, "name": name}, headers=headers
        )

    assert (await create(low, "one")).status_code == 200
    problem = assert_problem(await create(low, "two"), 400)
    assert problem["detail"] == (
        "Account 'team-low': Reached or exceeded the max limit for the number of functions "
        "allowed: 1."
    )
    assert "maxFunctionsAllowed" in str(problem["errors"])
    for n in ("one", "two"):
        assert (await create(high, n)).status_code == 200
    assert_problem(await create(high, "three"), 400)

    cred = add_request("nvcr.io", "$oauthtoken", "pw", ["CONTAINER"])
    other = add_request("nvcr.io", "$oauthtoken", "pw", ["HELM"], name="other")
    url = f"{V}/registry-credentials"
    assert (await client.post(url, json=cred, headers=low)).status_code == 200
    problem = assert_problem(await client.post(url, json=other, headers=low), 400)
    assert problem["detail"] == (
        "Account 'team-low': Reached or exceeded the max limit for the number of registry "
        "credentials allowed: 1."
    )
    # the default (the setting's 50) for the other account
    assert (await client.post(url, json=cred, headers=high)).status_code == 200
    assert (await client.post(url, json=other, headers=high)).status_code == 200

    # raising one limit lets the account on, and changes no other
    before = (await client.get(f"{ACCOUNTS}/team-low")).json()["account"]
    resp = await client.patch(f"{ACCOUNTS}/team-low", json={"maxFunctionsAllowed": 2})
    assert resp.json()["account"] == {**before, "maxFunctionsAllowed": 2}
    assert (await create(low, "two")).status_code == 200
    assert_problem(await client.post(url, json=other, headers=low), 400)


async def test_each_account_is_refused_at_its_own_api_rate_limit(
    client_factory: ClientFactory,
) -> None:
    """`rateLimitPerSecond`/`rateLimitBurst` of an account replace the settings' (here off)."""
    client = await client_factory(rate_limit_per_second=0)
    low = await account_key(client, "team-low", rateLimitPerSecond=0.001, rateLimitBurst=2)
    high = await account_key(client, "team-high", rateLimitPerSecond=0.001, rateLimitBurst=4)
    default = await account_key(client, "team-default")

    async def listed(headers: dict[str, str]) -> int:
        return (await client.get(f"{V}/functions", headers=headers)).status_code

    assert [await listed(low) for _ in range(2)] == [200, 200]
    problem = assert_problem(await client.get(f"{V}/functions", headers=low), 429)
    assert str(problem["detail"]).startswith(
        "account 'team-low' is over its rate limit (rateLimitPerSecond 0.001, rateLimitBurst 2: "
        "2 requests per 2000 s); retry in "
    )
    assert [await listed(high) for _ in range(4)] == [200] * 4
    assert await listed(high) == 429
    assert [await listed(default) for _ in range(10)] == [200] * 10  # the setting's: off

    # a limit of its own reaches the account's next request; 0 lifts it
    resp = await client.patch(f"{ACCOUNTS}/team-default", json={"rateLimitPerSecond": 0.001})
    assert resp.json()["account"]["rateLimitPerSecond"] == 0.001
    assert resp.json()["account"]["rateLimitBurst"] == 1000  # the setting's
    resp = await client.patch(f"{ACCOUNTS}/team-low", json={"rateLimitPerSecond": 0})
    assert resp.status_code == 200, resp.text
    assert [await listed(low) for _ in range(3)] == [200] * 3

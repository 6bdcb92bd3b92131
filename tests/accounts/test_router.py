"""The operator's account routes (NVCF's `/v2/nvcf/accounts`, scope `account_setup`): nvcf-cli's
`admin accounts` requests as its Go source builds them, limits, suspension and deletion."""

from __future__ import annotations

import time
from typing import Any

import jwt

from service.auth.limits import LIMITS, RATES
from tests.support.api import assert_problem, bearer, create_fn, new_key
from tests.support.app import JWT_SECRET, AppClient
from tests.support.go_decode import (
    ACCOUNT_RESPONSE,
    LIST_ACCOUNTS_RESPONSE,
    assert_go_decodes,
)

ACCOUNTS = "/v2/nvcf/accounts"


def create_request(name: str, client_id: str, **limits: int) -> dict[str, Any]:
    """nvcf-cli's CreateAccountRequest as Go marshals it: `name` and `adminClientId` always,
    the limits only when not zero (`omitempty`)."""
    return {"name": name, "adminClientId": client_id, **{k: v for k, v in limits.items() if v}}


def tenant_jwt(account: str, *scopes: str) -> dict[str, str]:
    claims = {"sub": account, "scopes": list(scopes), "exp": int(time.time()) + 600}
    return bearer(jwt.encode(claims, JWT_SECRET, algorithm="HS256"))


async def test_nvcf_cli_admin_accounts_round_trip(client: AppClient) -> None:
    # CreateAccount: POST /v2/nvcf/accounts/{adminClientId}
    resp = await client.post(
        f"{ACCOUNTS}/team-a", json=create_request("Team A", "team-a", maxFunctionsAllowed=20)
    )
    assert resp.status_code == 200, resp.text
    assert_go_decodes(resp.json(), ACCOUNT_RESPONSE)
    created = resp.json()["account"]
    assert created["ncaId"] == "team-a" and created["name"] == "Team A"
    assert created["adminClientIds"] == ["team-a"]
    assert created["maxFunctionsAllowed"] == 20
    # the limits not named are the settings'
    assert created["maxRegistryCredentialsAllowed"] == 50
    assert created["maxTelemetriesAllowed"] == 50

    resp = await client.get(ACCOUNTS)
    assert resp.status_code == 200
    assert_go_decodes(resp.json(), LIST_ACCOUNTS_RESPONSE)
    assert "team-a" in {a["ncaId"] for a in resp.json()["cloudAccounts"]}

    # UpdateAccount: only the flag given is sent, and only it changes
    resp = await client.patch(f"{ACCOUNTS}/team-a", json={"maxTasksAllowed": 7})
    assert resp.status_code == 200, resp.text
    assert_go_decodes(resp.json(), ACCOUNT_RESPONSE)
    assert resp.json()["account"] == {**created, "maxTasksAllowed": 7}
    resp = await client.get(f"{ACCOUNTS}/team-a")
    assert resp.json()["account"] == {**created, "maxTasksAllowed": 7}

    # DeleteAccount: 204
    resp = await client.delete(f"{ACCOUNTS}/team-a")
    assert resp.status_code == 204
    assert_problem(await client.get(f"{ACCOUNTS}/team-a"), 404)


async def test_a_tenant_credential_is_refused_on_the_operator_routes(client: AppClient) -> None:
    tenant = await new_key(client, ["admin", "list_functions"], account="team-b")
    for method, path, body in [
        ("GET", ACCOUNTS, None),
        ("GET", f"{ACCOUNTS}/team-b", None),
        ("POST", f"{ACCOUNTS}/team-c", create_request("c", "team-c")),
        ("PATCH", f"{ACCOUNTS}/team-b", {"maxFunctionsAllowed": 10_000}),
        ("DELETE", f"{ACCOUNTS}/team-b", None),
        ("PUT", f"{ACCOUNTS}/nvcf-default/suspension", {"reason": "mine now"}),
        ("DELETE", f"{ACCOUNTS}/team-b/suspension", None),
    ]:
        resp = await client.request(method, path, json=body, headers=bearer(tenant))
        problem = assert_problem(resp, 403)
        assert "account_setup" in str(problem["detail"]), (method, path)
    # nor can a JWT grant it
    resp = await client.get(ACCOUNTS, headers=tenant_jwt("team-b", "account_setup"))
    assert_problem(resp, 403)


async def test_bad_limits_are_each_named_and_change_nothing(client: AppClient) -> None:
    await client.post(f"{ACCOUNTS}/team-a", json=create_request("A", "team-a"))
    before = (await client.get(f"{ACCOUNTS}/team-a")).json()
    resp = await client.patch(
        f"{ACCOUNTS}/team-a",
        json={
            "maxFunctionsAllowed": -1,
            "maxTelemetriesAllowed": 51,
            "maxRegistryCredentialsAllowed": "5",
            "maxTasksAllowed": 3,
        },
    )
    problem = assert_problem(resp, 400)
    fields = {e["field"] for e in problem["errors"]}
    assert fields == {
        "maxFunctionsAllowed",
        "maxTelemetriesAllowed",
        "maxRegistryCredentialsAllowed",
    }
    assert (await client.get(f"{ACCOUNTS}/team-a")).json() == before

    assert_problem(await client.patch(f"{ACCOUNTS}/nobody", json={"maxTasksAllowed": 1}), 404)
    assert_problem(await client.get(f"{ACCOUNTS}/nobody"), 404)
    assert_problem(await client.post(f"{ACCOUNTS}/team-a", json=create_request("A", "a")), 409)
    bad_id = await client.post(f"{ACCOUNTS}/team%20a", json=create_request("A", "a"))
    assert assert_problem(bad_id, 400)["errors"][0]["field"] == "ncaId"


async def test_a_suspended_account_is_refused_everywhere_until_resumed(client: AppClient) -> None:
    key = await new_key(client, ["list_functions", "register_function"], account="team-s")
    token = tenant_jwt("team-s", "list_functions")
    assert (await client.get("/v2/nvcf/functions", headers=bearer(key))).status_code == 200

    resp = await client.put(f"{ACCOUNTS}/team-s/suspension", json={"reason": "unpaid invoice"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["account"]["suspended"] is True
    for headers in (bearer(key), token):
        problem = assert_problem(await client.get("/v2/nvcf/functions", headers=headers), 403)
        assert problem["detail"] == "account 'team-s' is suspended: unpaid invoice"
    # another account goes on
    assert (await client.get("/v2/nvcf/functions")).status_code == 200

    resp = await client.delete(f"{ACCOUNTS}/team-s/suspension")
    assert resp.status_code == 200
    assert resp.json()["account"]["suspended"] is False
    assert (await client.get("/v2/nvcf/functions", headers=bearer(key))).status_code == 200


async def test_the_operator_cannot_suspend_its_own_account(client: AppClient) -> None:
    problem = assert_problem(
        await client.put(f"{ACCOUNTS}/nvcf-default/suspension", json={"reason": "oops"}), 400
    )
    assert problem["errors"][0]["field"] == "ncaId"
    assert (await client.get("/v2/nvcf/functions")).status_code == 200
    assert_problem(await client.put(f"{ACCOUNTS}/team-x/suspension", json={"reason": ""}), 400)


async def test_an_account_owning_functions_is_not_deleted(client: AppClient) -> None:
    key = await new_key(client, ["register_function", "list_functions"], account="team-f")
    await create_fn(client, name="kept")  # the operator's, not team-f's
    resp = await client.post(
        "/v2/nvcf/functions",
        json={"name": "f", "inferenceUrl": "/x", "inferencePort": 8000, "containerImage": "a/b:1"},
        headers=bearer(key),
    )
    assert resp.status_code == 200, resp.text
    problem = assert_problem(await client.delete(f"{ACCOUNTS}/team-f"), 409)
    assert "1 functions" in str(problem["detail"]) and "suspend" in str(problem["detail"])
    assert (await client.get("/v2/nvcf/functions", headers=bearer(key))).status_code == 200


#: a new value for every limit an account has (PATCH-able one by one)
CHANGES: dict[str, Any] = {
    **{name: 3 for name in LIMITS},
    "rateLimitPerSecond": 2.5,
    "rateLimitBurst": 9,
    "accountInputTokenRateLimit": "100-M,1000000-MO",
    "accountOutputTokenRateLimit": "50-H",
}


async def test_a_patch_of_one_limit_changes_nothing_else(client: AppClient) -> None:
    assert set(CHANGES) == set(LIMITS) | set(RATES)
    await client.post(f"{ACCOUNTS}/team-p", json=create_request("P", "team-p"))
    account = (await client.get(f"{ACCOUNTS}/team-p")).json()["account"]
    for name, value in CHANGES.items():
        assert account[name] != value, name
        resp = await client.patch(f"{ACCOUNTS}/team-p", json={name: value})
        assert resp.status_code == 200, resp.text
        account = {**account, name: value}
        assert resp.json()["account"] == account, name
        assert (await client.get(f"{ACCOUNTS}/team-p")).json()["account"] == account, name


async def test_negative_and_over_maximum_limits_are_each_named_and_change_nothing(
    client: AppClient,
) -> None:
    await client.post(f"{ACCOUNTS}/team-n", json=create_request("N", "team-n"))
    before = (await client.get(f"{ACCOUNTS}/team-n")).json()
    negative: dict[str, Any] = {
        **{name: -1 for name in LIMITS},
        "rateLimitPerSecond": -0.5,
        "rateLimitBurst": -1,
        "accountInputTokenRateLimit": "-5-M",
        "accountOutputTokenRateLimit": "0-M",
    }
    too_large: dict[str, Any] = {
        **{name: limit.maximum + 1 for name, limit in LIMITS.items()},
        "rateLimitPerSecond": 1_000_001,
        "rateLimitBurst": 2**31,
        "accountInputTokenRateLimit": "1" * 13 + "-M",
        "accountOutputTokenRateLimit": ",".join(f"{n}-M" for n in range(1, 40)),
    }
    for bad in (negative, too_large):
        for method, path in (("PATCH", f"{ACCOUNTS}/team-n"), ("POST", f"{ACCOUNTS}/team-m")):
            problem = assert_problem(await client.request(method, path, json=bad), 400)
            fields = {e["field"] for e in problem["errors"]}
            assert fields == set(bad), (method, set(bad) ^ fields)
    assert (await client.get(f"{ACCOUNTS}/team-n")).json() == before
    assert_problem(await client.get(f"{ACCOUNTS}/team-m"), 404)


async def test_an_unknown_account_is_not_found_on_every_route(client: AppClient) -> None:
    for method, path, body in [
        ("GET", f"{ACCOUNTS}/nobody", None),
        ("PATCH", f"{ACCOUNTS}/nobody", {"rateLimitBurst": 5}),
        ("DELETE", f"{ACCOUNTS}/nobody", None),
        ("PUT", f"{ACCOUNTS}/nobody/suspension", {"reason": "why"}),
        ("DELETE", f"{ACCOUNTS}/nobody/suspension", None),
    ]:
        problem = assert_problem(await client.request(method, path, json=body), 404)
        assert problem["detail"] == "account 'nobody' not found", (method, path)

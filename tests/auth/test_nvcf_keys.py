"""NVCF's API-keys service routes as nvcf-cli calls them (`init`: `POST /v1/admin/keys`;
`api-key generate/list/delete`: `/v1/keys`), their answers decoded as the CLI's Go structs,
every violation of a bad policy listed, and a key limited to named functions reaching only
those, on every route.

The tests on `client` share one app per database, each as the admin of an account of its own
(`admin` is the operator's client of the same app)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from service.auth.models import ApiKey
from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn, new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.go_decode import ListOf, assert_go_decodes

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own apps run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

V = "/v2/nvcf"
#: nvcf-cli's `apikeys.APIKey` (internal/apikeys/client.go)
GO_API_KEY = {
    "id": str,
    "description": str,
    "created_at": str,
    "expires_at": str,
    "status": str,
    "value": str,
}
#: NVCF's `KeyDto` (the api-keys service's dto/keys/KeyDto.java), as `KeyResponseBuilder` fills
#: it for a list item and for `GET /v1/keys/{id}`
NVCF_KEY_FIELDS = {
    "id",
    "value",
    "status",
    "owner_type",
    "owner_id",
    "issuer_service_id",
    "audience_service_ids",
    "description",
    "created_at",
    "expires_at",
}
#: the headers nvcf-cli's apikeys client sends
CLI_HEADERS = {
    "Key-Issuer-Service": "nvcf-api",
    "Key-Issuer-Id": "nvidia-cloud-functions-ncp-service-id-aketm",
    "Key-Owner-Id": "svc@nvcf-api.local",
}


def generate_body(
    resources: list[dict[str, Any]], scopes: list[str], *, hours: float = 24
) -> dict[str, Any]:
    """`GenerateAPIKey`'s payload, as nvcf-cli marshals it."""
    expires = (datetime.now(UTC) + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    service = CLI_HEADERS["Key-Issuer-Id"]
    return {
        "description": "nvcf-cli key",
        "expires_at": expires,
        "authorizations": {
            "policies": [
                {
                    "aud": service,
                    "auds": [service],
                    "product": "nv-cloud-functions",
                    "resources": resources,
                    "scopes": scopes,
                }
            ]
        },
        "audience_service_ids": [service],
    }


ALL = [{"id": "*", "type": "account-functions"}, {"id": "*", "type": "authorized-functions"}]


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


def another() -> str:
    return f"someone-else-{uuid.uuid4().hex[:12]}"


async def management_token(client: AppClient) -> str:
    resp = await client.post("/v1/admin/keys", json={})
    assert resp.status_code == 200, resp.text
    token = resp.json()
    assert_go_decodes(token, GO_API_KEY)
    return str(token["value"])


async def test_init_then_generate_list_and_delete_as_nvcf_cli_does(client: AppClient) -> None:
    resp = await client.post("/v1/admin/keys", json={})
    assert resp.status_code == 200, resp.text
    token = resp.json()
    assert token["status"] == "ACTIVE" and token["value"].startswith("nvapi-")
    [policy] = token["authorizations"]["policies"]
    assert {"register_function", "deploy_function", "update_secrets"} <= set(policy["scopes"])
    assert "admin:accounts" not in policy["scopes"]
    expires = datetime.fromisoformat(token["expires_at"].replace("Z", "+00:00"))
    assert timedelta(hours=11) < expires - datetime.now(UTC) <= timedelta(hours=12)
    admin = bearer(token["value"])
    fn = (await client.post(f"{V}/functions", json=CONTAINER_FN, headers=admin)).json()
    assert "function" in fn  # the management token manages functions

    body = generate_body(ALL, ["invoke_function", "list_functions"])
    resp = await client.post("/v1/keys", json=body, headers={**admin, **CLI_HEADERS})
    assert resp.status_code == 200, resp.text
    key = resp.json()
    assert_go_decodes(key, GO_API_KEY)
    assert key["owner_id"] == "svc@nvcf-api.local"
    assert key["authorizations"]["policies"][0]["resources"] == ALL
    listed = (await client.get(f"{V}/functions", headers=bearer(key["value"]))).json()
    assert len(listed["functions"]) == 1

    resp = await client.get("/v1/keys", headers={**admin, **CLI_HEADERS})
    assert resp.status_code == 200
    keys = resp.json()["keys"]
    assert_go_decodes(keys, ListOf(GO_API_KEY))
    assert key["id"] in [k["id"] for k in keys]
    assert all(k["value"].startswith("nvapi-**********") for k in keys)  # a masked suffix

    assert (await client.delete(f"/v1/keys/{key['id']}", headers=admin)).status_code == 204
    assert_problem(await client.delete(f"/v1/keys/{key['id']}", headers=admin), 404)
    assert_problem(await client.get(f"{V}/functions", headers=bearer(key["value"])), 401)


async def test_a_management_token_needs_an_admin_credential(client: AppClient) -> None:
    """Without `admin`, every route of the keys service refuses alike: the same 403, which
    names the scope the operation needs, and nothing minted or revoked."""
    resp = await client.post("/v1/admin/keys", json={}, headers={"Authorization": ""})
    assert_problem(resp, 401)
    lister = bearer(await new_key(client, ["list_functions"]))
    key = await key_of(client, ["list_functions"])
    before = len((await client.get("/v1/keys")).json()["keys"])
    refusals = [
        await client.post("/v1/admin/keys", headers=lister),
        await client.post("/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=lister),
        await client.get("/v1/keys", headers=lister),
        await client.delete(f"/v1/keys/{key['id']}", headers=lister),
    ]
    details = {str(assert_problem(resp, 403)["detail"]) for resp in refusals}
    assert details == {"this operation requires the scope 'admin'"}
    assert len((await client.get("/v1/keys")).json()["keys"]) == before
    assert await works(client, key)


async def test_an_account_admins_management_token_is_for_its_own_account(
    client: AppClient, admin: AppClient, tenant: str
) -> None:
    """`nvcf-cli init` with another account's admin key mints a token of that account, never
    one of the default account (the operator's) nor with reach over its functions."""
    theirs = await create_fn(admin)  # a function of the default account
    resp = await client.post("/v1/admin/keys", json={})  # as the tenant's admin
    assert resp.status_code == 200, resp.text
    token = resp.json()
    assert token["owner_id"] == tenant
    listed = await client.get(f"{V}/functions", headers=bearer(token["value"]))
    assert listed.status_code == 200 and listed.json() == {"functions": []}
    path = f"{V}/functions/{theirs['id']}/versions/{theirs['versionId']}"
    assert (await client.delete(path, headers=bearer(token["value"]))).status_code == 404
    assert (await admin.get(path)).status_code == 200


@own_app
async def test_init_without_credentials_from_a_trusted_network(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(admin_token_networks="127.0.0.0/8")
    resp = await client.post("/v1/admin/keys", json={}, headers={"Authorization": ""})
    assert resp.status_code == 200, resp.text
    assert resp.json()["owner_id"] == "nvcf-default"
    other = await client_factory(admin_token_networks="10.0.0.0/8")
    resp = await other.post("/v1/admin/keys", json={}, headers={"Authorization": ""})
    assert_problem(resp, 401)


PROXIED = [
    {"X-Forwarded-For": "203.0.113.7"},
    {"Forwarded": "for=203.0.113.7"},
    {"X-Real-IP": "203.0.113.7"},
]


@own_app
async def test_no_credential_through_a_proxy_gets_nothing_even_from_a_trusted_network(
    client_factory: ClientFactory,
) -> None:
    """Behind a reverse proxy (a local nginx, a cluster ingress) every caller has the proxy's
    internal address: a credential-less request carrying a proxy header gets no management
    token and revokes no key, with a 401 saying why."""
    client = await client_factory(admin_token_networks="127.0.0.0/8")
    key = await key_of(client, ["list_functions"])
    before = len((await client.get("/v1/keys")).json()["keys"])
    for headers in PROXIED:
        resp = await client.post(
            "/v1/admin/keys", json={}, headers={"Authorization": "", **headers}
        )
        problem = assert_problem(resp, 401)
        assert "proxy" in str(problem["detail"])
        request = client.build_request(
            "DELETE", f"/v1/keys/{key['id']}", headers={**CLI_HEADERS, **headers}
        )
        request.headers.pop("authorization", None)
        problem = assert_problem(await client.send(request), 401)
        assert "proxy" in str(problem["detail"])
    assert await works(client, key)
    assert len((await client.get("/v1/keys")).json()["keys"]) == before
    # with a credential, a proxied request is served as usual
    resp = await client.post("/v1/admin/keys", json={}, headers=PROXIED[0])
    assert resp.status_code == 200, resp.text


async def as_the_cli_deletes(client: AppClient, key_id: str) -> httpx.Response:
    """`DeleteAPIKey`'s request exactly: DELETE with the CLI's three headers and no credential
    (internal/apikeys/client.go sets no Authorization there, unlike generate and list)."""
    request = client.build_request("DELETE", f"/v1/keys/{key_id}", headers=CLI_HEADERS)
    request.headers.pop("authorization", None)
    return await client.send(request)


async def key_of(
    client: AppClient, scopes: list[str], account: str | None = None
) -> dict[str, str]:
    body: dict[str, Any] = {"scopes": scopes}
    if account is not None:
        body["ncaId"] = account
    resp = await client.post(f"{V}/api-keys", json=body)
    assert resp.status_code == 200, resp.text
    made = resp.json()["apiKey"]
    return {"id": made["id"], "value": made["key"], "account": made["ncaId"]}


async def works(client: AppClient, key: dict[str, str]) -> bool:
    resp = await client.get(f"{V}/functions", headers=bearer(key["value"]))
    return resp.status_code == 200


@own_app
async def test_api_key_delete_as_the_cli_sends_it_from_a_trusted_network(
    client_factory: ClientFactory,
) -> None:
    """Opted in (NVCF_ADMIN_TOKEN_NETWORKS, as for `init`), the CLI's credential-less delete
    revokes a key of the default account; another account's key, an unknown id and an
    operator key are not revoked that way."""
    client = await client_factory(admin_token_networks="127.0.0.0/8")
    key = await key_of(client, ["list_functions"])
    assert key["account"] == "nvcf-default"
    foreign = await key_of(client, ["list_functions"], account="someone-else")
    # the operator's own key (the bootstrap key, scope admin:accounts)
    listed = (await client.get(f"{V}/api-keys")).json()["apiKeys"]
    [operator_id] = [k["id"] for k in listed if "admin:accounts" in k["scopes"]]
    operator = {"id": operator_id, "value": ADMIN_KEY}

    assert (await as_the_cli_deletes(client, key["id"])).status_code == 204
    assert not await works(client, key)
    assert_problem(await as_the_cli_deletes(client, key["id"]), 404)
    assert_problem(await as_the_cli_deletes(client, "not-a-key-id"), 404)
    assert_problem(await as_the_cli_deletes(client, foreign["id"]), 404)
    assert await works(client, foreign)
    problem = assert_problem(await as_the_cli_deletes(client, operator["id"]), 403)
    assert "operator key" in str(problem["detail"])
    assert await works(client, operator)


@own_app
async def test_api_key_delete_without_a_credential_elsewhere_deletes_nothing(
    client_factory: ClientFactory,
) -> None:
    """Not opted in (the default, or another network): the CLI's credential-less delete is
    refused with a 401 that says why, and the key keeps working; a credential without scope
    `admin` cannot revoke either."""
    for networks in ("", "10.0.0.0/8"):
        client = await client_factory(admin_token_networks=networks)
        key = await key_of(client, ["list_functions"])
        problem = assert_problem(await as_the_cli_deletes(client, key["id"]), 401)
        assert "NVCF_ADMIN_TOKEN_NETWORKS" in str(problem["detail"])
        lister = bearer(key["value"])
        assert_problem(await client.delete(f"/v1/keys/{key['id']}", headers=lister), 403)
        assert await works(client, key)
        # with a credential, as `curl -H "Authorization: Bearer <admin token>"` would
        assert (await client.delete(f"/v1/keys/{key['id']}")).status_code == 204
        assert not await works(client, key)


async def test_a_bad_policy_lists_every_violation_and_creates_nothing(
    client: AppClient, admin: AppClient
) -> None:
    foreign = await new_key(admin, ["register_function"], account=another())
    theirs = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=bearer(foreign))
    their_fn = theirs.json()["function"]["id"]
    before = len((await client.get("/v1/keys")).json()["keys"])
    body = generate_body(
        [{"id": their_fn, "type": "account-functions"}], ["list_functions", "admin:accounts"]
    )
    body["expires_at"] = "2001-01-01T00:00:00Z"
    resp = await client.post("/v1/keys", json=body)
    problem = assert_problem(resp, 400)
    fields = [e["field"] for e in problem["errors"]]
    assert fields == ["expires_at", "authorizations.policies[0].scopes"]

    body = generate_body(
        [{"id": their_fn, "type": "account-functions"}, {"id": "x", "type": "galaxy"}],
        ["list_functions"],
    )
    problem = assert_problem(await client.post("/v1/keys", json=body), 400)
    assert [e["field"] for e in problem["errors"]] == [
        "authorizations.policies[0].resources[1].type"
    ]
    body = generate_body([{"id": their_fn, "type": "account-functions"}], ["list_functions"])
    problem = assert_problem(await client.post("/v1/keys", json=body), 400)
    assert "is not one of this account's functions" in str(problem["errors"])
    assert_problem(await client.post("/v1/keys", json={"authorizations": {}}), 400)
    assert_problem(await client.post("/v1/keys", json=[1]), 400)
    assert len((await client.get("/v1/keys")).json()["keys"]) == before


async def test_a_key_limited_to_a_function_reaches_only_it(client: AppClient) -> None:
    mine = await create_fn(client)
    other = await create_fn(client, name="other")
    scopes = [
        "list_functions",
        "list_functions_details",
        "update_function",
        "deploy_function",
        "register_function",
        "update_secrets",
        "delete_function",
    ]
    body = generate_body([{"id": mine["id"], "type": "account-functions"}], scopes)
    created = await client.post("/v1/keys", json=body)
    assert created.status_code == 200, created.text
    limited = bearer(created.json()["value"])

    listed = (await client.get(f"{V}/functions", headers=limited)).json()["functions"]
    assert {f["id"] for f in listed} == {mine["id"]}
    ids = (await client.get(f"{V}/functions/ids", headers=limited)).json()["functionIds"]
    assert ids == [mine["id"]]
    mine_url = f"{V}/functions/{mine['id']}/versions/{mine['versionId']}"
    other_url = f"{V}/functions/{other['id']}/versions/{other['versionId']}"
    assert (await client.get(mine_url, headers=limited)).status_code == 200
    assert_problem(await client.get(other_url, headers=limited), 404)
    # twice: a cached read of the version must not answer either
    assert (await client.get(other_url)).status_code == 200
    assert_problem(await client.get(other_url, headers=limited), 404)
    assert_problem(await client.get(f"{V}/functions/{other['id']}/versions", headers=limited), 404)
    assert_problem(await client.delete(other_url, headers=limited), 404)
    assert_problem(
        await client.put(
            f"{V}/secrets/functions/{other['id']}/versions/{other['versionId']}",
            json={"secrets": [{"name": "A", "value": "b"}]},
            headers=limited,
        ),
        404,
    )
    spec = {"deploymentSpecifications": [{"gpu": "H100", "minInstances": 0, "maxInstances": 1}]}
    other_dep = f"{V}/deployments/functions/{other['id']}/versions/{other['versionId']}"
    assert_problem(await client.post(other_dep, json=spec, headers=limited), 404)
    resp = await client.post(other_dep, json=spec)  # the account's admin deploys it
    assert resp.status_code == 200, resp.text
    dep_id = resp.json()["deployment"]["deploymentId"]
    assert_problem(await client.get(f"{V}/deployments/{dep_id}", headers=limited), 404)
    assert_problem(await client.get(f"{V}/deployments/{dep_id}/events", headers=limited), 404)
    assert (await client.get(f"{V}/deployments", headers=limited)).json()["deployments"] == []
    # a new function could not be reached by the key: it may not create one
    assert_problem(await client.post(f"{V}/functions", json=CONTAINER_FN, headers=limited), 403)
    # a new version of its own function it may
    resp = await client.post(
        f"{V}/functions/{mine['id']}/versions", json=CONTAINER_FN, headers=limited
    )
    assert resp.status_code == 200, resp.text


async def test_a_limited_key_makes_only_keys_as_limited(client: AppClient) -> None:
    mine = await create_fn(client)
    other = await create_fn(client, name="other")
    body = generate_body(
        [{"id": mine["id"], "type": "account-functions"}], ["admin", "list_functions"]
    )
    limited = bearer((await client.post("/v1/keys", json=body)).json()["value"])

    wide = await client.post(
        "/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=limited
    )
    assert wide.status_code == 200, wide.text
    listed = await client.get(f"{V}/functions", headers=bearer(wide.json()["value"]))
    assert {f["id"] for f in listed.json()["functions"]} == {mine["id"]}

    beyond = generate_body([{"id": other["id"], "type": "account-functions"}], ["list_functions"])
    assert_problem(await client.post("/v1/keys", json=beyond, headers=limited), 400)

    token = (await client.post("/v1/admin/keys", json={}, headers=limited)).json()["value"]
    listed = await client.get(f"{V}/functions", headers=bearer(token))
    assert {f["id"] for f in listed.json()["functions"]} == {mine["id"]}

    made = await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]}, headers=limited)
    assert made.status_code == 200, made.text
    listed = await client.get(f"{V}/functions", headers=bearer(made.json()["apiKey"]["key"]))
    assert {f["id"] for f in listed.json()["functions"]} == {mine["id"]}


async def test_a_key_limited_to_a_function_invokes_only_it(client: AppClient) -> None:
    mine = await create_fn(client)
    other = await create_fn(client, name="other")
    body = generate_body([{"id": mine["id"], "type": "account-functions"}], ["invoke_function"])
    created = await client.post("/v1/keys", json=body)
    assert created.status_code == 200, created.text
    limited = bearer(created.json()["value"])
    for fn in (mine, other):
        # the account's own key reaches both (neither is deployed: not invocable, a 400)
        url = f"{V}/pexec/functions/{fn['id']}/versions/{fn['versionId']}"
        assert_problem(await client.post(url, json={}), 400)
    for entry in ("pexec", "exec"):
        mine_url = f"{V}/{entry}/functions/{mine['id']}"
        other_url = f"{V}/{entry}/functions/{other['id']}"
        body_of: dict[str, Any] = {} if entry == "pexec" else {"requestBody": {}}
        resp = await client.post(mine_url, json=body_of, headers=limited)
        assert resp.status_code == 400, resp.text  # seen, and not invocable
        resp = await client.post(other_url, json=body_of, headers=limited)
        assert resp.status_code == 404, resp.text  # as an unknown function
    transparent = {**limited, "function-id": other["id"]}
    assert (await client.post("/anything", json={}, headers=transparent)).status_code == 404


async def test_a_limited_key_lists_and_revokes_only_keys_as_limited(client: AppClient) -> None:
    """A key limited to named functions sees and revokes only keys limited to (some of) them,
    on /v1/keys and /v2/nvcf/api-keys alike: the account's other keys are absent from its
    lists and a 404 to revoke, and keep working."""
    mine = await create_fn(client)
    other = await create_fn(client, name="other")
    limited_body = generate_body(
        [{"id": mine["id"], "type": "account-functions"}], ["admin", "list_functions"]
    )
    limited_key = (await client.post("/v1/keys", json=limited_body)).json()
    limited = bearer(limited_key["value"])
    wide = await key_of(client, ["list_functions"])
    beside_body = generate_body(
        [{"id": other["id"], "type": "account-functions"}], ["list_functions"]
    )
    beside = (await client.post("/v1/keys", json=beside_body)).json()
    both_body = generate_body(
        [
            {"id": mine["id"], "type": "account-functions"},
            {"id": other["id"], "type": "account-functions"},
        ],
        ["list_functions"],
    )
    both = (await client.post("/v1/keys", json=both_body)).json()
    made = [
        (
            await client.post(
                "/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=limited
            )
        ).json()["id"]
        for _ in range(2)
    ]

    v1 = {k["id"] for k in (await client.get("/v1/keys", headers=limited)).json()["keys"]}
    v2 = {k["id"] for k in (await client.get(f"{V}/api-keys", headers=limited)).json()["apiKeys"]}
    assert v1 == v2 == {limited_key["id"], *made}
    for key_id in (wide["id"], beside["id"], both["id"]):
        assert_problem(await client.delete(f"/v1/keys/{key_id}", headers=limited), 404)
        assert_problem(await client.delete(f"{V}/api-keys/{key_id}", headers=limited), 404)
    assert await works(client, wide)
    assert await works(client, {"value": beside["value"]})
    assert await works(client, {"value": both["value"]})
    assert (await client.delete(f"/v1/keys/{made[0]}", headers=limited)).status_code == 204
    assert (await client.delete(f"{V}/api-keys/{made[1]}", headers=limited)).status_code == 204
    # the account's unlimited admin still sees and revokes every key
    every = {k["id"] for k in (await client.get("/v1/keys")).json()["keys"]}
    assert {wide["id"], beside["id"], both["id"], limited_key["id"]} <= every
    assert (await client.delete(f"/v1/keys/{both['id']}")).status_code == 204


@pytest.mark.parametrize(
    ("scope", "route"),
    [
        ("manage_registry_credentials", f"{V}/registry-credentials"),
        ("manage_telemetries", f"{V}/telemetries"),
    ],
    ids=["registry-credentials", "telemetries"],
)
async def test_a_limited_key_never_gets_nor_grants_an_account_wide_scope(
    client: AppClient, scope: str, route: str
) -> None:
    """Registry credentials (every function pulls with them) and telemetry endpoints (any
    function may name them) are account-wide: a key limited to named functions gets a
    management token without their scope, and no key limited to functions may be given it
    (400 naming why)."""
    mine = await create_fn(client)
    limited_body = generate_body(
        [{"id": mine["id"], "type": "account-functions"}], ["admin", "list_functions"]
    )
    limited = bearer((await client.post("/v1/keys", json=limited_body)).json()["value"])

    token = (await client.post("/v1/admin/keys", json={}, headers=limited)).json()
    [policy] = token["authorizations"]["policies"]
    assert scope not in policy["scopes"]
    assert "deploy_function" in policy["scopes"]
    resp = await client.get(route, headers=bearer(token["value"]))
    assert_problem(resp, 403)
    # the unlimited management token still carries it
    full = (await client.post("/v1/admin/keys", json={})).json()
    assert scope in full["authorizations"]["policies"][0]["scopes"]

    before = len((await client.get("/v1/keys")).json()["keys"])
    wide = ["list_functions", scope]
    for headers in (limited, {}):  # neither a limited key nor the account's admin
        body = generate_body([{"id": mine["id"], "type": "account-functions"}], wide)
        problem = assert_problem(await client.post("/v1/keys", json=body, headers=headers), 400)
        assert "account-wide" in str(problem["errors"]) and scope in str(problem["errors"])
    problem = assert_problem(
        await client.post(f"{V}/api-keys", json={"scopes": wide}, headers=limited), 400
    )
    assert "account-wide" in str(problem["errors"]) and scope in str(problem["errors"])
    assert len((await client.get("/v1/keys")).json()["keys"]) == before


async def test_a_policy_keeps_only_what_it_means_and_bounds_the_rest(client: AppClient) -> None:
    """`POST /v1/keys` stores each resource as `{id, type}` only (a client's extra keys are not
    shown back by every list), and `aud`, `auds` and `product` must be bounded strings: every
    violation is listed and nothing is created."""
    mine = await create_fn(client)
    resource = {"id": mine["id"].upper(), "type": "account-functions", "note": "x" * 5000}
    body = generate_body(
        [resource, {"id": "*", "type": "authorized-functions", "n": [1]}], ["list_functions"]
    )
    created = await client.post("/v1/keys", json=body)
    assert created.status_code == 200, created.text
    expected = [
        {"id": mine["id"], "type": "account-functions"},
        {"id": "*", "type": "authorized-functions"},
    ]
    assert created.json()["authorizations"]["policies"][0]["resources"] == expected
    [listed] = [
        k for k in (await client.get("/v1/keys")).json()["keys"] if k["id"] == created.json()["id"]
    ]
    assert listed["authorizations"]["policies"][0]["resources"] == expected
    assert "x" * 100 not in (await client.get("/v1/keys")).text

    before = len((await client.get("/v1/keys")).json()["keys"])
    body = generate_body([{"id": mine["id"], "type": "account-functions"}], ["list_functions"])
    [policy] = body["authorizations"]["policies"]
    policy.update(aud={"nested": "x"}, auds=["ok", 7, "y" * 300], product="p" * 300)
    problem = assert_problem(await client.post("/v1/keys", json=body), 400)
    fields = [e["field"] for e in problem["errors"]]
    assert fields == [
        "authorizations.policies[0].aud",
        "authorizations.policies[0].auds",
        "authorizations.policies[0].product",
    ]
    policy.update(aud="svc", auds=["a"] * 17, product="nv-cloud-functions")
    problem = assert_problem(await client.post("/v1/keys", json=body), 400)
    assert [e["field"] for e in problem["errors"]] == ["authorizations.policies[0].auds"]
    policy["resources"] = [{"id": 42, "type": "account-functions"}]
    policy["auds"] = "not-a-list"
    problem = assert_problem(await client.post("/v1/keys", json=body), 400)
    assert [e["field"] for e in problem["errors"]] == [
        "authorizations.policies[0].resources[0].id",
        "authorizations.policies[0].auds",
    ]
    assert len((await client.get("/v1/keys")).json()["keys"]) == before


async def test_a_policy_stored_before_it_was_checked_is_shown_as_now_kept(
    client: AppClient,
) -> None:
    """A key's policies written verbatim before `POST /v1/keys` checked them are listed as
    they are kept now: `{id, type}` resources, valid `aud`/`auds`/`product` only."""
    mine = await create_fn(client)
    body = generate_body([{"id": mine["id"], "type": "account-functions"}], ["list_functions"])
    created = (await client.post("/v1/keys", json=body)).json()
    legacy = {
        "policies": [
            {
                "aud": "x" * 5000,
                "auds": ["svc", {"deep": 1}],
                "product": "nv-cloud-functions",
                "resources": [{"id": mine["id"], "type": "account-functions", "blob": "y" * 5000}],
                "scopes": ["list_functions"],
                "extra": "z" * 5000,
            }
        ]
    }
    async with client.app.state.sessionmaker() as session, session.begin():
        row = await session.get(ApiKey, uuid.UUID(created["id"]))
        assert row is not None
        row.authorizations = legacy
    resp = await client.get("/v1/keys")
    [shown] = [k for k in resp.json()["keys"] if k["id"] == created["id"]]
    assert shown["authorizations"] == {
        "policies": [
            {
                "product": "nv-cloud-functions",
                "resources": [{"id": mine["id"], "type": "account-functions"}],
                "scopes": ["list_functions"],
            }
        ]
    }
    assert "x" * 300 not in resp.text and "y" * 300 not in resp.text


async def test_list_items_and_one_key_as_nvcf_writes_them(
    client: AppClient, admin: AppClient
) -> None:
    """A listed key and `GET /v1/keys/{id}` carry what NVCF's KeyResponseBuilder writes: the
    key's masked suffix as `value` (never the key), its owner and issuer as nvcf-cli sent
    them; one key with its authorizations."""
    created = await client.post(
        "/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=CLI_HEADERS
    )
    assert created.status_code == 200, created.text
    key = created.json()
    masked = "nvapi-**********" + key["value"][-3:]
    [item] = [k for k in (await client.get("/v1/keys")).json()["keys"] if k["id"] == key["id"]]
    assert set(item) >= NVCF_KEY_FIELDS
    service = CLI_HEADERS["Key-Issuer-Id"]
    assert item["value"] == masked
    assert (item["owner_type"], item["owner_id"]) == ("USER", CLI_HEADERS["Key-Owner-Id"])
    assert item["issuer_service_id"] == service
    assert item["audience_service_ids"] == [service]

    resp = await client.get(f"/v1/keys/{key['id']}", headers=CLI_HEADERS)
    assert resp.status_code == 200, resp.text
    one = resp.json()
    assert_go_decodes(one, GO_API_KEY)
    assert NVCF_KEY_FIELDS | {"authorizations"} == set(one)
    assert one["value"] == masked and key["value"] not in resp.text
    assert one["authorizations"]["policies"][0]["resources"] == ALL
    assert one["created_at"] == key["created_at"] and one["status"] == "ACTIVE"

    other = bearer(await new_key(admin, ["admin"], account=another()))
    for missing in (str(uuid.uuid4()), "not-a-key-id"):
        assert_problem(await client.get(f"/v1/keys/{missing}"), 404)
    assert_problem(await client.get(f"/v1/keys/{key['id']}", headers=other), 404)
    no_admin = bearer(await new_key(client, ["list_functions"]))
    assert_problem(await client.get(f"/v1/keys/{key['id']}", headers=no_admin), 403)


async def test_update_authorizations_changes_what_the_key_reaches_at_once(
    client: AppClient,
) -> None:
    """`PUT /v1/keys/{id}/authorizations` replaces the key's policies (NVCF's
    UpdateAuthorizationsRequest): the key's scopes and functions change on its next request;
    a bad policy lists every violation and changes nothing."""
    mine = await create_fn(client)
    other = await create_fn(client, name="other")
    key = (await client.post("/v1/keys", json=generate_body(ALL, ["list_functions"]))).json()
    assert await works(client, key)

    narrower = generate_body([{"id": mine["id"], "type": "account-functions"}], ["list_functions"])
    resp = await client.put(
        f"/v1/keys/{key['id']}/authorizations",
        json={"authorizations": narrower["authorizations"]},
    )
    assert resp.status_code == 200, resp.text
    shown = resp.json()
    assert shown["value"] == "nvapi-**********" + key["value"][-3:]
    assert shown["authorizations"]["policies"][0]["resources"] == [
        {"id": mine["id"], "type": "account-functions"}
    ]
    listed = await client.get(f"{V}/functions", headers=bearer(key["value"]))
    assert {f["id"] for f in listed.json()["functions"]} == {mine["id"]}

    bad = {"authorizations": {"policies": [{"scopes": ["nope"], "resources": "x"}]}}
    problem = assert_problem(
        await client.put(f"/v1/keys/{key['id']}/authorizations", json=bad), 400
    )
    assert len(problem["errors"]) == 2
    assert_problem(await client.put(f"/v1/keys/{key['id']}/authorizations", json=[1]), 400)
    again = (await client.get(f"/v1/keys/{key['id']}")).json()
    assert again["authorizations"] == shown["authorizations"]  # nothing changed

    # to invoking only: listing is refused at once
    invoke = generate_body(ALL, ["invoke_function"])
    resp = await client.put(
        f"/v1/keys/{key['id']}/authorizations", json={"authorizations": invoke["authorizations"]}
    )
    assert resp.status_code == 200, resp.text
    assert_problem(await client.get(f"{V}/functions", headers=bearer(key["value"])), 403)

    # a key limited to `mine` cannot widen a key beyond it, nor touch keys out of its reach
    limited_body = generate_body(
        [{"id": mine["id"], "type": "account-functions"}], ["admin", "list_functions"]
    )
    limited = bearer((await client.post("/v1/keys", json=limited_body)).json()["value"])
    wide = generate_body([{"id": other["id"], "type": "account-functions"}], ["list_functions"])
    made = (
        await client.post("/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=limited)
    ).json()
    assert_problem(
        await client.put(
            f"/v1/keys/{made['id']}/authorizations",
            json={"authorizations": wide["authorizations"]},
            headers=limited,
        ),
        400,
    )
    assert_problem(
        await client.put(
            f"/v1/keys/{key['id']}/authorizations",
            json={"authorizations": narrower["authorizations"]},
            headers=limited,
        ),
        404,
    )

    async with client.app.state.sessionmaker() as session, session.begin():
        row = await session.get(ApiKey, uuid.UUID(key["id"]))
        assert row is not None
        row.expires_at = datetime.now(UTC) - timedelta(seconds=1)
    problem = assert_problem(
        await client.put(
            f"/v1/keys/{key['id']}/authorizations",
            json={"authorizations": narrower["authorizations"]},
        ),
        400,
    )
    assert "not active" in str(problem["errors"])


async def test_a_narrowed_key_is_shown_with_its_effective_limit(client: AppClient) -> None:
    """A key limited to F that makes a key asking for every function (`id: "*"`) makes a key
    limited to F (issue 40, D30): shown so on creation, in the list and alone, never as `*`."""
    mine = await create_fn(client)
    await create_fn(client, name="other")
    limited_body = generate_body(
        [{"id": mine["id"], "type": "account-functions"}], ["admin", "list_functions"]
    )
    limited = bearer((await client.post("/v1/keys", json=limited_body)).json()["value"])
    made = await client.post(
        "/v1/keys", json=generate_body(ALL, ["list_functions"]), headers=limited
    )
    assert made.status_code == 200, made.text
    effective = [{"id": mine["id"], "type": "account-functions"}]
    assert made.json()["authorizations"]["policies"][0]["resources"] == effective
    key_id = made.json()["id"]
    for headers in (limited, {}):
        [item] = [
            k
            for k in (await client.get("/v1/keys", headers=headers)).json()["keys"]
            if k["id"] == key_id
        ]
        assert item["authorizations"]["policies"][0]["resources"] == effective
        one = (await client.get(f"/v1/keys/{key_id}", headers=headers)).json()
        assert one["authorizations"]["policies"][0]["resources"] == effective


async def test_a_405_on_v1_keys_names_every_method_served(client: AppClient) -> None:
    """Issue 40, D29: `DELETE /v1/keys` is refused naming GET and POST, both served there."""
    resp = await client.delete("/v1/keys")
    assert_problem(resp, 405)
    assert resp.headers["allow"] == "GET, POST"
    resp = await client.post(f"/v1/keys/{uuid.uuid4()}")
    assert_problem(resp, 405)
    assert resp.headers["allow"] == "DELETE, GET"


@own_app
async def test_api_key_clear_all_as_the_cli_runs_it(client_factory: ClientFactory) -> None:
    """nvcf-cli's `init`, `api-key generate` twice, then `api-key clear-all`
    (cmd/apikey.go: `ListAPIKeys`, then `DeleteAPIKey` for each listed key), its requests as
    internal/apikeys/client.go builds them and its answers decoded into its `APIKey` struct."""
    client = await client_factory(admin_token_networks="127.0.0.0/8")
    init = await client.post("/v1/admin/keys", headers={"Authorization": ""})
    assert init.status_code == 200, init.text
    jwt_token = bearer(init.json()["value"])  # the CLI's config.Token
    made = []
    for _ in range(2):
        resp = await client.post(
            "/v1/keys",
            json=generate_body(ALL, ["invoke_function", "list_functions"]),
            headers={**jwt_token, **CLI_HEADERS, "Content-Type": "application/json"},
        )
        assert resp.status_code == 200, resp.text
        assert_go_decodes(resp.json(), GO_API_KEY)
        made.append(resp.json()["id"])
    listed = await client.get("/v1/keys", headers={**jwt_token, **CLI_HEADERS})
    assert listed.status_code == 200
    keys = listed.json()["keys"]
    assert_go_decodes(keys, ListOf(GO_API_KEY))
    assert set(made) <= {k["id"] for k in keys}
    for key in keys:
        if key["id"] in made:
            assert (await as_the_cli_deletes(client, key["id"])).status_code == 204
    left = (await client.get("/v1/keys", headers={**jwt_token, **CLI_HEADERS})).json()["keys"]
    assert not set(made) & {k["id"] for k in left}

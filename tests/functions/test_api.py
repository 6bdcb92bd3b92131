"""The function registry over HTTP (api.md §2), on SQLite and PostgreSQL.

The tests share one app per database, each in an account of its own (`client`; `admin` is the
operator's client of the same app)."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.support.api import CONTAINER_FN, bearer, create_fn, new_key
from tests.support.app import AppClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

V = "/v2/nvcf"


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


def another() -> str:
    return f"other-{uuid.uuid4().hex[:12]}"


async def test_create_returns_the_function_object(client: httpx.AsyncClient, tenant: str) -> None:
    resp = await client.post(
        f"{V}/functions",
        json={
            **CONTAINER_FN,
            "tags": ["team:a", "prod"],
            "secrets": [{"name": "api-token", "value": "s3cr3t-value"}],
            "containerEnvironment": [{"key": "MODE", "value": "fast"}],
            "rateLimit": {"rateLimit": "10-S"},
        },
    )
    assert resp.status_code == 200
    fn = resp.json()["function"]
    uuid.UUID(fn["id"]), uuid.UUID(fn["versionId"])
    assert fn["status"] == "INACTIVE"
    assert fn["ncaId"] == tenant
    assert fn["createdAt"].endswith("Z")
    assert fn["description"] == "echo"
    assert fn["health"] == {
        "protocol": "HTTP",
        "uri": "/v2/health/ready",
        "port": 8000,
        "timeout": "PT10S",
        "expectedStatusCode": 200,
    }
    assert fn["secrets"] == ["api-token"]  # names only, as NVCF's FunctionDto
    assert "s3cr3t-value" not in resp.text
    assert "helmChart" not in fn  # nulls are omitted
    assert fn["tags"] == ["team:a", "prod"]
    assert fn["rateLimit"] == {"rateLimit": "10-S"}


async def test_versions_list_get_update_delete(client: httpx.AsyncClient) -> None:
    first = await create_fn(client)
    fid = first["id"]
    resp = await client.post(
        f"{V}/functions/{fid}/versions", json={**CONTAINER_FN, "description": "v2"}
    )
    assert resp.status_code == 200
    second = resp.json()["function"]
    assert second["id"] == fid and second["versionId"] != first["versionId"]

    versions = (await client.get(f"{V}/functions/{fid}/versions")).json()["functions"]
    assert [v["versionId"] for v in versions] == [first["versionId"], second["versionId"]]

    got = await client.get(f"{V}/functions/{fid}/versions/{second['versionId']}")
    assert got.status_code == 200 and got.json()["function"]["description"] == "v2"
    # the admin key holds list_functions_details: the instance list comes with it
    assert got.json()["function"]["activeInstances"] == []

    ids = (await client.get(f"{V}/functions/ids")).json()["functionIds"]
    assert ids == [fid]

    upd = await client.put(
        f"{V}/functions/{fid}/versions/{first['versionId']}",
        json={"tags": ["x"], "description": "changed", "name": "ignored"},
    )
    assert upd.status_code == 200
    assert upd.json()["function"]["tags"] == ["x"]
    assert upd.json()["function"]["description"] == "changed"
    assert upd.json()["function"]["name"] == "echo"
    alias = await client.put(
        f"{V}/metadata/functions/{fid}/versions/{first['versionId']}",
        json={"rateLimit": {"rateLimit": "5-M"}},
    )
    assert alias.status_code == 200 and alias.json()["function"]["rateLimit"] == {
        "rateLimit": "5-M"
    }
    empty = await client.put(f"{V}/functions/{fid}/versions/{first['versionId']}", json={})
    assert empty.status_code == 400

    deleted = await client.delete(f"{V}/functions/{fid}/versions/{first['versionId']}")
    assert deleted.status_code == 204 and deleted.content == b""
    gone = await client.get(f"{V}/functions/{fid}/versions/{first['versionId']}")
    assert gone.status_code == 404
    assert (
        await client.delete(f"{V}/functions/{fid}/versions/{second['versionId']}")
    ).status_code == 204
    assert (await client.get(f"{V}/functions/{fid}/versions")).status_code == 404
    assert (await client.get(f"{V}/functions/ids")).json()["functionIds"] == []


async def test_create_version_of_unknown_function_is_404_and_stores_nothing(
    client: httpx.AsyncClient,
) -> None:
    resp = await client.post(f"{V}/functions/{uuid.uuid4()}/versions", json=CONTAINER_FN)
    assert resp.status_code == 404
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_non_uuid_path_is_400(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{V}/functions/not-a-uuid/versions")
    assert resp.status_code == 400
    assert resp.json()["errors"] == [
        {"field": "functionId", "message": "'not-a-uuid' is not a UUID"}
    ]


async def test_invalid_body_lists_every_violation_and_stores_nothing(
    client: httpx.AsyncClient,
) -> None:
    resp = await client.post(
        f"{V}/functions",
        json={
            "name": "bad name!",
            "inferenceUrl": "",
            "inferencePort": 70000,
            "helmChart": "oci://reg.example.com/c/chart_x-1.0.0-rc1.tgz",
            "helmChartServiceName": "Svc",
        },
    )
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["type"] == "urn:nvcf:problem-details:bad-request"
    fields = [e["field"] for e in body["errors"]]
    for f in ("name", "inferenceUrl", "inferencePort", "helmChartServiceName", "helmChart"):
        assert f in fields, body
    assert body["requestId"] == resp.headers["x-request-id"]
    assert body["instance"] == "/v2/nvcf/functions"
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_list_filters_and_pagination(client: httpx.AsyncClient) -> None:
    made = []
    for i in range(7):
        made.append(
            await create_fn(client, name=f"fn-{i % 2}", tags=["even"] if i % 2 == 0 else ["odd"])
        )
    all_ = (await client.get(f"{V}/functions")).json()
    assert [f["versionId"] for f in all_["functions"]] == [m["versionId"] for m in made]
    assert "nextCursor" not in all_

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = (await client.get(f"{V}/functions", params=params)).json()
        seen += [f["versionId"] for f in page["functions"]]
        pages += 1
        cursor = page.get("nextCursor")
        if not cursor:
            break
    assert seen == [m["versionId"] for m in made] and pages == 3

    named = (await client.get(f"{V}/functions", params={"name": "fn-1"})).json()["functions"]
    assert len(named) == 3 and {f["name"] for f in named} == {"fn-1"}
    tagged = (await client.get(f"{V}/functions", params={"tag": "even"})).json()["functions"]
    assert len(tagged) == 4
    inactive = (await client.get(f"{V}/functions", params={"status": "inactive"})).json()[
        "functions"
    ]
    assert len(inactive) == 7
    active = (await client.get(f"{V}/functions", params={"status": "ACTIVE"})).json()["functions"]
    assert active == []


async def test_bad_list_parameters_are_400(client: httpx.AsyncClient) -> None:
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"cursor": "garbage"}, "cursor"),
        ({"status": "SLEEPING"}, "status"),
    ):
        resp = await client.get(f"{V}/functions", params=params)
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json()["errors"][0]["field"] == field


async def test_org_aliases_serve_every_route(client: httpx.AsyncClient, tenant: str) -> None:
    for prefix in (f"/v2/orgs/{tenant}/nvcf", f"/v2/orgs/{tenant}/teams/ml/nvcf"):
        resp = await client.post(f"{prefix}/functions", json=CONTAINER_FN)
        assert resp.status_code == 200, resp.text
        fn = resp.json()["function"]
        got = await client.get(f"{prefix}/functions/{fn['id']}/versions/{fn['versionId']}")
        assert got.status_code == 200
        listed = await client.get(f"{prefix}/functions")
        assert fn["versionId"] in [f["versionId"] for f in listed.json()["functions"]]
        assert (
            await client.delete(f"{prefix}/functions/{fn['id']}/versions/{fn['versionId']}")
        ).status_code == 204


async def test_org_alias_naming_another_org_is_403(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v2/orgs/someone-else/nvcf/functions")
    assert resp.status_code == 403
    assert "someone-else" in resp.json()["detail"]
    resp = await client.post("/v2/orgs/someone-else/teams/t/nvcf/functions", json=CONTAINER_FN)
    assert resp.status_code == 403
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_accounts_are_isolated(client: httpx.AsyncClient, admin: AppClient) -> None:
    fn = await create_fn(client)
    other = bearer(
        await new_key(
            admin,
            ["list_functions", "update_function", "delete_function", "register_function"],
            account=another(),
        )
    )
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(path, headers=other)).status_code == 404
    assert (
        await client.get(f"{V}/functions/{fn['id']}/versions", headers=other)
    ).status_code == 404
    assert (await client.put(path, json={"description": "x"}, headers=other)).status_code == 404
    assert (await client.delete(path, headers=other)).status_code == 404
    resp = await client.post(f"{V}/functions/{fn['id']}/versions", json=CONTAINER_FN, headers=other)
    assert resp.status_code == 404
    assert (await client.get(f"{V}/functions", headers=other)).json()["functions"] == []
    assert (await client.get(f"{V}/functions/ids", headers=other)).json()["functionIds"] == []
    # the owner still sees it, unchanged
    assert (await client.get(path)).json()["function"]["description"] == "echo"


async def test_secrets_are_encrypted_at_rest(client: AppClient) -> None:
    fn = await create_fn(client, secrets=[{"name": "token", "value": "plain-text-secret-123"}])
    from sqlalchemy import text

    async with client.app.state.sessionmaker() as session:
        rows = (
            await session.execute(
                text("SELECT name, ciphertext FROM function_secrets WHERE version_id = :v"),
                {"v": fn["versionId"]},
            )
        ).all()
    assert [r[0] for r in rows] == ["token"]
    assert "plain-text-secret-123" not in rows[0][1]


async def test_idempotent_create_replays_the_first_response(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "create-echo-1"}
    first = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers)
    again = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert len((await client.get(f"{V}/functions")).json()["functions"]) == 1

    clash = await client.post(
        f"{V}/functions", json={**CONTAINER_FN, "name": "other"}, headers=headers
    )
    assert clash.status_code == 409
    assert "different request body" in clash.json()["detail"]
    assert len((await client.get(f"{V}/functions")).json()["functions"]) == 1


async def test_concurrent_creates_with_one_key_create_exactly_one(
    client: httpx.AsyncClient,
) -> None:
    headers = {"Idempotency-Key": "race-1"}
    responses = await asyncio.gather(
        *[client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers) for _ in range(8)]
    )
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["function"]["versionId"] for r in responses}) == 1
    assert len((await client.get(f"{V}/functions")).json()["functions"]) == 1


async def test_failed_request_does_not_burn_the_idempotency_key(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "k-2"}
    bad = await client.post(
        f"{V}/functions", json={**CONTAINER_FN, "name": "bad name"}, headers=headers
    )
    assert bad.status_code == 400
    good = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers)
    assert good.status_code == 200


async def test_idempotency_keys_are_per_account(
    client: httpx.AsyncClient, admin: AppClient
) -> None:
    scopes = ["register_function", "list_functions"]
    other = bearer(await new_key(admin, scopes, account=another()))
    headers = {"Idempotency-Key": "shared"}
    a = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers)
    b = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=headers | other)
    assert a.status_code == b.status_code == 200
    assert a.json()["function"]["id"] != b.json()["function"]["id"]


async def test_every_malformed_path_id_is_reported(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{V}/functions/x/versions/y")
    assert resp.status_code == 400
    assert [e["field"] for e in resp.json()["errors"]] == ["functionId", "functionVersionId"]


async def test_the_ratelimit_routes_set_and_remove_a_versions_rate_limit(
    client: httpx.AsyncClient, admin: AppClient, tenant: str
) -> None:
    fn = await create_fn(client, rateLimit={"rateLimit": "10-S"})
    fid, vid = fn["id"], fn["versionId"]
    url = f"{V}/ratelimit/functions/{fid}/versions/{vid}"
    version = f"{V}/functions/{fid}/versions/{vid}"

    put = await client.put(url, json={"rateLimit": {"rateLimit": "3-M", "syncCheck": True}})
    assert put.status_code == 204 and put.content == b""
    shown = (await client.get(version)).json()["function"]
    assert shown["rateLimit"] == {"rateLimit": "3-M", "syncCheck": True}

    deleted = await client.delete(url)
    assert deleted.status_code == 204 and deleted.content == b""
    assert "rateLimit" not in (await client.get(version)).json()["function"]
    assert (await client.delete(url)).status_code == 204  # none left: still 204

    # refusals: the body as the version update's, the scope, ids, other accounts
    bad = await client.put(url, json={"rateLimit": {"rateLimit": "often"}})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"].startswith("rateLimit")
    reader = bearer(await new_key(admin, ["list_functions"], account=tenant))
    for method in ("PUT", "DELETE"):
        body = {"json": {"rateLimit": {"rateLimit": "1-S"}}} if method == "PUT" else {}
        resp = await client.request(method, url, headers=reader, **body)  # type: ignore[arg-type]
        assert resp.status_code == 403, resp.text
        assert "update_function" in resp.json()["detail"]
    other = bearer(await new_key(admin, ["update_function"], account=another()))
    assert (await client.delete(url, headers=other)).status_code == 404
    unknown = f"{V}/ratelimit/functions/{fid}/versions/{uuid.uuid4()}"
    assert (await client.delete(unknown)).status_code == 404
    malformed = await client.delete(f"{V}/ratelimit/functions/{fid}/versions/v1")
    assert malformed.status_code == 400
    assert malformed.json()["errors"] == [{"field": "versionId", "message": "'v1' is not a UUID"}]
    assert "rateLimit" not in (await client.get(version)).json()["function"]

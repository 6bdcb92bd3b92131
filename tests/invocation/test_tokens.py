"""Invocation tokens (NVCF's `POST /v2/nvcf/tokens/functions...`): a token issued for function
A invokes A through every invocation entry and polls its requests; it is refused for B and by
every other route, refused once expired, and never issued for a function the caller may not
invoke. The app runs with no JWT setting: tokens need none.

The tests on `client` share one app per database, each invoking only functions it deployed."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, until_status
from tests.support.invocation import (
    FAST,
    deployed,
    invocation_app,
    pexec_url,
    spec,
    write_catalog,
)

SUFFIX = "invocation.localhost"
TOKENS = f"{V}/tokens/functions"


pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    catalog = write_catalog(tmp_path_factory.mktemp("catalog"), gpus=64)
    return {
        "clusters_file": catalog,
        **FAST,
        "invoke_host_suffix": SUFFIX,
        "jwt_secret": None,
    }


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


async def issue(
    client: AppClient, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, str]:
    resp = await client.post(f"{TOKENS}{path}", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert set(answer) == {"access_token", "expires_in"}
    assert answer["expires_in"] == client.app.state.settings.invoke_token_seconds
    return bearer(answer["access_token"])


async def test_a_token_invokes_its_function_through_every_entry_and_nothing_else(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    a, b = await deployed(client), await deployed(client, name="other")
    token = await issue(client, f"/{a['id']}", {"clientId": "browser-1"})
    fid, vid = a["id"], a["versionId"]
    answers = {
        "pexec": await client.post(pexec_url(a), json=1, headers=token),
        "pexec-function": await client.post(pexec_url(a, version=False), json=2, headers=token),
        "exec": await client.post(
            f"{V}/exec/functions/{fid}", json={"requestBody": 3}, headers=token
        ),
        "header": await client.post("/echo", json=4, headers={**token, "function-id": fid}),
        "host": await client.post("/echo", json=5, headers={**token, "Host": f"{fid}.{SUFFIX}"}),
        "org": await client.post(
            f"/v2/orgs/{a['ncaId']}/nvcf/pexec/functions/{fid}", json=6, headers=token
        ),
    }
    for name, resp in answers.items():
        assert resp.status_code == 200, (name, resp.text)
        body = resp.json()
        sent = body.get("response", body)["headers"]
        assert sent["NVCF-SUB"] == "browser-1", name  # the client id is the token's subject
        assert sent["NVCF-NCAID"] == a["ncaId"], name
        assert sent["NVCF-FUNCTION-VERSION-ID"] == vid, name
        assert "authorization" not in {k.lower() for k in sent}, name
    # its own slow request is polled with it
    slow = {**token, "NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "1500"}
    resp = await client.post(pexec_url(a), json="later", headers=slow)
    assert resp.status_code == 202, resp.text
    status = await client.get(f"{V}/pexec/status/{resp.headers['nvcf-reqid']}", headers=token)
    assert status.status_code == 200 and status.json()["echo"] == "later"
    # function B, by every entry: refused, naming why
    for resp in (
        await client.post(pexec_url(b), json={}, headers=token),
        await client.post(f"{V}/exec/functions/{b['id']}", json={"requestBody": 1}, headers=token),
        await client.post("/echo", json={}, headers={**token, "function-id": b["id"]}),
        await client.post("/echo", json={}, headers={**token, "Host": f"{b['id']}.{SUFFIX}"}),
        await client.post(f"{V}/pexec/functions/{uuid.uuid4()}", json={}, headers=token),
    ):
        problem = assert_problem(resp, 403)
        assert "invocation token does not allow" in str(problem["detail"])
        assert resp.headers["nvcf-status"] == "errored"
    # B's requests are not its to poll, even of the same account
    resp = await client.post(
        pexec_url(b), json={}, headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "1500"}
    )
    assert resp.status_code == 202
    assert_problem(
        await client.get(f"{V}/pexec/status/{resp.headers['nvcf-reqid']}", headers=token), 404
    )
    # every route that is not an invocation refuses it
    for resp in (
        await client.get(f"{V}/functions", headers=token),
        await client.get(f"{V}/functions/{fid}/versions/{vid}", headers=token),
        await client.post(f"{V}/api-keys", json={"scopes": ["invoke_function"]}, headers=token),
        await client.get(f"{V}/queues/functions/{fid}", headers=token),
        await client.get(f"{V}/deployments/functions/{fid}/versions/{vid}", headers=token),
    ):
        problem = assert_problem(resp, 403)
        detail = str(problem["detail"])
        assert "an invocation token may only invoke" in detail, detail
    # a token is a secret: no log record holds it
    secret = token["Authorization"].split()[1]
    assert all(secret not in record.getMessage() for record in caplog.records)


async def test_a_token_for_one_version_and_for_several_functions(client: AppClient) -> None:
    a, b = await deployed(client), await deployed(client, name="other")
    token = await issue(client, f"/{a['id']}/versions/{a['versionId']}", {"clientId": "c"})
    assert (await client.post(pexec_url(a), json={}, headers=token)).status_code == 200
    resp = await client.post(pexec_url(a, version=False), json={}, headers=token)
    assert (
        resp.status_code == 200
        and resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == a["versionId"]
    )
    other_version = f"{V}/pexec/functions/{a['id']}/versions/{uuid.uuid4()}"
    assert_problem(await client.post(other_version, json={}, headers=token), 403)
    both = await issue(
        client,
        "",
        {
            "functions": [
                {"functionId": a["id"]},
                {"functionId": b["id"], "functionVersionId": b["versionId"]},
            ],
            "clientId": "partner",
        },
    )
    for fn in (a, b):
        resp = await client.post(pexec_url(fn), json={}, headers=both)
        assert resp.status_code == 200, resp.text
        assert resp.json()["headers"]["NVCF-SUB"] == "partner"


async def test_a_token_for_an_older_version_never_reaches_the_newer_one(client: AppClient) -> None:
    """The account's own view (the newest version, cached for it) and a token's narrower one
    are kept apart."""
    old = await deployed(client)
    resp = await client.post(f"{V}/functions/{old['id']}/versions", json=CONTAINER_FN)
    assert resp.status_code == 200, resp.text
    new = dict(resp.json()["function"])
    resp = await client.post(dep_url(new), json={"deploymentSpecifications": [spec()]})
    assert resp.status_code == 200, resp.text
    await until_status(client, new, "ACTIVE")
    latest = await client.post(pexec_url(old, version=False), json={})
    assert latest.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == new["versionId"]
    token = await issue(client, f"/{old['id']}/versions/{old['versionId']}", {"clientId": "c"})
    for _ in range(2):  # the second from the route cache
        resp = await client.post(pexec_url(old, version=False), json={}, headers=token)
        assert resp.status_code == 200, resp.text
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == old["versionId"]
    assert_problem(await client.post(pexec_url(new), json={}, headers=token), 403)
    latest = await client.post(pexec_url(old, version=False), json={})
    assert latest.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == new["versionId"]


async def test_a_token_is_issued_only_for_what_the_caller_may_invoke(client: AppClient) -> None:
    a = await deployed(client)
    c = bearer(await new_key(client, ["invoke_function"], "acct-c"))
    for path, body in (
        (f"/{a['id']}", {"clientId": "x"}),
        (f"/{a['id']}/versions/{a['versionId']}", {"clientId": "x"}),
        ("", {"functions": [{"functionId": a["id"]}], "clientId": "x"}),
    ):
        problem = assert_problem(await client.post(f"{TOKENS}{path}", json=body, headers=c), 404)
        assert a["id"] in str(problem["detail"])
    # the owner neither, for a function that does not exist or a version of another one
    unknown = str(uuid.uuid4())
    body = {"functions": [{"functionId": a["id"]}, {"functionId": unknown}], "clientId": "x"}
    problem = assert_problem(await client.post(TOKENS, json=body), 404)
    assert unknown in str(problem["detail"]) and a["id"] not in str(problem["detail"])
    path = f"{TOKENS}/{a['id']}/versions/{uuid.uuid4()}"
    assert_problem(await client.post(path, json={"clientId": "x"}), 404)
    # without the invoke scope: 403
    lister = bearer(await new_key(client, ["list_functions"]))
    problem = assert_problem(
        await client.post(f"{TOKENS}/{a['id']}", json={"clientId": "x"}, headers=lister), 403
    )
    assert "invoke_function" in str(problem["detail"])
    # an account the function is shared with may ask, until the share is revoked
    share = {"authorizedParties": [{"ncaId": "acct-c"}]}
    assert (
        await client.post(f"{V}/authorizations/functions/{a['id']}", json=share)
    ).status_code == 200
    token = await issue(client, f"/{a['id']}", {"clientId": "x"}, headers=c)
    resp = await client.post(pexec_url(a), json={}, headers=token)
    assert resp.status_code == 200 and resp.json()["headers"]["NVCF-NCAID"] == "acct-c"
    assert (await client.delete(f"{V}/authorizations/functions/{a['id']}")).status_code == 200
    assert_problem(await client.post(pexec_url(a), json={}, headers=token), 404)


async def test_bad_bodies_are_400_listing_every_violation(client: AppClient) -> None:
    fn = await create_fn(client)
    cases: list[tuple[str, Any, list[str]]] = [
        (f"/{fn['id']}", {}, ["clientId"]),
        (f"/{fn['id']}", {"clientId": "  "}, ["clientId"]),
        (f"/{fn['id']}", {"clientId": "x" * 129}, ["clientId"]),
        (
            "/not-a-uuid/versions/nope",
            {"clientId": ""},
            ["functionId", "functionVersionId", "clientId"],
        ),
        ("/not-a-uuid", [], ["functionId", "body"]),
        ("", {}, ["functions", "clientId"]),
        ("", {"functions": None, "clientId": "x"}, ["functions"]),
        ("", {"functions": {}, "clientId": "x"}, ["functions"]),
        (
            "",
            {"functions": [{"functionId": fn["id"]}] * 4 + [{"functionId": "bad"}], "clientId": 5},
            ["functions", "functions[4].functionId", "clientId"],
        ),
        (
            "",
            {"functions": [{"functionVersionId": fn["versionId"]}], "clientId": "x"},
            ["functions[0].functionId"],
        ),
    ]
    for path, body, fields in cases:
        resp = await client.post(f"{TOKENS}{path}", json=body)
        problem = assert_problem(resp, 400)
        named = sorted({str(e["field"]) for e in problem["errors"]})
        assert named == sorted(fields), (path, body, problem)


@own_app
async def test_an_expired_or_forged_token_is_401(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path, invoke_token_seconds=1)
    fn = await create_fn(client)
    token = await issue(client, f"/{fn['id']}", {"clientId": "x"})
    forged = token["Authorization"][:-4] + (
        "AAAA" if not token["Authorization"].endswith("AAAA") else "BBBB"
    )
    problem = assert_problem(
        await client.post(pexec_url(fn), json={}, headers={"Authorization": forged}), 401
    )
    assert "signature" in str(problem["detail"])
    await asyncio.sleep(2.5)  # past its expiry (a whole second's resolution)
    for resp in (
        await client.post(pexec_url(fn), json={}, headers=token),
        await client.post("/echo", json={}, headers={**token, "function-id": fn["id"]}),
        await client.get(f"{V}/functions", headers=token),
    ):
        problem = assert_problem(resp, 401)
        assert "expired" in str(problem["detail"])


@own_app
async def test_replicas_sharing_the_secret_key_accept_each_others_tokens(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    one = await invocation_app(client_factory, tmp_path)
    fn = await create_fn(one)  # not deployed: a token that passes is told the version's status
    token = await issue(one, f"/{fn['id']}", {"clientId": "x"})
    # a second replica on the same data (database and secret key) takes it as the first does
    two = await invocation_app(client_factory, tmp_path)
    for replica in (one, two):
        problem = assert_problem(await replica.post(pexec_url(fn), json={}, headers=token), 400)
        assert "INACTIVE" in str(problem["detail"])
    # a server with another secret key does not
    other = await invocation_app(client_factory, tmp_path, data_dir=tmp_path / "elsewhere")
    problem = assert_problem(await other.post(pexec_url(fn), json={}, headers=token), 401)
    assert "signature" in str(problem["detail"])


async def test_a_token_never_outlives_the_key_that_asked_for_it(client: AppClient) -> None:
    """A key with less life left than NVCF_INVOKE_TOKEN_SECONDS gets a token that expires with
    it (`expires_in` and the token's `exp` both cut); a longer-lived key the full lifetime."""
    fn = await create_fn(client)
    resp = await client.post(
        f"{V}/api-keys", json={"scopes": ["invoke_function"], "expiresIn": "PT2M"}
    )
    assert resp.status_code == 200, resp.text
    key_expiry = datetime.fromisoformat(resp.json()["apiKey"]["expiresAt"].replace("Z", "+00:00"))
    short = bearer(resp.json()["apiKey"]["key"])
    assert client.app.state.settings.invoke_token_seconds > 120
    for path, body in (
        (f"/{fn['id']}", {"clientId": "x"}),
        (f"/{fn['id']}/versions/{fn['versionId']}", {"clientId": "x"}),
        ("", {"clientId": "x", "functions": [{"functionId": fn["id"]}]}),
    ):
        resp = await client.post(f"{TOKENS}{path}", json=body, headers=short)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert 0 < answer["expires_in"] <= 120
        claims = jwt.decode(answer["access_token"], options={"verify_signature": False})
        assert claims["exp"] <= key_expiry.timestamp()
        assert claims["exp"] - claims["iat"] == answer["expires_in"]
        token = bearer(answer["access_token"])
        assert (await client.post(pexec_url(fn), json={}, headers=token)).status_code == 400
    long_lived = bearer(await new_key(client, ["invoke_function"], expires_in="P1D"))
    await issue(client, f"/{fn['id']}", {"clientId": "x"}, long_lived)  # the full lifetime


async def test_one_token_uploads_an_asset_and_invokes_as_on_nvcf(client: AppClient) -> None:
    """Issue 43: NVCF takes an invocation token wherever it takes `invoke_function`: the asset
    routes and the token routes too, so a browser holding one token uploads an asset and
    invokes with it. A token asks only for a token within its own grant, never outliving it;
    `functions: []` is a token for the account's assets alone."""
    a, b = await deployed(client), await deployed(client, name="other")
    token = await issue(client, "", {"functions": [{"functionId": a["id"]}], "clientId": "web"})
    made = await client.post(
        f"{V}/assets", json={"contentType": "text/plain", "description": "in"}, headers=token
    )
    assert made.status_code == 200, made.text
    asset = made.json()
    put = await client.put(asset["uploadUrl"], content=b"hello", headers={"Authorization": ""})
    assert put.status_code == 200, put.text
    listed = await client.get(f"{V}/assets", headers=token)
    assert [x["assetId"] for x in listed.json()["assets"]] == [asset["assetId"]]
    shown = await client.get(f"{V}/assets/{asset['assetId']}", headers=token)
    assert shown.status_code == 200, shown.text
    resp = await client.post(
        pexec_url(a),
        json={},
        headers={**token, "NVCF-INPUT-ASSET-REFERENCES": asset["assetId"]},
    )
    assert resp.status_code == 200, resp.text

    again = await client.post(f"{TOKENS}/{a['id']}", json={"clientId": "again"}, headers=token)
    assert again.status_code == 200, again.text
    first = jwt.decode(token["Authorization"].split()[1], options={"verify_signature": False})
    second = jwt.decode(again.json()["access_token"], options={"verify_signature": False})
    assert second["exp"] <= first["exp"]
    assert (
        await client.post(pexec_url(a), json={}, headers=bearer(again.json()["access_token"]))
    ).status_code == 200
    # nothing beyond its own grant
    assert_problem(
        await client.post(f"{TOKENS}/{b['id']}", json={"clientId": "x"}, headers=token), 404
    )

    assets_only = await issue(client, "", {"functions": [], "clientId": "uploader"})
    made = await client.post(
        f"{V}/assets", json={"contentType": "text/plain", "description": ""}, headers=assets_only
    )
    assert made.status_code == 200, made.text
    assert_problem(await client.post(pexec_url(a), json={}, headers=assets_only), 403)
    assert (
        await client.delete(f"{V}/assets/{asset['assetId']}", headers=assets_only)
    ).status_code == 204


@own_app
async def test_issuing_counts_against_the_accounts_rate_limit(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Issue 43: each token issued counts against the account's API rate limit, as NVCF's
    `verifyLimits` (429 past it; another account is not held back)."""
    client = await invocation_app(
        client_factory, tmp_path, rate_limit_per_second=0.001, rate_limit_burst=4
    )
    fn = await create_fn(client)  # with the key below, two requests of the burst
    other = bearer(await new_key(client, ["invoke_function"], account="other-account"))
    answers = [await client.post(f"{TOKENS}/{fn['id']}", json={"clientId": "x"}) for _ in range(3)]
    assert [r.status_code for r in answers[:2]] == [200, 200]
    assert_problem(answers[2], 429)
    resp = await client.post(TOKENS, json={"functions": [], "clientId": "x"})
    assert_problem(resp, 429)
    resp = await client.post(TOKENS, json={"functions": [], "clientId": "x"}, headers=other)
    assert resp.status_code == 200, resp.text

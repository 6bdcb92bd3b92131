"""ngcsdk's `Client().configure(api_key=..., org_name=...)` against this server: its requests
replayed exactly (tests/support/ngcsdk.py), its answers decoded as ngcbase does; the NGC
endpoints' error paths (bad key, key of another org, bad input): 400/401/403 problem+json
carrying NGC's `requestStatus`, never the credential."""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import pytest

from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import ADMIN_KEY, JWT_SECRET, AppClient
from tests.support.ngcsdk import (
    AccessDeniedException,
    AuthenticationException,
    ConfigError,
    NgcSdk,
    Sent,
)

# one app per database for the module: each test makes the keys it uses, and the refusals
# change nothing
pytestmark = pytest.mark.asyncio(loop_scope="module")

CALLER_INFO = "/v3/keys/get-caller-info"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CALLER = Sent("POST", CALLER_INFO, 200)


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def hs256(account: str, scopes: list[str]) -> str:
    claims = {"sub": account, "scopes": scopes, "exp": int(time.time()) + 600}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


async def acme_key(client: httpx.AsyncClient, scopes: list[str] | None = None) -> str:
    return await new_key(client, scopes or ["list_functions"], account="acme")


def ngc_problem(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """problem+json with NGC's error shape alongside: requestStatus{statusCode, ...}."""
    body = assert_problem(resp, status)
    assert body["requestStatus"] == {
        "statusCode": code,
        "statusDescription": body["detail"],
        "requestId": body["requestId"],
    }
    return body


def no_secret(resp: httpx.Response, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in resp.text
        assert all(secret not in v for v in resp.headers.values())


# --- the configure sequence ----------------------------------------------------------------


async def test_configure_with_a_key_asks_caller_info_twice_and_takes_its_org(
    client: AppClient,
) -> None:
    key = await acme_key(client)
    sdk = NgcSdk(client)
    await sdk.configure(api_key=key, org_name="acme")
    # Client.configure: _get_org; validate_configuration → _check_org: SERVICE_KEY, done
    assert sdk.sent == [CALLER, CALLER]
    assert sdk.org == "acme"

    without_org = NgcSdk(client)
    await without_org.configure(api_key=key)
    assert without_org.org == "acme"  # the key's org is taken


async def test_caller_info_answers_in_ngcs_shape(client: AppClient) -> None:
    key = await new_key(client, ["invoke_function"], account="acme")  # any scope will do
    resp = await client.post(
        CALLER_INFO, content=urlencode({"credentials": key}), headers={**FORM, "Authorization": ""}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body == {
        "type": "SERVICE_KEY",
        "orgName": "acme",
        "products": ["nv-cloud-functions"],
        "requestStatus": {"statusCode": "SUCCESS", "requestId": resp.headers["x-request-id"]},
    }
    no_secret(resp, key)


async def test_caller_info_also_takes_the_key_from_json_or_the_authorization_header(
    client: AppClient,
) -> None:
    key = await acme_key(client)
    by_json = await client.post(CALLER_INFO, json={"credentials": key}, headers=bearer("x"))
    by_post_header = await client.post(CALLER_INFO, headers=bearer(key))
    by_get = await client.get(CALLER_INFO, headers=bearer(key))
    for resp in (by_json, by_post_header, by_get):
        assert resp.status_code == 200, resp.text
        assert resp.json()["orgName"] == "acme"
    # the body's credential is the one described, not the header's
    admin = await client.post(
        CALLER_INFO, content=urlencode({"credentials": ADMIN_KEY}), headers=bearer(key) | FORM
    )
    assert admin.json()["orgName"] != "acme"


async def test_configure_with_a_jwt_checks_the_org_in_the_org_list(client: AppClient) -> None:
    token = hs256("acme", ["list_functions"])
    sdk = NgcSdk(client)
    await sdk.configure(api_key=token, org_name="acme")
    assert sdk.sent == [Sent("GET", "/v2/orgs", 200)]  # no caller info, no token exchange
    resp = await client.get("/v2/orgs?page-size=500", headers=bearer(token))
    body = resp.json()
    assert body["organizations"] == [
        {
            "name": "acme",
            "displayName": "acme",
            "description": "account 'acme' of this NVCF server",
            "type": "ENTERPRISE",
        }
    ]
    assert body["paginationInfo"] == {"index": 0, "size": 500, "totalResults": 1, "totalPages": 1}
    assert body["requestStatus"]["statusCode"] == "SUCCESS"
    later = await client.get("/v2/orgs?page-size=500&page-number=1", headers=bearer(token))
    assert later.json()["organizations"] == []

    with pytest.raises(ConfigError, match=r"Invalid org. Choose from \['acme'\]"):
        await NgcSdk(client).configure(api_key=token, org_name="other")


async def test_caller_info_describes_a_jwt_as_its_account(client: AppClient) -> None:
    token = hs256("acme", ["list_functions"])
    resp = await client.post(CALLER_INFO, content=urlencode({"credentials": token}), headers=FORM)
    assert resp.json()["orgName"] == "acme" and resp.json()["type"] == "SERVICE_KEY"


# --- errors -------------------------------------------------------------------------------


async def test_a_wrong_key_is_ngcs_401_and_configure_fails(client: AppClient) -> None:
    wrong = "nvapi-" + "w" * 60
    with pytest.raises(AuthenticationException) as caught:
        await NgcSdk(client).configure(api_key=wrong, org_name="acme")
    resp = caught.value.response
    body = ngc_problem(resp, 401, "UNAUTHORIZED")
    assert body["detail"] == "unknown API key"
    assert body["instance"] == CALLER_INFO
    no_secret(resp, wrong)


@pytest.mark.parametrize(
    "credential",
    [
        "not-a-key",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhY21lIn0.c2ln",  # a JWT with a bad signature
        jwt.encode({"sub": "acme", "exp": 1}, JWT_SECRET, algorithm="HS256"),  # expired
        "nvapi-" + "é\x00" * 10,
        " ",
    ],
)
async def test_any_bad_credential_is_401_without_echoing_it(
    client: AppClient, credential: str
) -> None:
    resp = await client.post(
        CALLER_INFO, content=urlencode({"credentials": credential}), headers=FORM
    )
    ngc_problem(resp, 401, "UNAUTHORIZED")
    if credential.strip():
        no_secret(resp, credential)


async def test_a_key_of_another_org(client: AppClient) -> None:
    key = await acme_key(client, ["list_functions", "register_function"])
    # ngcsdk itself refuses a configured org other than the key's
    with pytest.raises(ConfigError, match="doesn't match organization"):
        await NgcSdk(client).configure(api_key=key, org_name="other")
    # the server refuses another org's paths: the NVCF alias and the registry look-up
    sdk = NgcSdk(client)
    await sdk.configure(api_key=key, org_name="acme")
    sdk.org = "other"
    with pytest.raises(AccessDeniedException) as caught:
        await sdk.list_functions()
    assert (
        "organization 'other' in the path is not the caller's account"
        in (caught.value.response.json()["detail"])
    )
    with pytest.raises(AccessDeniedException) as caught:
        await sdk.request("GET", "v2/org/other/repos/echo/images/1.0")
    body = ngc_problem(caught.value.response, 403, "FORBIDDEN")
    assert "'other'" in body["detail"]
    no_secret(caught.value.response, key)


async def test_no_credential_is_401(client: AppClient) -> None:
    for resp in (
        await client.post(CALLER_INFO, content=b"", headers={**FORM, "Authorization": ""}),
        await client.get(CALLER_INFO, headers={"Authorization": ""}),
        await client.post(CALLER_INFO, content=b"other=1", headers={**FORM, "Authorization": ""}),
        await client.get("/v2/orgs", headers={"Authorization": ""}),
        await client.get("/v2/org/acme/repos/x/images/1", headers={"Authorization": ""}),
    ):
        ngc_problem(resp, 401, "UNAUTHORIZED")
        assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("content", "ctype", "status", "code"),
    [
        (b"credentials=a&credentials=b", FORM["Content-Type"], 400, "INVALID_REQUEST"),
        (b"credentials=\xff\xfe", FORM["Content-Type"], 400, "INVALID_REQUEST"),
        (b'{"credentials": 5}', "application/json", 400, "INVALID_REQUEST"),
        (b'{"credentials": ', "application/json", 400, "INVALID_REQUEST"),
        (b"credentials: x", "text/plain", 415, "INVALID_REQUEST_DATA"),
    ],
)
async def test_a_malformed_body_is_a_4xx(
    client: AppClient, content: bytes, ctype: str, status: int, code: str
) -> None:
    resp = await client.post(CALLER_INFO, content=content, headers={"Content-Type": ctype})
    ngc_problem(resp, status, code)


@pytest.mark.parametrize(
    "query",
    [
        "page-size=0",
        "page-size=x",
        "page-number=-1",
        "page-size=1&page-size=2",
        # what str.isdigit() or int() accept: ², ①, a fullwidth 5, a sign, 4,301 digits
        "page-size=%C2%B2",
        "page-number=%E2%91%A0",
        "page-size=%EF%BC%95",
        "page-size=%2B5",
        "page-size=1_0",
        "page-number=" + "9" * 4301,
        "page-size=1000000000",
    ],
)
async def test_bad_org_list_paging_is_400(client: AppClient, query: str) -> None:
    resp = await client.get(f"/v2/orgs?{query}")
    ngc_problem(resp, 400, "INVALID_REQUEST")


async def test_registry_metadata_is_403_so_ngcsdk_goes_on(client: AppClient) -> None:
    key = await acme_key(client)
    for path in (
        "/v2/org/acme/repos/echo/images/1.0",
        "/v2/org/acme/team/t/repos/echo/images/1.0",
        "/v2/org/acme/models/m/versions/1",
    ):
        resp = await client.get(path, headers=bearer(key))
        body = ngc_problem(resp, 403, "FORBIDDEN")
        assert "does not hold NGC registry metadata" in body["detail"]


async def test_request_ids_are_fresh_per_call(client: AppClient) -> None:
    key = await acme_key(client)
    ids = set()
    for _ in range(2):
        resp = await client.post(CALLER_INFO, content=urlencode({"credentials": key}), headers=FORM)
        ids.add(resp.json()["requestStatus"]["requestId"])
    assert len(ids) == 2 and all(uuid.UUID(i) for i in ids)

"""Hostile input answered with a 4xx problem, never a 500, and nothing stored after a refusal.

Each test runs on SQLite and PostgreSQL: PostgreSQL refuses NUL in text and strings longer
than their column, SQLite stores them, so the same request can fail differently on each.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.api import CONTAINER_FN, assert_problem, bearer, create_fn
from tests.support.app import JWT_SECRET, AppClient, ClientFactory, without_reconciler

# One app per database for the module's tests on `client`: each makes what it reads, and a
# refusal is checked to store nothing by comparing with what was there before it.
pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

V = "/v2/nvcf"
JSON = {"content-type": "application/json"}


def fields(body: dict[str, Any]) -> set[str]:
    return {e["field"] for e in body.get("errors", [])}


async def function_count(client: AppClient) -> int:
    resp = await client.get(f"{V}/functions")
    assert resp.status_code == 200, resp.text
    return len(resp.json()["functions"])


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def raw(body: str) -> bytes:
    """A JSON text as sent: `\\ud800` stays an escape (json.dumps of a str would too)."""
    return body.encode()


# --- 3. lone surrogates and NUL -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            '{"name":"echo","inferenceUrl":"/echo","inferencePort":8000,'
            '"containerImage":"nvcr.io/acme/echo:1.0",'
            '"containerEnvironment":[{"key":"A","value":"\\ud800"}]}',
            "containerEnvironment[0].value",
        ),
        (
            '{"name":"echo","inferenceUrl":"/echo","inferencePort":8000,'
            '"models":[{"name":"m","version":"1","uri":"/m\\udfff"}]}',
            "models[0].uri",
        ),
        (
            '{"name":"echo","inferenceUrl":"/echo","inferencePort":8000,'
            '"containerImage":"nvcr.io/acme/echo:1.0","description":"a\\u0000b"}',
            "description",
        ),
        (
            '{"name":"echo","inferenceUrl":"/echo","inferencePort":8000,'
            '"containerImage":"nvcr.io/acme/echo:1.0","tags":["ok","t\\u0000"]}',
            "tags[1]",
        ),
    ],
)
async def test_lone_surrogates_and_nul_in_bodies_are_400(
    client: AppClient, body: str, field: str
) -> None:
    before = await function_count(client)
    resp = await client.post(f"{V}/functions", content=raw(body), headers=JSON)
    problem = assert_problem(resp, 400)
    assert fields(problem) == {field}
    assert field in str(problem["detail"])
    assert await function_count(client) == before
    # The account's lists still answer (the poison was never stored).
    fn = await create_fn(client)
    assert (await client.get(f"{V}/functions/{fn['id']}/versions")).status_code == 200
    assert (
        await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    ).status_code == 200


async def test_object_keys_are_checked_too(client: AppClient) -> None:
    body = '{"name":"echo","containerEnvironment":[{"key":"A","value":"v","\\u0000":1}]}'
    resp = await client.post(f"{V}/functions", content=raw(body), headers=JSON)
    problem = assert_problem(resp, 400)
    assert fields(problem) == {"containerEnvironment[0]"}


async def test_updates_are_checked(client: AppClient) -> None:
    fn = await create_fn(client)
    url = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    resp = await client.put(url, content=raw('{"tags":["\\ud83d"]}'), headers=JSON)
    assert fields(assert_problem(resp, 400)) == {"tags[0]"}
    got = (await client.get(url)).json()["function"]
    assert got.get("tags", []) == []


@pytest.mark.parametrize("param", ["name", "tag", "cursor", "status"])
async def test_nul_in_query_parameters_is_400(client: AppClient, param: str) -> None:
    resp = await client.get(f"{V}/functions", params={param: "a\x00b"})
    problem = assert_problem(resp, 400)
    assert fields(problem) == {param}


async def test_nul_in_registry_credential_is_not_stored(client: AppClient) -> None:
    body = (
        '{"registryHostname":"nvcr.io\\u0000","secret":{"name":"credentials",'
        '"value":"JG9hdXRodG9rZW46cA=="},"artifactTypes":["CONTAINER"]}'
    )
    before = (await client.get(f"{V}/registry-credentials")).json()
    resp = await client.post(f"{V}/registry-credentials", content=raw(body), headers=JSON)
    assert fields(assert_problem(resp, 400)) == {"registryHostname"}
    listed = (await client.get(f"{V}/registry-credentials")).json()
    assert listed.get("registryCredentials", []) == before.get("registryCredentials", [])


# --- 5. parse limits ----------------------------------------------------------------------


async def test_deeply_nested_json_is_400(client: AppClient) -> None:
    for depth in (65, 1000, 100_000):
        body = '{"name":"echo","x":' + "[" * depth + "]" * depth + "}"
        problem = assert_problem(
            await client.post(f"{V}/functions", content=body.encode(), headers=JSON), 400
        )
        assert "nested" in str(problem["detail"])
    # 64 levels parse (and then meet the ordinary validation)
    body = '{"name":"echo","x":' + "[" * 63 + "]" * 63 + "}"
    problem = assert_problem(
        await client.post(f"{V}/functions", content=body.encode(), headers=JSON), 400
    )
    assert "nested" not in str(problem["detail"])


async def test_huge_integers_and_non_finite_numbers_are_400(client: AppClient) -> None:
    before = await function_count(client)
    for number in ("1" * 4301, "-" + "9" * 5000, "1e400", "NaN", "-Infinity"):
        body = f'{{"name":"echo","inferencePort":{number}}}'
        problem = assert_problem(
            await client.post(f"{V}/functions", content=body.encode(), headers=JSON), 400
        )
        assert fields(problem) == {"body"}
        assert len(resp_text := json.dumps(problem)) < 2000, resp_text
    assert await function_count(client) == before


def cursor(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


BAD_CURSORS = [
    cursor({"t": "2024-01-01T00:00:00", "i": "00000000-0000-0000-0000-000000000001"}),
    cursor({"t": "9999-12-31T23:59:59-14:00", "i": "00000000-0000-0000-0000-000000000001"}),
    cursor({"t": "0001-01-01T00:00:00+14:00", "i": "00000000-0000-0000-0000-000000000001"}),
    cursor({"t": "2024-01-01T00:00:00+00:00", "i": 5}),
    cursor(["t", "i"]),
    base64.urlsafe_b64encode(b"[" * 5000).decode(),
]


@own_app
async def test_crafted_cursors_are_400_on_every_paginated_route(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconcile_interval=3600)
    await without_reconciler(client)
    fn = await create_fn(client)
    deploy = await client.post(
        f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}",
        json={
            "deploymentSpecifications": [
                {"gpu": "L40", "backend": "nvcf-default", "minInstances": 1, "maxInstances": 1}
            ]
        },
    )
    assert deploy.status_code == 200, deploy.text
    dep_id = deploy.json()["deployment"]["deploymentId"]
    routes = [
        f"{V}/functions",
        f"{V}/functions/{fn['id']}/versions",
        f"{V}/registry-credentials",
        f"{V}/deployments",
        f"{V}/deployments/{dep_id}/events",
    ]
    for route in routes:
        for c in BAD_CURSORS:
            resp = await client.get(route, params={"limit": 2, "cursor": c})
            assert fields(assert_problem(resp, 400)) == {"cursor"}, (route, c)
    # Events are keyed by a 64-bit integer: a cursor's UUID beyond that range is refused,
    # not sent to PostgreSQL (which answers "bigint out of range").
    huge = cursor({"t": "2024-01-01T00:00:00+00:00", "i": "ffffffff-ffff-ffff-ffff-ffffffffffff"})
    resp = await client.get(routes[-1], params={"limit": 2, "cursor": huge})
    assert fields(assert_problem(resp, 400)) == {"cursor"}
    # ... while on UUID-keyed routes it is just a position.
    resp = await client.get(routes[0], params={"limit": 2, "cursor": huge})
    assert resp.status_code == 200, resp.text


async def test_huge_expires_in_is_400(client: AppClient) -> None:
    before = (await client.get(f"{V}/api-keys")).json()["apiKeys"]
    for duration in (
        "P99999999999D",
        "P999999999D",
        "PT99999999999999999999S",
        "P2913000D",
        "P36601D",
        "P0D",
        "PT0S",
    ):
        resp = await client.post(
            f"{V}/api-keys", json={"scopes": ["list_functions"], "expiresIn": duration}
        )
        assert fields(assert_problem(resp, 400)) == {"expiresIn"}, duration
    assert (await client.get(f"{V}/api-keys")).json()["apiKeys"] == before
    resp = await client.post(
        f"{V}/api-keys", json={"scopes": ["list_functions"], "expiresIn": "P36600D"}
    )
    assert resp.status_code == 200, resp.text


def future(seconds: int = 600) -> int:
    return int(time.time()) + seconds


def _jwks(tmp_path: Path) -> tuple[Path, Any, Any]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    rsa_jwk.update(kid="rsa1", use="sig")  # no "alg": the header's alg is what is checked
    ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    ec_jwk.update(kid="ec1", use="sig")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [rsa_jwk, ec_jwk]}))
    return path, rsa_key, ec_key


def _forge(header: dict[str, Any] | str, claims: dict[str, Any]) -> str:
    """A token with this header and an arbitrary signature (never verified by these tests)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    head = header if isinstance(header, str) else json.dumps(header)
    return ".".join([b64(head.encode()), b64(json.dumps(claims).encode()), b64(b"\x01" * 64)])


@own_app
async def test_jwt_algorithm_and_key_type_mismatch_is_401(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    path, rsa_key, ec_key = _jwks(tmp_path)
    client = await client_factory(jwks_file=path, jwt_secret=None)
    claims = {"sub": "acme", "scopes": ["list_functions"], "exp": future()}
    for header in (
        {"alg": "ES256", "kid": "rsa1"},
        {"alg": "RS256", "kid": "ec1"},
        {"alg": "ES256"},
        {"alg": "ES256", "kid": {"x": 1}},
        {"alg": "RS256", "kid": "\ud800"},
        {"alg": "\x00"},
    ):
        token = _forge(header, claims)
        resp = await client.get(f"{V}/functions", headers=bearer(token))
        assert_problem(resp, 401)
        assert resp.headers["www-authenticate"] == "Bearer"
    deep = _forge('{"alg":"ES256","x":' + "[" * 5000 + "]" * 5000 + "}", claims)
    assert_problem(await client.get(f"{V}/functions", headers=bearer(deep)), 401)
    # The matching pairs still verify.
    for key, alg, kid in ((rsa_key, "RS256", "rsa1"), (ec_key, "ES256", "ec1")):
        good = jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})
        assert (await client.get(f"{V}/functions", headers=bearer(good))).status_code == 200


@pytest.mark.parametrize(
    ("claims", "field"),
    [
        ({"sub": "a" * 129}, "jwt.sub"),
        ({"sub": "acme", "ncaId": "n" * 129}, "jwt.ncaId"),
        ({"sub": "ac\x00me"}, "jwt.sub"),
        ({"sub": "acme\ud800"}, "jwt.sub"),
        ({"sub": "acme", "scopes": ["register_function", "x\x00"]}, "jwt.scopes[1]"),
    ],
)
async def test_bad_jwt_claims_are_refused_naming_the_claim(
    client: AppClient, claims: dict[str, Any], field: str
) -> None:
    claims = {"scopes": ["register_function", "list_functions"], **claims, "exp": future()}
    token = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    before = await function_count(client)
    resp = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=bearer(token))
    problem = assert_problem(resp, 400)  # an authentic token whose claims cannot be used
    assert fields(problem) == {field}
    assert await function_count(client) == before
    ok = jwt.encode(
        {"sub": "a" * 128, "scopes": ["register_function"], "exp": future()}, JWT_SECRET
    )
    resp = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=bearer(ok))
    assert resp.status_code == 200, resp.text


# --- 7. error amplification ---------------------------------------------------------------


async def test_many_violations_are_capped(client: AppClient) -> None:
    body = json.dumps({**CONTAINER_FN, "tags": ["!"] * 100_000}).encode()
    assert len(body) < 1024 * 1024
    before = await function_count(client)
    resp = await client.post(f"{V}/functions", content=body, headers=JSON)
    problem = assert_problem(resp, 400)
    assert len(resp.content) < len(body)
    assert len(resp.content) < 64 * 1024
    errors = problem["errors"]
    assert isinstance(errors, list) and len(errors) == 100
    omitted = problem["errorsOmitted"]
    assert isinstance(omitted, int) and omitted >= 100_000 - 100
    assert f"{omitted} more" in str(problem["detail"])
    assert await function_count(client) == before


async def test_long_echoed_values_are_truncated(client: AppClient) -> None:
    value = "P" + "x" * 500_000
    body = json.dumps({"scopes": ["list_functions"], "expiresIn": value}).encode()
    resp = await client.post(f"{V}/api-keys", content=body, headers=JSON)
    problem = assert_problem(resp, 400)
    assert fields(problem) == {"expiresIn"}
    assert len(resp.content) < 16 * 1024


async def test_few_violations_are_listed_in_full(client: AppClient) -> None:
    body = {**CONTAINER_FN, "tags": ["!"] * 3}
    problem = assert_problem(await client.post(f"{V}/functions", json=body), 400)
    assert "errorsOmitted" not in problem
    assert fields(problem) == {"tags[0]", "tags[1]", "tags[2]"}


# --- 405: Allow names every method of the path ----------------------------------------------

FID, VID = "00000000-0000-4000-8000-000000000000", "00000000-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", f"{V}/functions", {"GET", "POST"}),
        ("DELETE", "/v2/orgs/acme/nvcf/functions", {"GET", "POST"}),
        ("PATCH", f"{V}/functions/{FID}/versions", {"GET", "POST"}),
        ("POST", f"{V}/functions/{FID}/versions/{VID}", {"GET", "PUT", "DELETE"}),
        (
            "PATCH",
            f"{V}/deployments/functions/{FID}/versions/{VID}",
            {"GET", "POST", "PUT", "DELETE"},
        ),
    ],
)
async def test_a_405_allows_every_method_the_path_serves(
    client: AppClient, method: str, path: str, allowed: set[str]
) -> None:
    resp = await client.request(method, path)
    problem = assert_problem(resp, 405)
    assert method in str(problem["detail"])
    served = {m.strip() for m in resp.headers["allow"].split(",")}
    assert allowed <= served and method not in served
    # each one it names is served (anything but 405), the documented ones included
    for other in served - {"HEAD"}:
        assert (await client.request(other, path)).status_code != 405, other


# --- numbers in queries: ASCII digits only ----------------------------------------------------


@pytest.mark.parametrize(
    "limit", ["%C2%B2", "%E2%91%A0", "%EF%BC%95", "%2B5", "%205", "5%20", "1_0", "9" * 4301]
)
async def test_a_limit_that_is_not_ascii_digits_is_400(client: AppClient, limit: str) -> None:
    for route in (f"{V}/functions", f"{V}/registry-credentials", f"{V}/deployments"):
        resp = await client.get(f"{route}?limit={limit}")
        assert fields(assert_problem(resp, 400)) == {"limit"}, route
    assert (await client.get(f"{V}/functions?limit=5")).status_code == 200

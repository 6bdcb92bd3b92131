"""Credentials and scopes (api.md §1): API keys, HS256 and JWKS-verified JWTs.

The tests on `client` share one app per database: each reads what it made itself, in
accounts named for it."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.api import CONTAINER_FN, bearer, create_fn, new_key
from tests.support.app import JWT_SECRET, AppClient, ClientFactory

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

V = "/v2/nvcf"


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def unique(name: str) -> str:
    """An account name no other test of the module's app uses."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


def hs256(claims: dict[str, Any], secret: str = JWT_SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def future(seconds: int = 600) -> int:
    return int(time.time()) + seconds


async def test_no_credential_is_401(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{V}/functions", headers={"Authorization": ""})
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"
    assert resp.json()["detail"] == "missing Authorization header"


@pytest.mark.parametrize(
    ("header", "detail"),
    [
        ("Bearer nvapi-unknown-key", "unknown API key"),
        ("Basic abc", "Authorization header must be 'Bearer <credential>'"),
        ("Bearer not-a-jwt", "credential is not a valid JWT"),
    ],
)
async def test_bad_credentials_are_401(client: httpx.AsyncClient, header: str, detail: str) -> None:
    resp = await client.get(f"{V}/functions", headers={"Authorization": header})
    assert resp.status_code == 401
    assert resp.json()["detail"] == detail


async def test_expired_api_key_is_401(client: httpx.AsyncClient) -> None:
    key = await new_key(client, ["list_functions"], expires_in="PT1S")
    assert (await client.get(f"{V}/functions", headers=bearer(key))).status_code == 200
    await asyncio.sleep(1.1)
    resp = await client.get(f"{V}/functions", headers=bearer(key))
    assert resp.status_code == 401
    assert resp.json()["detail"] == "API key has expired"


async def test_revoked_api_key_is_401_at_once(client: httpx.AsyncClient) -> None:
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]})
    created = resp.json()["apiKey"]
    key = created["key"]
    assert (await client.get(f"{V}/functions", headers=bearer(key))).status_code == 200
    listed = (await client.get(f"{V}/api-keys")).json()["apiKeys"]
    assert all("key" not in k for k in listed)
    assert (await client.delete(f"{V}/api-keys/{created['id']}")).status_code == 204
    assert (await client.get(f"{V}/functions", headers=bearer(key))).status_code == 401


async def test_missing_scope_is_403_naming_the_scope(client: httpx.AsyncClient) -> None:
    key = bearer(await new_key(client, ["list_functions"]))
    resp = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=key)
    assert resp.status_code == 403
    assert "register_function" in resp.json()["detail"]
    fn = await create_fn(client)
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    resp = await client.delete(path, headers=key)
    assert resp.status_code == 403 and "delete_function" in resp.json()["detail"]
    resp = await client.put(path, json={"description": "x"}, headers=key)
    assert resp.status_code == 403 and "update_function" in resp.json()["detail"]
    nolist = bearer(await new_key(client, ["register_function"]))
    resp = await client.get(f"{V}/functions", headers=nolist)
    assert resp.status_code == 403
    assert "'list_functions' or 'list_functions_details'" in resp.json()["detail"]


async def test_details_scope_alone_lists_and_adds_instances(client: httpx.AsyncClient) -> None:
    fn = await create_fn(client)
    details = bearer(await new_key(client, ["list_functions_details"]))
    plain = bearer(await new_key(client, ["list_functions"]))
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert "activeInstances" in (await client.get(path, headers=details)).json()["function"]
    assert "activeInstances" not in (await client.get(path, headers=plain)).json()["function"]


async def test_hs256_jwt(client: httpx.AsyncClient) -> None:
    token = hs256(
        {"sub": "client-1", "ncaId": "nvcf-default", "scopes": ["list_functions"], "exp": future()}
    )
    fn = await create_fn(client)
    resp = await client.get(f"{V}/functions", headers=bearer(token))
    assert resp.status_code == 200
    assert fn["id"] in [f["id"] for f in resp.json()["functions"]]
    # sub is the account when there is no ncaId claim: a different account sees nothing
    token2 = hs256({"sub": unique("client-2"), "scopes": ["list_functions"], "exp": future()})
    assert (await client.get(f"{V}/functions", headers=bearer(token2))).json()["functions"] == []


@pytest.mark.parametrize(
    ("claims", "secret", "detail"),
    # `exp` is given in seconds from when the test runs: a time taken at collection has
    # passed by the time a long run reaches the test
    [
        ({"sub": "a", "scopes": [], "exp": -60}, JWT_SECRET, "JWT has expired"),
        ({"sub": "a", "scopes": []}, JWT_SECRET, "JWT is missing the 'exp' claim"),
        (
            {"sub": "a", "scopes": [], "exp": 600},
            "another-secret-of-sufficient-length-1234",
            "JWT signature is invalid",
        ),
        (
            {"scopes": [], "exp": 600},
            JWT_SECRET,
            "JWT has neither an 'ncaId' nor a 'sub' claim",
        ),
    ],
)
async def test_bad_jwts_are_401(
    client: httpx.AsyncClient, claims: dict[str, Any], secret: str, detail: str
) -> None:
    if "exp" in claims:
        claims = {**claims, "exp": future(claims["exp"])}
    resp = await client.get(f"{V}/functions", headers=bearer(hs256(claims, secret)))
    assert resp.status_code == 401
    assert resp.json()["detail"] == detail


async def test_jwt_missing_scope_is_403(client: httpx.AsyncClient) -> None:
    token = hs256({"sub": "nvcf-default", "scopes": ["list_functions"], "exp": future()})
    resp = await client.post(f"{V}/functions", json=CONTAINER_FN, headers=bearer(token))
    assert resp.status_code == 403


async def test_jwt_org_path_must_match(client: httpx.AsyncClient) -> None:
    token = hs256({"sub": "acme", "scopes": ["list_functions"], "exp": future()})
    assert (
        await client.get("/v2/orgs/acme/nvcf/functions", headers=bearer(token))
    ).status_code == 200
    assert (
        await client.get("/v2/orgs/other/nvcf/functions", headers=bearer(token))
    ).status_code == 403


@own_app
@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_jwks_file_verification(
    client_factory: ClientFactory, tmp_path: Path, alg: str
) -> None:
    key: Any = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    algo = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    jwk = json.loads(algo.to_jwk(key.public_key()))
    jwk.update(kid="k1", alg=alg, use="sig")
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    client = await client_factory(jwks_file=jwks, jwt_secret=None)
    good = jwt.encode(
        {"sub": "acme", "scopes": ["list_functions"], "exp": future()},
        key,
        algorithm=alg,
        headers={"kid": "k1"},
    )
    assert (await client.get(f"{V}/functions", headers=bearer(good))).status_code == 200
    other: Any = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    forged = jwt.encode(
        {"sub": "acme", "scopes": ["list_functions"], "exp": future()},
        other,
        algorithm=alg,
        headers={"kid": "k1"},
    )
    resp = await client.get(f"{V}/functions", headers=bearer(forged))
    assert resp.status_code == 401 and resp.json()["detail"] == "JWT signature is invalid"
    unknown_kid = jwt.encode(
        {"sub": "acme", "scopes": [], "exp": future()}, key, algorithm=alg, headers={"kid": "k9"}
    )
    resp = await client.get(f"{V}/functions", headers=bearer(unknown_kid))
    assert resp.status_code == 401 and "k9" in resp.json()["detail"]
    # HS256 is refused when no secret is configured
    resp = await client.get(f"{V}/functions", headers=bearer(hs256({"sub": "a", "exp": future()})))
    assert resp.status_code == 401


@own_app
async def test_jwt_without_configuration_is_401(client_factory: ClientFactory) -> None:
    client = await client_factory(jwt_secret=None)
    resp = await client.get(f"{V}/functions", headers=bearer(hs256({"sub": "a", "exp": future()})))
    assert resp.status_code == 401
    assert "JWT verification is not configured" in resp.json()["detail"]


async def test_key_admin_requires_admin_and_validates(client: httpx.AsyncClient) -> None:
    plain = bearer(await new_key(client, ["list_functions"]))
    assert (
        await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]}, headers=plain)
    ).status_code == 403
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["fly"], "expiresIn": "soon"})
    assert resp.status_code == 400
    assert {e["field"] for e in resp.json()["errors"]} == {"expiresIn"}
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["fly"]})
    assert resp.status_code == 400 and "unknown scope 'fly'" in resp.text


@own_app
async def test_jwks_url_verification(client_factory: ClientFactory, tmp_path: Path) -> None:
    """The JWKS is fetched over HTTP from the configured URL (a real local server here)."""
    import http.server
    import threading

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="url-key", alg="RS256", use="sig")
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        client = await client_factory(jwks_url=url, jwt_secret=None)
        token = jwt.encode(
            {"sub": "acme", "scopes": ["list_functions"], "exp": future()},
            key,
            algorithm="RS256",
            headers={"kid": "url-key"},
        )
        assert (await client.get(f"{V}/functions", headers=bearer(token))).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    # The JWKS server is gone and an unknown kid forces a reload: 401 naming the cause.
    other = jwt.encode(
        {"sub": "acme", "scopes": [], "exp": future()},
        key,
        algorithm="RS256",
        headers={"kid": "rotated"},
    )
    resp = await client.get(f"{V}/functions", headers=bearer(other))
    assert resp.status_code == 401
    assert "cannot load the JWKS" in resp.json()["detail"]


async def test_an_account_admin_cannot_mint_keys_for_another_account(
    client: httpx.AsyncClient,
) -> None:
    """The critical hole of the security campaign: `admin` administers its own account only."""
    victim_account, mallory = unique("victim"), unique("mallory")
    victim = bearer(await new_key(client, ["register_function", "list_functions"], victim_account))
    assert (await client.post(f"{V}/functions", json=CONTAINER_FN, headers=victim)).is_success
    tenant_admin = bearer(await new_key(client, ["admin", "list_functions"], mallory))
    for wanted in (["admin"], ["list_functions"]):
        resp = await client.post(
            f"{V}/api-keys", json={"ncaId": victim_account, "scopes": wanted}, headers=tenant_admin
        )
        assert resp.status_code == 403, resp.text
        assert resp.headers["content-type"] == "application/problem+json"
        assert "admin:accounts" in resp.json()["detail"]
    # nothing was minted for the victim account: its admin sees only the key made above
    victim_admin = bearer(await new_key(client, ["admin"], victim_account))
    listed = (await client.get(f"{V}/api-keys", headers=victim_admin)).json()["apiKeys"]
    assert len(listed) == 2
    # naming its own account explicitly is still fine
    resp = await client.post(
        f"{V}/api-keys",
        json={"ncaId": mallory, "scopes": ["list_functions"]},
        headers=tenant_admin,
    )
    assert resp.status_code == 200 and resp.json()["apiKey"]["ncaId"] == mallory
    own = bearer(resp.json()["apiKey"]["key"])
    assert (await client.get(f"{V}/functions", headers=own)).json()["functions"] == []


async def test_the_operator_scope_cannot_be_granted_through_the_api(
    client: httpx.AsyncClient,
) -> None:
    # not even by the operator's own key: only `nvcf-server create-key` grants it
    before = (await client.get(f"{V}/api-keys")).json()["apiKeys"]
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["admin", "admin:accounts"]})
    assert resp.status_code == 400
    assert resp.json()["errors"] == [
        {
            "field": "scopes",
            "message": "scope 'admin:accounts' can only be granted by the operator "
            "(`nvcf-server create-key`)",
        }
    ]
    assert (await client.get(f"{V}/api-keys")).json()["apiKeys"] == before


async def test_the_operator_key_mints_for_other_accounts(client: httpx.AsyncClient) -> None:
    """The bootstrap key is the operator's: it carries `admin:accounts`."""
    listed = (await client.get(f"{V}/api-keys")).json()["apiKeys"]
    assert "admin:accounts" in listed[0]["scopes"]
    resp = await client.post(f"{V}/api-keys", json={"ncaId": "acme", "scopes": ["admin"]})
    assert resp.status_code == 200 and resp.json()["apiKey"]["ncaId"] == "acme"


async def test_a_jwt_never_carries_the_operator_scope(client: httpx.AsyncClient) -> None:
    token = hs256({"sub": "idp-user", "scopes": ["admin", "admin:accounts"], "exp": future()})
    resp = await client.post(
        f"{V}/api-keys",
        json={"ncaId": "victim", "scopes": ["list_functions"]},
        headers=bearer(token),
    )
    assert resp.status_code == 403 and "admin:accounts" in resp.json()["detail"]


async def test_a_verified_key_is_remembered_by_header_until_revoked(
    client: AppClient,
) -> None:
    """`cached_principal` (the inline invocation path's lookup) never reads the database,
    answers only for keys verified moments ago, and forgets a revoked key at once."""
    auth = client.app.state.authenticator
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]})
    created = resp.json()["apiKey"]
    header = f"Bearer {created['key']}"
    assert auth.cached_principal(header) is None  # never verified here yet
    assert (await client.get(f"{V}/functions", headers={"Authorization": header})).is_success
    principal = auth.cached_principal(header)
    assert principal is not None and principal.subject == created["id"]
    assert auth.cached_principal(header) is principal  # from the header's memory
    assert auth.cached_principal(None) is None and auth.cached_principal("Bearer x") is None
    assert (await client.delete(f"{V}/api-keys/{created['id']}")).status_code == 204
    assert auth.cached_principal(header) is None


async def test_a_key_about_to_expire_is_not_answered_from_memory(
    client: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "about to expire" as a minute: a slow machine cannot let the key expire meanwhile
    monkeypatch.setattr("service.auth.service.EXPIRY_MARGIN_SECONDS", 120.0)
    auth = client.app.state.authenticator
    key = await new_key(client, ["list_functions"], expires_in="PT1H")
    soon = await new_key(client, ["list_functions"], expires_in="PT60S")
    for k in (key, soon):
        assert (await client.get(f"{V}/functions", headers=bearer(k))).status_code == 200
    assert auth.cached_principal(f"Bearer {key}") is not None
    # within the margin of its expiry: the caller is verified the ordinary way every time
    assert auth.cached_principal(f"Bearer {soon}") is None


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_a_key_never_outlives_the_key_that_minted_it(client: httpx.AsyncClient) -> None:
    """A key minted by another key expires no later than it, on every route that mints: a
    longer or absent lifetime is cut to the minting key's expiry; a shorter one is kept."""
    # an account of its own: the keys it mints list no other test's functions
    parent = await client.post(
        f"{V}/api-keys",
        json={
            "ncaId": unique("minter"),
            "scopes": ["admin", "list_functions"],
            "expiresIn": "PT1H",
        },
    )
    assert parent.status_code == 200, parent.text
    parent_expiry = _when(parent.json()["apiKey"]["expiresAt"])
    minter = bearer(parent.json()["apiKey"]["key"])

    for extra in ({"expiresIn": "P30D"}, {}):
        resp = await client.post(
            f"{V}/api-keys", json={"scopes": ["list_functions"], **extra}, headers=minter
        )
        assert resp.status_code == 200, resp.text
        assert _when(resp.json()["apiKey"]["expiresAt"]) == parent_expiry
    resp = await client.post(
        f"{V}/api-keys", json={"scopes": ["list_functions"], "expiresIn": "PT10M"}, headers=minter
    )
    assert _when(resp.json()["apiKey"]["expiresAt"]) < parent_expiry

    token = await client.post("/v1/admin/keys", json={}, headers=minter)
    assert token.status_code == 200, token.text
    assert _when(token.json()["expires_at"]) == parent_expiry  # not 12 hours
    # chained: the management token's keys are cut to the first key's expiry as well
    chained = bearer(token.json()["value"])
    later = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    policy = {"resources": [{"id": "*", "type": "account-functions"}], "scopes": ["list_functions"]}
    body = {"expires_at": later, "authorizations": {"policies": [policy]}}
    for headers in (minter, chained):
        resp = await client.post("/v1/keys", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        assert _when(resp.json()["expires_at"]) == parent_expiry
        listed = (await client.get(f"{V}/functions", headers=bearer(resp.json()["value"]))).json()
        assert listed == {"functions": []}
    # a key without an expiry still makes keys as long-lived as asked
    resp = await client.post(f"{V}/api-keys", json={"scopes": ["list_functions"]})
    assert "expiresAt" not in resp.json()["apiKey"]
    resp = await client.post("/v1/keys", json=body)
    assert _when(resp.json()["expires_at"]) > parent_expiry


async def test_requests_arriving_together_share_one_key_lookup(
    client: AppClient,
) -> None:
    """Sixteen requests with a key not verified yet (or whose memory just expired) cost one
    query of the keys table between them, and all get the same principal; an unknown key
    is a 401 for every one of them."""
    from sqlalchemy import event

    auth = client.app.state.authenticator
    sessions = client.app.state.sessionmaker
    key = await new_key(client, ["list_functions"])
    lookups: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "api_keys" in statement:
            lookups.append(statement)

    engine = client.app.state.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        principals = await asyncio.gather(
            *(auth.authenticate(sessions, f"Bearer {key}") for _ in range(16))
        )
        unknown = await asyncio.gather(
            *(auth.authenticate(sessions, "Bearer nvapi-unknown") for _ in range(4)),
            return_exceptions=True,
        )
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len({id(p) for p in principals}) == 1
    assert len(lookups) == 2  # the key's, then the unknown one's
    assert [getattr(e, "status", None) for e in unknown] == [401] * 4


async def test_a_key_lookup_nobody_waits_for_any_more_is_stopped(
    client: AppClient,
) -> None:
    """Requests that went away (callers hung up) leave no lookup running behind them."""
    auth = client.app.state.authenticator
    sessions = client.app.state.sessionmaker
    key = await new_key(client, ["list_functions"])
    waiting = [
        asyncio.ensure_future(auth.authenticate(sessions, f"Bearer {key}")) for _ in range(3)
    ]
    await asyncio.sleep(0)  # each has asked: one lookup for the three
    [lookup] = [shared.future for shared in auth._lookups.values()]
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, lookup, return_exceptions=True)
    assert lookup.cancelled()
    assert auth._lookups == {}
    principal = await auth.authenticate(sessions, f"Bearer {key}")  # asked again: answered
    assert principal.scopes == {"list_functions"}

"""Registry credentials over HTTP (api.md §5), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from service.core.crypto import load_secret_box
from service.core.db import make_engine, make_sessionmaker
from service.registry.service import all_credentials, credentials_for_host
from tests.support.api import bearer, new_key
from tests.support.app import SettingsFactory

V = "/v2/nvcf"
RC = f"{V}/registry-credentials"
PW = "s3cr3t-PW-do-not-leak-9f8e7d"
BASE: dict[str, Any] = {
    "registryHostname": "registry.example.com",
    "username": "robot",
    "password": PW,
}


async def create(client: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    resp = await client.post(RC, json={**BASE, **changes})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["registryCredential"])


def field_messages(resp: httpx.Response) -> list[tuple[str, str]]:
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return [(e["field"], e["message"]) for e in resp.json()["errors"]]


async def test_create_get_list_patch_delete(client: httpx.AsyncClient) -> None:
    resp = await client.post(RC, json={**BASE, "description": "CI robot", "extra": "ignored"})
    assert resp.status_code == 200, resp.text
    cred = resp.json()["registryCredential"]
    uuid.UUID(cred["id"])
    assert set(cred) == {
        "id",
        "registryHostname",
        "username",
        "description",
        "createdAt",
        "updatedAt",
    }
    assert cred["registryHostname"] == "registry.example.com"
    assert cred["username"] == "robot"
    assert cred["description"] == "CI robot"
    assert cred["createdAt"].endswith("Z") and len(cred["createdAt"]) == 24  # milliseconds
    assert cred["updatedAt"] == cred["createdAt"]

    got = await client.get(f"{RC}/{cred['id']}")
    assert got.status_code == 200 and got.json() == {"registryCredential": cred}

    listed = await client.get(RC)
    assert listed.status_code == 200
    assert listed.json() == {"registryCredentials": [cred]}  # no nextCursor without paging

    patched = await client.patch(f"{RC}/{cred['id']}", json={"username": "robot2"})
    assert patched.status_code == 200, patched.text
    after = patched.json()["registryCredential"]
    assert after["username"] == "robot2"
    assert after["registryHostname"] == "registry.example.com"
    assert after["description"] == "CI robot"
    assert after["createdAt"] == cred["createdAt"]
    assert after["updatedAt"] >= cred["updatedAt"]

    patched = await client.patch(
        f"{RC}/{cred['id']}",
        json={
            "registryHostname": "Other.Example.com:5000",
            "password": "new-pw",
            "description": None,
        },
    )
    assert patched.status_code == 200, patched.text
    after = patched.json()["registryCredential"]
    assert after["registryHostname"] == "other.example.com:5000"
    assert "description" not in after  # removed; nulls are omitted

    deleted = await client.delete(f"{RC}/{cred['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert (await client.get(f"{RC}/{cred['id']}")).status_code == 404
    assert (await client.delete(f"{RC}/{cred['id']}")).status_code == 404
    assert (await client.get(RC)).json() == {"registryCredentials": []}


async def test_hostnames_are_normalised(client: httpx.AsyncClient) -> None:
    cases = {
        "Registry.Example.COM": "registry.example.com",
        "reg.example.com:05000": "reg.example.com:5000",
        "localhost:5000": "localhost:5000",
        "10.0.0.1:5000": "10.0.0.1:5000",
        "[0:0:0:0:0:0:0:1]:5000": "[::1]:5000",
        "[FD00::AB]": "[fd00::ab]",
        "nvcr.io": "nvcr.io",
        "xn--bcher-kva.example": "xn--bcher-kva.example",
    }
    for given, stored in cases.items():
        cred = await create(client, registryHostname=given)
        assert cred["registryHostname"] == stored, given


async def test_unknown_and_malformed_ids(client: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    for method in ("GET", "DELETE"):
        resp = await client.request(method, f"{RC}/{missing}")
        assert resp.status_code == 404
        assert str(missing) in resp.json()["detail"]
        bad = await client.request(method, f"{RC}/not-a-uuid")
        assert bad.status_code == 400
        assert bad.json()["errors"][0]["field"] == "registryCredentialId"
    resp = await client.patch(f"{RC}/{missing}", json={"description": "x"})
    assert resp.status_code == 404


HOSTNAME_CASES: list[tuple[Any, str]] = [
    (42, "must be a string"),
    ("", "must not be empty"),
    ("a" * 300, "at most 260 characters"),
    ("https://nvcr.io/v2/", "drop 'https://' and send 'nvcr.io'"),
    ("oci://Reg.Example.com:5000/charts", "drop 'oci://' and send 'reg.example.com:5000'"),
    ("nvcr.io/nvidia/charts", "without a path, query or fragment: send 'nvcr.io'"),
    ("nvcr.io?x=1", "without a path"),
    ("robot:hunter2@nvcr.io", "must not contain user info"),
    ("reg example.com", "must not contain spaces"),
    ("reg.example.com:0", "port must be a number from 1 to 65535, got 0"),
    ("reg.example.com:65536", "port must be a number from 1 to 65535, got 65536"),
    ("reg.example.com:http", "port must be a number from 1 to 65535"),
    ("reg.example.com:", "port must be a number from 1 to 65535"),
    (":5000", "has no host name"),
    ("-bad-.example.com", "is not a valid DNS name"),
    ("under_score.example.com", "is not a valid DNS name"),
    ("a..b", "is not a valid DNS name"),
    ("reg.example.com.", "must not end with '.'"),
    ("b\u00fccher.example", "punycode"),
    ("999.1.1.1", "is not a valid IPv4 address"),
    ("::1", "must be in brackets: '[::1]'"),
    ("[zz::1]:5000", "is not a valid IPv6 address"),
    ("[::1", "unclosed '['"),
    ("[::1]x", "nothing else after ']'"),
    ("a:b:c", "at most one ':'"),
]


async def test_every_hostname_rule(client: httpx.AsyncClient) -> None:
    for value, message in HOSTNAME_CASES:
        resp = await client.post(RC, json={**BASE, "registryHostname": value})
        errors = field_messages(resp)
        assert len(errors) == 1, (value, errors)
        assert errors[0][0] == "registryHostname"
        assert message in errors[0][1], (value, errors)
        assert message in resp.json()["detail"]
    assert (await client.get(RC)).json()["registryCredentials"] == []


async def test_userinfo_in_a_hostname_is_never_echoed(client: httpx.AsyncClient) -> None:
    for value in ("https://robot:hunter2@nvcr.io/v2", "robot:hunter2@nvcr.io", "https://hunter2@x"):
        resp = await client.post(RC, json={**BASE, "registryHostname": value})
        assert resp.status_code == 400
        assert "hunter2" not in resp.text, value
    resp = await client.post(RC, json={**BASE, "registryHostname": "https://robot:hunter2@nvcr.io"})
    assert "drop 'https://'" in resp.json()["errors"][0]["message"]


OTHER_FIELD_CASES: list[tuple[str, Any, str]] = [
    ("username", "", "must not be empty"),
    ("username", "u" * 256, "at most 255 characters"),
    ("username", "bad\u0007user", "printable"),
    ("username", "robot:x", "must not contain ':'"),
    ("username", " robot", "must not start or end with whitespace"),
    ("username", 7, "must be a string"),
    ("password", "", "must not be empty"),
    ("password", "Z" * 4097, "at most 4096 characters"),
    ("password", "token-with-newline\n", "control characters"),
    ("password", 1234, "must be a string"),
    ("password", ["x"], "must be a string"),
    ("description", "d" * 257, "at most 256 characters"),
    ("description", 5, "must be a string"),
]


async def test_every_other_field_rule(client: httpx.AsyncClient) -> None:
    for fld, value, message in OTHER_FIELD_CASES:
        resp = await client.post(RC, json={**BASE, fld: value})
        errors = field_messages(resp)
        assert errors == [(fld, errors[0][1])], (fld, value, errors)
        assert message in errors[0][1], (fld, value, errors)
    for fld in ("registryHostname", "username", "password"):
        body = {k: v for k, v in BASE.items() if k != fld}
        assert field_messages(await client.post(RC, json=body)) == [(fld, "is required")]
        body[fld] = None
        assert field_messages(await client.post(RC, json=body)) == [(fld, "is required")]
    assert field_messages(await client.post(RC, json=[BASE])) == [
        ("body", "must be a JSON object, got a list")
    ]
    unsupported = await client.post(RC, content=b"x", headers={"content-type": "text/plain"})
    assert unsupported.status_code == 415
    assert (await client.get(RC)).json()["registryCredentials"] == []


async def test_every_mistake_is_reported_together(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        RC,
        json={
            "registryHostname": "https://nvcr.io/v2",
            "username": "",
            "description": "d" * 300,
        },
    )
    errors = field_messages(resp)
    assert [f for f, _ in errors] == ["registryHostname", "username", "password", "description"]
    assert "4 violations" in resp.json()["detail"]


async def test_patch_validates_every_field(client: httpx.AsyncClient) -> None:
    cred = await create(client)
    url = f"{RC}/{cred['id']}"
    assert field_messages(await client.patch(url, json={})) == [
        ("body", "at least one of registryHostname, username, password, description is required")
    ]
    assert field_messages(await client.patch(url, json={"other": 1}))[0][0] == "body"
    errors = field_messages(
        await client.patch(
            url,
            json={
                "registryHostname": "http://reg.example.com",
                "username": None,
                "password": "",
                "description": 3,
            },
        )
    )
    assert [f for f, _ in errors] == ["registryHostname", "username", "password", "description"]
    assert "drop 'http://'" in errors[0][1]
    assert "cannot be null" in errors[1][1]
    # nothing changed
    assert (await client.get(url)).json()["registryCredential"] == cred


async def test_password_is_never_returned(client: httpx.AsyncClient) -> None:
    created = await client.post(RC, json=BASE)
    cred = created.json()["registryCredential"]
    responses = [
        created,
        await client.get(RC),
        await client.get(RC, params={"limit": 10}),
        await client.get(f"{RC}/{cred['id']}"),
        await client.patch(f"{RC}/{cred['id']}", json={"password": PW + "-2"}),
        await client.post(RC, json=BASE),  # duplicate: 409
        await client.post(RC, json={**BASE, "registryHostname": "bad host"}),
        await client.post(RC, json={**BASE, "username": "", "password": PW + "\n"}),
        await client.patch(f"{RC}/{cred['id']}", json={"password": PW + "\t", "username": ""}),
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 200, 409, 400, 400, 400]
    for resp in responses:
        assert PW not in resp.text
        assert "password" not in resp.json().get("registryCredential", {})
        for item in resp.json().get("registryCredentials", []):
            assert "password" not in item


async def test_passwords_are_encrypted_at_rest(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await create(client)
    engine = create_async_engine(database_url)
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT * FROM registry_credentials"))).mappings().all()
    await engine.dispose()
    assert len(rows) == 1
    assert rows[0]["username"] == "robot"
    assert rows[0]["password_ciphertext"]
    for value in rows[0].values():
        assert PW not in str(value)


async def test_password_is_not_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cred = await create(client)
    await client.patch(f"{RC}/{cred['id']}", json={"password": PW + "-rotated"})
    await client.post(RC, json=BASE)  # 409
    await client.post(RC, json={**BASE, "password": PW + "\n", "username": ""})  # 400
    await client.post(RC, json={**BASE, "registryHostname": f"https://robot:{PW}@nvcr.io"})
    await client.delete(f"{RC}/{cred['id']}")
    assert caplog.records  # the access log did run
    assert PW not in caplog.text
    for record in caplog.records:
        assert PW not in record.getMessage()


async def test_accounts_are_isolated(client: httpx.AsyncClient) -> None:
    cred = await create(client)
    other = bearer(await new_key(client, ["manage_registry_credentials"], account="team-b"))
    url = f"{RC}/{cred['id']}"
    assert (await client.get(url, headers=other)).status_code == 404
    assert (await client.patch(url, json={"description": "x"}, headers=other)).status_code == 404
    assert (await client.delete(url, headers=other)).status_code == 404
    assert (await client.get(RC, headers=other)).json() == {"registryCredentials": []}
    # the same host and username is fine in another account
    resp = await client.post(RC, json=BASE, headers=other)
    assert resp.status_code == 200
    assert resp.json()["registryCredential"]["id"] != cred["id"]
    assert (await client.get(url)).json()["registryCredential"] == cred
    assert len((await client.get(RC)).json()["registryCredentials"]) == 1


async def test_scope_is_required(client: httpx.AsyncClient) -> None:
    cred = await create(client)
    key = bearer(await new_key(client, ["register_function", "list_functions", "deploy_function"]))
    url = f"{RC}/{cred['id']}"
    for resp in (
        await client.post(RC, json=BASE, headers=key),
        await client.get(RC, headers=key),
        await client.get(url, headers=key),
        await client.patch(url, json={"description": "x"}, headers=key),
        await client.delete(url, headers=key),
    ):
        assert resp.status_code == 403
        assert "manage_registry_credentials" in resp.json()["detail"]
    assert (await client.get(RC, headers={"Authorization": "Bearer nope"})).status_code == 401
    assert (await client.get(url)).status_code == 200


async def test_duplicates_conflict(client: httpx.AsyncClient) -> None:
    first = await create(client)
    dup = await client.post(RC, json={**BASE, "registryHostname": "REGISTRY.example.com"})
    assert dup.status_code == 409
    detail = dup.json()["detail"]
    assert "registry.example.com" in detail and "robot" in detail
    # another username, or another port, is another credential
    second = await create(client, username="robot-2")
    await create(client, registryHostname="registry.example.com:5000")
    clash = await client.patch(f"{RC}/{second['id']}", json={"username": "robot"})
    assert clash.status_code == 409
    assert "robot" in clash.json()["detail"]
    # patching a credential onto its own (host, username) is not a conflict
    same = await client.patch(f"{RC}/{first['id']}", json={"username": "robot"})
    assert same.status_code == 200
    assert len((await client.get(RC)).json()["registryCredentials"]) == 3


async def test_pagination(client: httpx.AsyncClient) -> None:
    made = [(await create(client, username=f"user-{i}"))["id"] for i in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        body = (await client.get(RC, params=params)).json()
        seen += [c["id"] for c in body["registryCredentials"]]
        pages += 1
        cursor = body.get("nextCursor")
        if not cursor:
            break
    assert seen == made and pages == 3
    everything = (await client.get(RC)).json()
    assert [c["id"] for c in everything["registryCredentials"]] == made
    assert "nextCursor" not in everything
    assert (await client.get(RC, params={"limit": 0})).status_code == 400
    assert (await client.get(RC, params={"limit": 1001})).status_code == 400
    bad = await client.get(RC, params={"cursor": "garbage"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "cursor"


async def test_org_prefixes(client: httpx.AsyncClient) -> None:
    for prefix in ("/v2/orgs/nvcf-default/nvcf", "/v2/orgs/nvcf-default/teams/ml/nvcf"):
        url = f"{prefix}/registry-credentials"
        created = await client.post(url, json={**BASE, "username": f"via{len(prefix)}"})
        assert created.status_code == 200, created.text
        cid = created.json()["registryCredential"]["id"]
        assert (await client.get(f"{url}/{cid}")).status_code == 200
        assert (await client.patch(f"{url}/{cid}", json={"description": "x"})).status_code == 200
        assert cid in [c["id"] for c in (await client.get(url)).json()["registryCredentials"]]
        assert (await client.delete(f"{url}/{cid}")).status_code == 204
    wrong = await client.get("/v2/orgs/someone-else/nvcf/registry-credentials")
    assert wrong.status_code == 403


async def test_idempotent_create(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "cred-1"}
    first = await client.post(RC, json=BASE, headers=headers)
    again = await client.post(RC, json=BASE, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert PW not in again.text
    clash = await client.post(RC, json={**BASE, "username": "x"}, headers=headers)
    assert clash.status_code == 409
    assert len((await client.get(RC)).json()["registryCredentials"]) == 1


async def test_credentials_for_host_and_all_credentials(
    client: httpx.AsyncClient, database_url: str, make_settings: SettingsFactory
) -> None:
    await create(client, registryHostname="reg.example.com", username="a", password="pw-a")
    await create(client, registryHostname="reg.example.com:5000", username="b", password="pw-b")
    await create(client, registryHostname="reg.example.com:6000", username="c", password="pw-c")
    await create(client, registryHostname="other.example.com", username="d", password="pw-d")
    await create(client, registryHostname="reg.example.com", username="e", password="pw-e")
    other = bearer(await new_key(client, ["manage_registry_credentials"], account="team-b"))
    resp = await client.post(
        RC, json={**BASE, "registryHostname": "reg.example.com"}, headers=other
    )
    assert resp.status_code == 200

    box = load_secret_box(make_settings())  # the key the app generated in its data dir
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            account = "nvcf-default"
            assert await credentials_for_host(session, account, "reg.example.com", box=box) == [
                ("a", "pw-a"),
                ("e", "pw-e"),
            ]
            assert await credentials_for_host(
                session, account, "REG.example.com:5000", box=box
            ) == [("a", "pw-a"), ("b", "pw-b"), ("e", "pw-e")]
            assert await credentials_for_host(session, account, "nowhere.example", box=box) == []
            assert await credentials_for_host(session, "team-b", "reg.example.com", box=box) == [
                ("robot", PW)
            ]
            assert await all_credentials(session, account, box=box) == [
                ("reg.example.com", "a", "pw-a"),
                ("reg.example.com:5000", "b", "pw-b"),
                ("reg.example.com:6000", "c", "pw-c"),
                ("other.example.com", "d", "pw-d"),
                ("reg.example.com", "e", "pw-e"),
            ]
    finally:
        await engine.dispose()


async def test_concurrent_duplicates_store_one(client: httpx.AsyncClient) -> None:
    responses = await asyncio.gather(*[client.post(RC, json=BASE) for _ in range(6)])
    assert sorted(r.status_code for r in responses) == [200] + [409] * 5
    for resp in responses:
        assert PW not in resp.text
    assert len((await client.get(RC)).json()["registryCredentials"]) == 1

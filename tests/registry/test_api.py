"""Registry credentials over HTTP in NVCF's shape (api.md §5), on SQLite and PostgreSQL.

Requests are built as nvcf-cli builds them and responses decoded as its Go structs decode
them (tests/support/nvcf_cli.py): a field of the wrong JSON type fails the decode, as it
fails the CLI. The tests share one app per database; each works in an account of its own
(`client` carries that account's key, `admin` the operator's).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import select, text

from service.auth.models import ApiKey
from service.auth.service import hash_key
from service.core.crypto import load_secret_box
from service.registry.models import ArtifactType
from service.registry.pull_secrets import account_pull_secrets, pull_secret_name
from service.registry.service import all_credentials, credentials_for_host
from tests.support.api import bearer, new_key
from tests.support.app import AppClient
from tests.support.nvcf_cli import (
    DETAILS_RESPONSE,
    LIST_RESPONSE,
    RECOGNIZED_RESPONSE,
    GoDecodeError,
    add_request,
    encode_secret,
    go_decode,
    update_request,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

V = "/v2/nvcf"
RC = f"{V}/registry-credentials"
PW = "s3cr3t-PW-do-not-leak-9f8e7d"
HOST = "registry.example.com"
BASE: dict[str, Any] = add_request(HOST, "robot", PW, ["CONTAINER"])
#: every field of a credential in a response, as NVCF's RegistryCredentialDetailsDto has them
#: (keyType only for NGC legacy keys; tags and description only when set)
FIELDS = {
    "registryCredentialId",
    "ncaId",
    "registryCredentialName",
    "registryName",
    "registryHostname",
    "artifactTypes",
    "provisionedBy",
    "lastUpdatedAt",
    "createdAt",
}


@pytest.fixture
def account() -> str:
    return f"acct-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


@pytest_asyncio.fixture(loop_scope="module")
async def client(admin: AppClient, account: str) -> AsyncIterator[AppClient]:
    """The module's app as seen by a key of the test's own account."""
    key = await new_key(admin, ["manage_registry_credentials"], account=account)
    async with AppClient(
        transport=httpx.ASGITransport(app=admin.app),
        base_url="http://nvcf.test",
        headers=bearer(key),
    ) as c:
        c.app = admin.app
        yield c


def body(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


def secret(username: str, password: str, name: str = "credentials") -> dict[str, str]:
    return {"name": name, "value": encode_secret(username, password)}


async def create(client: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    resp = await client.post(RC, json=body(**changes))
    assert resp.status_code == 200, resp.text
    decoded = go_decode(DETAILS_RESPONSE, resp.json())["registryCredential"]
    assert decoded["registryCredentialId"]
    return dict(resp.json()["registryCredential"])


async def listed(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    resp = await client.get(RC, params=params)
    assert resp.status_code == 200, resp.text
    go_decode(LIST_RESPONSE, resp.json())
    return list(resp.json()["registryCredentials"])


def field_messages(resp: httpx.Response) -> list[tuple[str, str]]:
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return [(e["field"], e["message"]) for e in resp.json()["errors"]]


async def test_the_go_decoding_is_as_strict_as_the_cli() -> None:  # async: the module mark
    good = {
        "registryCredential": {
            "RegistryCredentialID": "x",  # keys match case-insensitively, as in Go
            "artifactTypes": ["HELM"],
            "tags": None,
            "unknown": {"ignored": True},
        }
    }
    decoded = go_decode(DETAILS_RESPONSE, good)["registryCredential"]
    assert decoded["registryCredentialId"] == "x"
    assert decoded["artifactTypes"] == ["HELM"] and decoded["tags"] is None
    assert decoded["createdAt"] == ""  # absent: the zero value
    for wrong in (
        {"artifactTypes": "HELM"},
        {"artifactTypes": [1]},
        {"tags": "a,b"},
        {"createdAt": 1700000000},
        {"registryCredentialId": {"id": "x"}},
    ):
        with pytest.raises(GoDecodeError):
            go_decode(DETAILS_RESPONSE, {"registryCredential": wrong})
    with pytest.raises(GoDecodeError):
        go_decode(LIST_RESPONSE, {"registryCredentials": {"a": 1}})
    with pytest.raises(GoDecodeError):
        go_decode(RECOGNIZED_RESPONSE, {"recognizedRegistries": {"HELM": [{"name": 1}]}})


async def test_cli_add_get_list_update_delete(client: httpx.AsyncClient, account: str) -> None:
    request = add_request(
        HOST,
        "robot",
        PW,
        ["container"],  # the CLI upper-cases; a lower-case one is accepted too
        tags=["env:prod", "team=ml"],
        description="CI robot",
    )
    request["artifactTypes"] = ["container"]
    resp = await client.post(RC, json={**request, "extra": "ignored"})
    assert resp.status_code == 200, resp.text
    raw = resp.json()["registryCredential"]
    assert set(raw) == FIELDS | {"tags", "description"}
    cred = go_decode(DETAILS_RESPONSE, resp.json())["registryCredential"]
    uuid.UUID(cred["registryCredentialId"])
    assert cred["ncaId"] == account
    assert cred["registryCredentialName"] == "credentials"
    assert cred["registryName"] == "Custom Registry"
    assert cred["registryHostname"] == HOST
    assert cred["artifactTypes"] == ["CONTAINER"]
    assert cred["tags"] == ["env:prod", "team=ml"]
    assert cred["description"] == "CI robot"
    assert cred["provisionedBy"] == "USER"
    assert cred["createdAt"].endswith("Z") and len(cred["createdAt"]) == 24  # milliseconds
    assert cred["lastUpdatedAt"] == cred["createdAt"]
    url = f"{RC}/{cred['registryCredentialId']}"

    got = await client.get(url)
    assert got.status_code == 200 and got.json() == {"registryCredential": raw}
    go_decode(DETAILS_RESPONSE, got.json())

    listing = await client.get(RC)
    assert listing.json() == {"registryCredentials": [raw]}  # no nextCursor without paging
    assert go_decode(LIST_RESPONSE, listing.json())["registryCredentials"] == [cred]

    # `registry-credential update <id> --artifact-type HELM --artifact-type model`
    patched = await client.patch(url, json=update_request(artifact_types=["HELM", "model"]))
    assert patched.status_code == 200, patched.text
    after = go_decode(DETAILS_RESPONSE, patched.json())["registryCredential"]
    assert after["artifactTypes"] == ["CONTAINER", "HELM", "MODEL"]  # added, never replaced
    assert after["createdAt"] == cred["createdAt"]
    assert after["lastUpdatedAt"] >= cred["lastUpdatedAt"]
    assert (after["tags"], after["description"]) == (cred["tags"], cred["description"])

    # `registry-credential update <id> --username robot --password new`
    patched = await client.patch(url, json=update_request("robot", PW + "-2"))
    assert patched.status_code == 200, patched.text
    again = go_decode(DETAILS_RESPONSE, patched.json())["registryCredential"]
    assert again["artifactTypes"] == ["CONTAINER", "HELM", "MODEL"]
    assert again["registryCredentialName"] == "credentials"
    assert PW not in patched.text

    deleted = await client.delete(url)
    assert deleted.status_code == 204 and deleted.content == b""
    assert (await client.get(url)).status_code == 404
    assert (await client.delete(url)).status_code == 404
    assert (await client.get(RC)).json() == {"registryCredentials": []}


async def test_nulls_and_empty_optionals_are_omitted(client: httpx.AsyncClient) -> None:
    cred = await create(client, description="", tags=None)
    assert set(cred) == FIELDS
    empty_tags = await create(client, secret=secret("robot", PW, name="other"), tags=[])
    assert empty_tags["tags"] == []


async def test_list_filters(client: AppClient) -> None:
    c = await create(client, secret=secret("a", "pw", "c"), artifactTypes=["CONTAINER"])
    h = await create(client, secret=secret("b", "pw", "h"), artifactTypes=["HELM"])
    ch = await create(client, secret=secret("c", "pw", "ch"), artifactTypes=["HELM", "CONTAINER"])
    m = await create(client, secret=secret("d", "pw", "m"), artifactTypes=["MODEL", "RESOURCE"])

    def ids(items: list[dict[str, Any]]) -> list[str]:
        return [i["registryCredentialId"] for i in items]

    every = [x["registryCredentialId"] for x in (c, h, ch, m)]
    assert ids(await listed(client)) == every
    assert ids(await listed(client, artifactType="HELM")) == ids([h, ch])
    assert ids(await listed(client, artifactType="helm")) == ids([h, ch])
    # repeated, as nvcf-cli sends several, or comma-separated, as Spring also reads them
    repeated = await client.get(
        RC, params=[("artifactType", "CONTAINER"), ("artifactType", "MODEL")]
    )
    assert ids(repeated.json()["registryCredentials"]) == ids([c, ch, m])
    assert ids(await listed(client, artifactType="RESOURCE,CONTAINER")) == ids([c, ch, m])
    assert ids(await listed(client, provisionedBy="USER")) == every
    assert await listed(client, provisionedBy="SYSTEM") == []
    assert ids(await listed(client, provisionedBy="SYSTEM,user", artifactType="MODEL")) == ids([m])
    paged = await client.get(RC, params={"artifactType": "HELM", "limit": 1})
    assert ids(paged.json()["registryCredentials"]) == ids([h])
    rest = await client.get(
        RC, params={"artifactType": "HELM", "limit": 1, "cursor": paged.json()["nextCursor"]}
    )
    assert ids(rest.json()["registryCredentials"]) == ids([ch])

    errors = field_messages(
        await client.get(RC, params=[("artifactType", "HELM,CHART"), ("provisionedBy", "ME")])
    )
    assert errors == [
        ("artifactType", "must be one of CONTAINER, HELM, MODEL, RESOURCE, got 'CHART'"),
        ("provisionedBy", "must be one of SYSTEM, USER, got 'ME'"),
    ]

    # A credential the operator provisioned: listed under SYSTEM, and not deletable.
    async with client.app.state.sessionmaker() as session, session.begin():
        await session.execute(
            text("UPDATE registry_credentials SET provisioned_by = 'SYSTEM' WHERE id = :id"),
            {"id": m["registryCredentialId"]},
        )
    system = await listed(client, provisionedBy="SYSTEM")
    assert ids(system) == ids([m]) and system[0]["provisionedBy"] == "SYSTEM"
    refused = await client.delete(f"{RC}/{m['registryCredentialId']}")
    assert refused.status_code == 400
    assert "provisioned by the system" in refused.json()["detail"]
    assert len(await listed(client)) == 4


async def test_patch_adds_types_and_replaces_the_secret(client: AppClient, account: str) -> None:
    cred = await create(client)
    url = f"{RC}/{cred['registryCredentialId']}"
    same = await client.patch(url, json={"artifactTypeEnums": ["CONTAINER", "container"]})
    assert same.status_code == 200, same.text
    assert same.json()["registryCredential"]["artifactTypes"] == ["CONTAINER"]

    renamed = await client.patch(url, json={"secret": secret("robot-2", "pw-2", "ci-login")})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["registryCredential"]["registryCredentialName"] == "ci-login"
    # null is the same as absent (NVCF's UpdateRegistryCredentialRequest fields are nullable)
    types = await client.patch(url, json={"secret": None, "artifactTypeEnums": ["HELM"]})
    assert types.status_code == 200, types.text
    assert types.json()["registryCredential"]["artifactTypes"] == ["CONTAINER", "HELM"]

    box = load_secret_box(client.app.state.settings)
    async with client.app.state.sessionmaker() as session:
        helm = await credentials_for_host(
            session, account, HOST, box=box, artifact_type=ArtifactType.HELM
        )
    assert helm == [("robot-2", "pw-2")]


async def test_patch_rules(client: httpx.AsyncClient) -> None:
    cred = await create(client)
    url = f"{RC}/{cred['registryCredentialId']}"
    needed = [
        ("body", "either secret or artifactTypeEnums (the artifact types to add) is required")
    ]
    assert field_messages(await client.patch(url, json={})) == needed
    assert field_messages(await client.patch(url, json={"artifactTypeEnums": []})) == needed
    assert field_messages(await client.patch(url, json={"description": "x"})) == needed
    errors = field_messages(
        await client.patch(
            url,
            json={
                "secret": {"name": "-bad", "value": "not base64!"},
                "artifactTypeEnums": ["HELM", "CHART"],
            },
        )
    )
    assert [f for f, _ in errors] == ["secret.name", "secret.value", "artifactTypeEnums[1]"]
    assert "'CHART'" in errors[2][1]
    errors = field_messages(await client.patch(url, json={"artifactTypeEnums": "HELM"}))
    assert errors == [
        (
            "artifactTypeEnums",
            "must be a list of artifact types (CONTAINER, HELM, MODEL, RESOURCE), got a string",
        )
    ]
    assert (await client.get(url)).json()["registryCredential"] == cred  # nothing changed


async def test_recognized_registries(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{V}/recognized-registries")
    assert resp.status_code == 200, resp.text
    recognized = go_decode(RECOGNIZED_RESPONSE, resp.json())["recognizedRegistries"]
    assert set(recognized) == {"CONTAINER", "HELM", "MODEL", "RESOURCE"}
    for items in recognized.values():
        assert all(set(item) == {"name", "hostname"} for item in items)
        assert [i["name"] for i in items] == sorted(i["name"] for i in items)
    container = {i["hostname"]: i["name"] for i in recognized["CONTAINER"]}
    assert container["nvcr.io"] == "NGC Private Registry"
    assert container["docker.io"] == "Docker Hub Registry"
    assert container["dkr.ecr.amazonaws.com"] == "AWS ECR Private Registry"
    assert container["public.ecr.aws"] == "AWS ECR Public Registry"
    assert container["azurecr.io"] == "Azure Container Registry"
    helm = {i["hostname"]: i["name"] for i in recognized["HELM"]}
    assert helm["helm.ngc.nvidia.com"] == "NGC Private Registry"
    assert recognized["MODEL"] == [
        {"name": "NGC Private Registry", "hostname": "api.ngc.nvidia.com"}
    ]


async def test_registry_name_and_key_type(client: httpx.AsyncClient) -> None:
    cases = {
        "nvcr.io": "NGC Private Registry",
        "helm.ngc.nvidia.com": "NGC Private Registry",
        "123456789012.dkr.ecr.us-west-2.amazonaws.com": "AWS ECR Private Registry",
        "public.ecr.aws": "AWS ECR Public Registry",
        "myteam.azurecr.io": "Azure Container Registry",
        "models-cn-beijing.cr.volces.com": "Volcano Engine Registry",
        "docker.io": "Docker Hub Registry",
        "localhost:5000": "Custom Registry",
        "12345.dkr.ecr.us-west-2.amazonaws.com": "Custom Registry",
    }
    for host, name in cases.items():
        login = ("$oauthtoken", "nvapi-key") if "nvcr" in host or "ngc" in host else ("u", "p")
        cred = await create(client, registryHostname=host, secret=secret(*login))
        assert cred["registryName"] == name, host
        assert "keyType" not in cred
    legacy = await create(
        client, registryHostname="nvcr.io", secret=secret("$oauthtoken", "old-key", "legacy")
    )
    assert legacy["keyType"] == "LEGACY"
    got = await client.get(f"{RC}/{legacy['registryCredentialId']}")
    assert got.json()["registryCredential"]["keyType"] == "LEGACY"
    rotated = await client.patch(
        f"{RC}/{legacy['registryCredentialId']}",
        json={"secret": secret("$oauthtoken", "nvapi-new", "legacy")},
    )
    assert "keyType" not in rotated.json()["registryCredential"]


async def test_hostnames_are_normalised(client: httpx.AsyncClient) -> None:
    cases = {
        "Registry.Example.COM": "registry.example.com",
        "reg.example.com:05000": "reg.example.com:5000",
        "localhost:5000": "localhost:5000",
        "10.0.0.1:5000": "10.0.0.1:5000",
        "[0:0:0:0:0:0:0:1]:5000": "[::1]:5000",
        "[FD00::AB]": "[fd00::ab]",
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
    resp = await client.patch(f"{RC}/{missing}", json={"artifactTypeEnums": ["HELM"]})
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
    ("reg.example.com:\u00b2", "port must be a number from 1 to 65535"),
    ("reg.example.com:+80", "port must be a number from 1 to 65535"),
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
        resp = await client.post(RC, json=body(registryHostname=value))
        errors = field_messages(resp)
        assert len(errors) == 1, (value, errors)
        assert errors[0][0] == "registryHostname"
        assert message in errors[0][1], (value, errors)
        assert message in resp.json()["detail"]
    assert (await client.get(RC)).json()["registryCredentials"] == []


async def test_userinfo_in_a_hostname_is_never_echoed(client: httpx.AsyncClient) -> None:
    for value in ("https://robot:hunter2@nvcr.io/v2", "robot:hunter2@nvcr.io", "https://hunter2@x"):
        resp = await client.post(RC, json=body(registryHostname=value))
        assert resp.status_code == 400
        assert "hunter2" not in resp.text, value
    resp = await client.post(RC, json=body(registryHostname="https://robot:hunter2@nvcr.io"))
    assert "drop 'https://'" in resp.json()["errors"][0]["message"]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


SECRET_VALUE_CASES: list[tuple[Any, str]] = [
    ("", "must be 1 to 32768 characters"),
    ("Z" * 32769, "must be 1 to 32768 characters"),
    ("cm9ib3Q6cHc=\n", "standard base64"),
    ("cm9i b3Q6cHc=", "standard base64"),
    ("cm9ib3Q6cHc-_", "standard base64"),
    ("cm9ib3Q6c", "standard base64"),  # a length no base64 text has
    (b64(b"robot-without-colon"), "there is no ':' after the user name"),
    (b64(b":pw"), "the user name before the ':' must not be empty"),
    (b64(b"robot:"), "the password after the ':' must not be empty"),
    (b64(b"robot:token\n"), "must not contain control characters"),
    (b64(b" robot:pw"), "must not start or end with whitespace"),
    (b64(b"ro\x07bot:pw"), "printable"),
    (b64(b"u" * 256 + b":pw"), "at most 255 characters"),
    (b64(b"robot:\xff\xfe"), "UTF-8"),
    (1234, "must be a string"),
    ({"username": "robot"}, "must be a string"),
    (None, "is required"),
]


async def test_every_secret_value_rule(client: httpx.AsyncClient) -> None:
    for value, message in SECRET_VALUE_CASES:
        resp = await client.post(RC, json=body(secret={"name": "credentials", "value": value}))
        errors = field_messages(resp)
        assert len(errors) == 1 and errors[0][0] == "secret.value", (value, errors)
        assert message in errors[0][1], (value, errors)
        assert "32769" not in resp.text  # never a length of the secret
    # unpadded base64 is accepted (Java's decoder, which NVCF uses, accepts it)
    await create(client, secret={"name": "unpadded", "value": b64(b"robot:pw").rstrip("=")})
    # a password may contain ':' (only the user name cannot)
    await create(client, secret=secret("robot", "pass:word", "colon"))
    # NGC takes only $oauthtoken logins, as in NVCF
    errors = field_messages(
        await client.post(RC, json=body(registryHostname="nvcr.io", secret=secret("robot", PW)))
    )
    assert errors[0][0] == "secret.value" and "'$oauthtoken'" in errors[0][1]
    assert len(await listed(client)) == 2


OTHER_FIELD_CASES: list[tuple[str, Any, str, str]] = [
    ("secret", "c2VjcmV0", "secret", "must be an object with name and value, got a string"),
    ("secret", {"value": encode_secret("u", "p")}, "secret.name", "is required"),
    ("secret", secret("u", "p", "-lead"), "secret.name", "must start with a letter or digit"),
    ("secret", secret("u", "p", "n" * 49), "secret.name", "at most 48 characters"),
    ("secret", secret("u", "p", "a b"), "secret.name", "contain only letters"),
    ("artifactTypes", "CONTAINER", "artifactTypes", "must be a list of artifact types"),
    ("artifactTypes", [], "artifactTypes", "must not be empty"),
    ("artifactTypes", ["HELM", "CHART"], "artifactTypes[1]", "got 'CHART'"),
    ("artifactTypes", [7], "artifactTypes[0]", "must be one of CONTAINER, HELM, MODEL, RESOURCE"),
    ("artifactTypes", None, "artifactTypes", "is required"),
    ("tags", "a,b", "tags", "must be a list of strings"),
    ("tags", ["ok", "not ok"], "tags[1]", "may contain only letters"),
    ("tags", ["t"] * 65, "tags", "at most 64 items"),
    ("tags", ["x" * 129], "tags[0]", "at most 128 characters"),
    ("description", "d" * 257, "description", "at most 256 characters"),
    ("description", 5, "description", "must be a string"),
]


async def test_every_other_field_rule(client: httpx.AsyncClient) -> None:
    for fld, value, where, message in OTHER_FIELD_CASES:
        errors = field_messages(await client.post(RC, json=body(**{fld: value})))
        assert len(errors) == 1 and errors[0][0] == where, (fld, value, errors)
        assert message in errors[0][1], (fld, value, errors)
    for fld in ("registryHostname", "secret", "artifactTypes"):
        partial = {k: v for k, v in BASE.items() if k != fld}
        assert field_messages(await client.post(RC, json=partial)) == [(fld, "is required")]
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
            "secret": {"name": "", "value": "%%%"},
            "artifactTypes": ["IMAGE"],
            "description": "d" * 300,
        },
    )
    errors = field_messages(resp)
    assert [f for f, _ in errors] == [
        "registryHostname",
        "secret.name",
        "secret.value",
        "artifactTypes[0]",
        "description",
    ]
    assert "IMAGE" in errors[3][1]
    assert "5 violations" in resp.json()["detail"]


async def test_the_secret_is_never_returned_nor_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    encoded = encode_secret("robot", PW)
    created = await client.post(RC, json=BASE)
    cred = created.json()["registryCredential"]
    url = f"{RC}/{cred['registryCredentialId']}"
    bad_pw = {"name": "x", "value": encode_secret("robot", PW + "\n")}
    responses = [
        created,
        await client.get(RC),
        await client.get(RC, params={"limit": 10}),
        await client.get(url),
        await client.patch(url, json=update_request("robot", PW + "-2")),
        await client.post(RC, json=BASE),  # duplicate: 409
        await client.post(RC, json=body(registryHostname="bad host")),
        await client.post(RC, json=body(secret=bad_pw)),
        await client.patch(url, json={"secret": bad_pw}),
        await client.post(RC, json=body(registryHostname=f"https://robot:{PW}@nvcr.io")),
        await client.post(RC, json=body(registryHostname="nvcr.io")),  # NGC: $oauthtoken only
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 200, 409] + [400] * 5
    for resp in responses:
        for leak in (PW, encoded, encode_secret("robot", PW + "-2"), bad_pw["value"]):
            assert leak not in resp.text
        assert "secret" not in resp.json().get("registryCredential", {})
    assert (await client.delete(url)).status_code == 204
    assert caplog.records  # the access log did run
    for record in caplog.records:
        assert PW not in record.getMessage() and encoded not in record.getMessage()
    assert PW not in caplog.text and encoded not in caplog.text


async def test_passwords_are_encrypted_at_rest(client: AppClient, account: str) -> None:
    await create(client)
    async with client.app.state.sessionmaker() as session:
        rows = (
            (
                await session.execute(
                    text("SELECT * FROM registry_credentials WHERE account_id = :a"),
                    {"a": account},
                )
            )
            .mappings()
            .all()
        )
    assert len(rows) == 1
    assert rows[0]["username"] == "robot" and rows[0]["name"] == "credentials"
    assert rows[0]["password_ciphertext"]
    for value in rows[0].values():
        assert PW not in str(value)
        assert encode_secret("robot", PW) not in str(value)


async def test_accounts_are_isolated(client: httpx.AsyncClient, admin: AppClient) -> None:
    cred = await create(client)
    team_b = f"team-b-{uuid.uuid4().hex[:8]}"
    other = bearer(await new_key(admin, ["manage_registry_credentials"], account=team_b))
    url = f"{RC}/{cred['registryCredentialId']}"
    change = update_request(artifact_types=["HELM"])
    assert (await client.get(url, headers=other)).status_code == 404
    assert (await client.patch(url, json=change, headers=other)).status_code == 404
    assert (await client.delete(url, headers=other)).status_code == 404
    assert (await client.get(RC, headers=other)).json() == {"registryCredentials": []}
    # the same host and name is fine in another account
    resp = await client.post(RC, json=BASE, headers=other)
    assert resp.status_code == 200
    theirs = resp.json()["registryCredential"]
    assert theirs["registryCredentialId"] != cred["registryCredentialId"]
    assert theirs["ncaId"] == team_b
    assert (await client.get(url)).json()["registryCredential"] == cred
    assert len(await listed(client)) == 1


async def test_scope_is_required(client: httpx.AsyncClient, admin: AppClient, account: str) -> None:
    cred = await create(client)
    scopes = ["register_function", "list_functions", "deploy_function"]
    key = bearer(await new_key(admin, scopes, account=account))
    url = f"{RC}/{cred['registryCredentialId']}"
    for resp in (
        await client.post(RC, json=BASE, headers=key),
        await client.get(RC, headers=key),
        await client.get(url, headers=key),
        await client.patch(url, json=update_request(artifact_types=["HELM"]), headers=key),
        await client.delete(url, headers=key),
        await client.get(f"{V}/recognized-registries", headers=key),
    ):
        assert resp.status_code == 403
        assert "manage_registry_credentials" in resp.json()["detail"]
    assert (await client.get(RC, headers={"Authorization": "Bearer nope"})).status_code == 401
    assert (await client.get(url)).status_code == 200


async def test_duplicates_conflict(client: httpx.AsyncClient) -> None:
    first = await create(client)
    # nvcf-cli names every secret `credentials`: a second one for the same host is a 409
    dup = await client.post(
        RC, json=add_request("REGISTRY.example.com", "other-robot", "pw", ["HELM"])
    )
    assert dup.status_code == 409
    detail = dup.json()["detail"]
    assert HOST in detail and "'credentials'" in detail and first["registryCredentialId"] in detail
    # another name, or another port, is another credential; the same login may repeat
    second = await create(client, secret=secret("robot", PW, "second"))
    await create(client, registryHostname=f"{HOST}:5000")
    clash = await client.patch(
        f"{RC}/{second['registryCredentialId']}", json={"secret": secret("robot", "x")}
    )
    assert clash.status_code == 409
    assert "'credentials'" in clash.json()["detail"]
    # patching a credential's secret under its own name is not a conflict
    same = await client.patch(
        f"{RC}/{first['registryCredentialId']}", json=update_request("robot", "new")
    )
    assert same.status_code == 200
    assert len(await listed(client)) == 3


async def test_pagination(client: httpx.AsyncClient) -> None:
    made = [
        (await create(client, secret=secret("robot", PW, f"name-{i}")))["registryCredentialId"]
        for i in range(5)
    ]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get(RC, params=params)).json()
        seen += [c["registryCredentialId"] for c in page["registryCredentials"]]
        pages += 1
        cursor = page.get("nextCursor")
        if not cursor:
            break
    assert seen == made and pages == 3
    everything = (await client.get(RC)).json()
    assert [c["registryCredentialId"] for c in everything["registryCredentials"]] == made
    assert "nextCursor" not in everything
    assert (await client.get(RC, params={"limit": 0})).status_code == 400
    assert (await client.get(RC, params={"limit": 1001})).status_code == 400
    bad = await client.get(RC, params={"cursor": "garbage"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "cursor"


async def test_org_prefixes(client: httpx.AsyncClient, account: str) -> None:
    for prefix in (f"/v2/orgs/{account}/nvcf", f"/v2/orgs/{account}/teams/ml/nvcf"):
        url = f"{prefix}/registry-credentials"
        created = await client.post(url, json=body(secret=secret("u", "p", f"via{len(prefix)}")))
        assert created.status_code == 200, created.text
        cid = created.json()["registryCredential"]["registryCredentialId"]
        assert (await client.get(f"{url}/{cid}")).status_code == 200
        change = update_request(artifact_types=["HELM"])
        assert (await client.patch(f"{url}/{cid}", json=change)).status_code == 200
        items = (await client.get(url, params={"artifactType": "HELM"})).json()
        assert cid in [c["registryCredentialId"] for c in items["registryCredentials"]]
        assert (await client.delete(f"{url}/{cid}")).status_code == 204
        recognized = await client.get(f"{prefix}/recognized-registries")
        assert recognized.status_code == 200
        go_decode(RECOGNIZED_RESPONSE, recognized.json())
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
    clash = await client.post(RC, json=body(secret=secret("x", "y", "x")), headers=headers)
    assert clash.status_code == 409
    assert len(await listed(client)) == 1


async def test_pulls_use_only_credentials_of_their_artifact_type(
    client: AppClient, admin: AppClient, account: str
) -> None:
    def make(host: str, user: str, types: list[str]) -> dict[str, Any]:
        return add_request(host, user, f"pw-{user}", types, name=f"login-{user}")

    for request in (
        make("reg.example.com", "a", ["HELM", "CONTAINER"]),
        make("reg.example.com:5000", "b", ["HELM"]),
        make("reg.example.com:6000", "c", ["CONTAINER"]),
        make("other.example.com", "d", ["HELM", "CONTAINER"]),
        make("reg.example.com", "e", ["HELM"]),
        make("reg.example.com", "f", ["CONTAINER"]),
        make("reg.example.com", "g", ["MODEL", "RESOURCE"]),
    ):
        assert (await client.post(RC, json=request)).status_code == 200
    team_b = f"team-b-{uuid.uuid4().hex[:8]}"
    other = bearer(await new_key(admin, ["manage_registry_credentials"], account=team_b))
    resp = await client.post(
        RC, json=add_request("reg.example.com", "robot", PW, ["HELM", "CONTAINER"]), headers=other
    )
    assert resp.status_code == 200

    box = load_secret_box(client.app.state.settings)  # the key the app generated
    helm, container = ArtifactType.HELM, ArtifactType.CONTAINER
    async with client.app.state.sessionmaker() as session:

        async def for_host(host: str, owner: str = account) -> list[tuple[str, str]]:
            return await credentials_for_host(session, owner, host, box=box, artifact_type=helm)

        assert await for_host("reg.example.com") == [("a", "pw-a"), ("e", "pw-e")]
        assert await for_host("REG.example.com:5000") == [
            ("a", "pw-a"),
            ("b", "pw-b"),
            ("e", "pw-e"),
        ]
        assert await for_host("reg.example.com:6000") == [("a", "pw-a"), ("e", "pw-e")]
        assert await for_host("nowhere.example") == []
        assert await for_host("reg.example.com", team_b) == [("robot", PW)]
        assert await all_credentials(session, account, box=box, artifact_type=container) == [
            ("reg.example.com", "a", "pw-a"),
            ("reg.example.com:6000", "c", "pw-c"),
            ("other.example.com", "d", "pw-d"),
            ("reg.example.com", "f", "pw-f"),
        ]
        secrets = dict(await account_pull_secrets(session, account, box))
        assert sorted(secrets) == sorted(
            pull_secret_name(host, user)
            for host, user in [
                ("reg.example.com", "a"),
                ("reg.example.com:6000", "c"),
                ("other.example.com", "d"),
                ("reg.example.com", "f"),
            ]
        )
        helm_only = pull_secret_name("reg.example.com:5000", "b")
        assert helm_only not in secrets
        config = secrets[pull_secret_name("reg.example.com", "f")]
        assert config["auths"]["reg.example.com"]["password"] == "pw-f"


async def test_concurrent_duplicates_store_one(client: httpx.AsyncClient) -> None:
    responses = await asyncio.gather(*[client.post(RC, json=BASE) for _ in range(6)])
    assert sorted(r.status_code for r in responses) == [200] + [409] * 5
    for resp in responses:
        assert PW not in resp.text
    assert len(await listed(client)) == 1


async def test_a_key_limited_to_named_functions_cannot_manage_registry_credentials(
    client: AppClient, admin: AppClient, account: str
) -> None:
    """A key limited to functions that carries the scope (stored before keys were kept from
    it) is refused with a 403 saying why: registry credentials serve every function."""
    key = await new_key(admin, ["manage_registry_credentials"], account=account)
    resp = await client.get(RC, headers=bearer(key))
    assert resp.status_code == 200, resp.text
    async with client.app.state.sessionmaker() as session, session.begin():
        row = (
            await session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
        ).scalar_one()
        row.functions = [str(uuid.uuid4())]
    client.app.state.authenticator.forget(hash_key(key))
    for resp in (
        await client.get(RC, headers=bearer(key)),
        await client.post(RC, json=body(), headers=bearer(key)),
    ):
        assert resp.status_code == 403, resp.text
        assert "account-wide" in resp.json()["detail"]
    assert await listed(client) == []

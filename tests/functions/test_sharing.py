"""Function sharing (NVCF's `/authorizations/functions/...` routes, scope `authorize_clients`)
and what a shared function is to each account: the owner (acct-a), an account it is shared with
(acct-b) and a third one (acct-c). On SQLite and PostgreSQL.

The tests share one app per database; each test's three accounts are its own."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.support.api import CONTAINER_FN, assert_problem, bearer, new_key
from tests.support.app import AppClient
from tests.support.go_decode import (
    FUNCTION_DETAILS_WRAPPER,
    LIST_FUNCTION_IDS_RESPONSE,
    LIST_FUNCTIONS_RESPONSE,
    assert_go_decodes,
)

V = "/v2/nvcf"
AZ = f"{V}/authorizations/functions"
ALL_SCOPES = [
    "register_function",
    "list_functions",
    "list_functions_details",
    "update_function",
    "delete_function",
    "deploy_function",
    "authorize_clients",
]
# stands for the test's owning account in the parametrized bodies
OWNER = "<owner>"
SECRET_FN = {
    **CONTAINER_FN,
    "containerEnvironment": [{"key": "TOKEN_URL", "value": "https://internal"}],
    "secrets": [{"name": "api-key", "value": "s3cret"}],
    "rateLimit": {"rateLimit": "10-S"},
}


pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Account:
    name: str
    headers: dict[str, str]


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def unique(name: str) -> str:
    """An account name no other test of the module's app uses."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture(loop_scope="module")
async def accounts(client: httpx.AsyncClient) -> tuple[Account, Account, Account]:
    a, b, c = [Account(n, bearer(await new_key(client, ALL_SCOPES, n))) for n in map(unique, "abc")]
    return a, b, c


async def create(client: httpx.AsyncClient, who: Account, **changes: Any) -> dict[str, Any]:
    resp = await client.post(f"{V}/functions", json={**SECRET_FN, **changes}, headers=who.headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["function"])


async def new_version(client: httpx.AsyncClient, who: Account, fn: dict[str, Any]) -> str:
    resp = await client.post(
        f"{V}/functions/{fn['id']}/versions", json=SECRET_FN, headers=who.headers
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["function"]["versionId"])


async def share(
    client: httpx.AsyncClient, who: Account, path: str, *accounts: str
) -> httpx.Response:
    body = {"authorizedParties": [{"ncaId": a} for a in accounts]}
    return await client.post(f"{AZ}/{path}", json=body, headers=who.headers)


def version_path(fn: dict[str, Any], vid: str | None = None) -> str:
    return f"{fn['id']}/versions/{vid or fn['versionId']}"


async def listed(client: httpx.AsyncClient, who: Account, **params: str) -> list[str]:
    resp = await client.get(f"{V}/functions", params=params, headers=who.headers)
    assert resp.status_code == 200, resp.text
    assert_go_decodes(resp.json(), LIST_FUNCTIONS_RESPONSE)
    return [f["versionId"] for f in resp.json()["functions"]]


async def ids(client: httpx.AsyncClient, who: Account, **params: str) -> list[str]:
    resp = await client.get(f"{V}/functions/ids", params=params, headers=who.headers)
    assert resp.status_code == 200, resp.text
    assert_go_decodes(resp.json(), LIST_FUNCTION_IDS_RESPONSE)
    return list(resp.json()["functionIds"])


# --- the routes -------------------------------------------------------------------------------


async def test_share_a_whole_function_and_read_who_it_is_shared_with(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a, b, c = accounts
    fn = await create(client, a)
    v2 = await new_version(client, a, fn)
    resp = await share(client, a, fn["id"], b.name, c.name)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "function": {
            "id": fn["id"],
            "ncaId": a.name,
            "authorizedParties": [{"ncaId": b.name}, {"ncaId": c.name}],
        }
    }
    # POST replaces the function's accounts
    resp = await share(client, a, fn["id"], b.name)
    assert resp.json()["function"]["authorizedParties"] == [{"ncaId": b.name}]

    got = await client.get(f"{AZ}/{fn['id']}", headers=a.headers)
    assert got.status_code == 200
    assert got.json() == {
        "functions": [
            {
                "id": fn["id"],
                "ncaId": a.name,
                "versionId": v,
                "authorizedParties": [{"ncaId": b.name}],
            }
            for v in (fn["versionId"], v2)
        ]
    }
    one = await client.get(f"{AZ}/{version_path(fn, v2)}", headers=a.headers)
    assert one.json()["function"] == {
        "id": fn["id"],
        "ncaId": a.name,
        "versionId": v2,
        "authorizedParties": [{"ncaId": b.name}],
    }

    # add and remove one account at a time
    added = await client.patch(
        f"{AZ}/{fn['id']}/add", json={"authorizedParty": {"ncaId": c.name}}, headers=a.headers
    )
    assert added.status_code == 200
    assert added.json()["function"]["authorizedParties"] == [{"ncaId": b.name}, {"ncaId": c.name}]
    again = await client.patch(
        f"{AZ}/{fn['id']}/add", json={"authorizedParty": {"ncaId": c.name}}, headers=a.headers
    )
    assert_problem(again, 409)
    removed = await client.patch(
        f"{AZ}/{fn['id']}/remove", json={"authorizedParty": {"ncaId": b.name}}, headers=a.headers
    )
    assert removed.json()["function"]["authorizedParties"] == [{"ncaId": c.name}]
    absent = await client.patch(
        f"{AZ}/{fn['id']}/remove", json={"authorizedParty": {"ncaId": b.name}}, headers=a.headers
    )
    assert_problem(absent, 404)

    cleared = await client.delete(f"{AZ}/{fn['id']}", headers=a.headers)
    assert cleared.status_code == 200
    assert cleared.json() == {"function": {"id": fn["id"], "ncaId": a.name}}
    # nothing to patch any more: NVCF answers 404 until the function is shared again
    for op in ("add", "remove"):
        resp = await client.patch(
            f"{AZ}/{fn['id']}/{op}", json={"authorizedParty": {"ncaId": b.name}}, headers=a.headers
        )
        assert_problem(resp, 404)
    empty = (await client.get(f"{AZ}/{fn['id']}", headers=a.headers)).json()["functions"]
    assert [f["authorizedParties"] for f in empty] == [[], []]


async def test_share_one_version(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a, b, c = accounts
    fn = await create(client, a)
    v2 = await new_version(client, a, fn)
    resp = await share(client, a, version_path(fn), b.name)
    assert resp.json() == {
        "function": {
            "id": fn["id"],
            "ncaId": a.name,
            "versionId": fn["versionId"],
            "authorizedParties": [{"ncaId": b.name}],
        }
    }
    add = await client.patch(
        f"{AZ}/{version_path(fn)}/add",
        json={"authorizedParty": {"ncaId": c.name}},
        headers=a.headers,
    )
    assert add.json()["function"]["authorizedParties"] == [{"ncaId": b.name}, {"ncaId": c.name}]
    # b sees that version only, c too; a later version is not shared
    assert await listed(client, b) == [fn["versionId"]]
    versions = await client.get(f"{V}/functions/{fn['id']}/versions", headers=b.headers)
    assert [f["versionId"] for f in versions.json()["functions"]] == [fn["versionId"]]
    assert_problem(
        await client.get(f"{V}/functions/{version_path(fn, v2)}", headers=b.headers), 404
    )
    # the whole function's accounts and the version's own, merged
    await share(client, a, fn["id"], b.name)
    merged = await client.get(f"{AZ}/{version_path(fn)}", headers=a.headers)
    assert merged.json()["function"]["authorizedParties"] == [{"ncaId": b.name}, {"ncaId": c.name}]
    assert await listed(client, b) == [fn["versionId"], v2]
    assert await listed(client, c) == [fn["versionId"]]
    # clearing the version keeps the function's; clearing the function keeps the version's
    await client.patch(
        f"{AZ}/{version_path(fn)}/remove",
        json={"authorizedParty": {"ncaId": c.name}},
        headers=a.headers,
    )
    cleared = await client.delete(f"{AZ}/{version_path(fn)}", headers=a.headers)
    assert cleared.json() == {
        "function": {"id": fn["id"], "ncaId": a.name, "versionId": fn["versionId"]}
    }
    assert await listed(client, b) == [fn["versionId"], v2]
    assert await listed(client, c) == []


async def test_a_function_level_share_covers_later_versions_and_goes_with_the_function(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a, b, _ = accounts
    fn = await create(client, a)
    await share(client, a, fn["id"], b.name)
    v2 = await new_version(client, a, fn)
    assert await listed(client, b) == [fn["versionId"], v2]
    for vid in (fn["versionId"], v2):
        assert (
            await client.delete(f"{V}/functions/{version_path(fn, vid)}", headers=a.headers)
        ).status_code == 204
    assert await listed(client, b) == [] and await ids(client, b) == []
    # a new function with a new id is not shared
    again = await create(client, a)
    assert await listed(client, b) == [] and again["id"] != fn["id"]


# --- what each account sees and may do --------------------------------------------------------


async def test_the_account_a_function_is_shared_with_reads_it_and_nothing_more(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a, b, c = accounts
    fn = await create(client, a)
    own_b = await create(client, b, name="bees")
    deployed = await client.post(
        f"{V}/deployments/functions/{version_path(fn)}",
        json={"deploymentSpecifications": [{"gpu": "L40", "minInstances": 0, "maxInstances": 1}]},
        headers=a.headers,
    )
    assert deployed.status_code == 200, deployed.text
    dep = deployed.json()["deployment"]
    assert (await share(client, a, fn["id"], b.name)).status_code == 200

    # b lists it as authorized, sees who owns it, and not what runs it
    assert await listed(client, b) == [fn["versionId"], own_b["versionId"]]
    assert await listed(client, b, visibility="authorized") == [fn["versionId"]]
    assert await listed(client, b, visibility="private") == [own_b["versionId"]]
    assert await listed(client, b, visibility="PRIVATE,Authorized") == [
        fn["versionId"],
        own_b["versionId"],
    ]
    assert await listed(client, b, visibility="public") == []
    assert await ids(client, b) == [fn["id"], own_b["id"]]
    assert await ids(client, b, visibility="authorized") == [fn["id"]]
    assert await ids(client, b, visibility="private") == [own_b["id"]]
    one = await client.get(f"{V}/functions/{version_path(fn)}", headers=b.headers)
    assert one.status_code == 200
    assert_go_decodes(one.json(), FUNCTION_DETAILS_WRAPPER)
    seen = one.json()["function"]
    assert seen["ownedByDifferentAccount"] is True and seen["ncaId"] == a.name
    assert seen["name"] == "echo" and seen["status"] == "ACTIVE"
    for hidden in (
        "inferenceUrl",
        "inferencePort",
        "containerImage",
        "containerEnvironment",
        "secrets",
        "rateLimit",
        "activeInstances",
    ):
        assert hidden not in seen, hidden
    assert "s3cret" not in one.text and "https://internal" not in one.text
    versions = await client.get(f"{V}/functions/{fn['id']}/versions", headers=b.headers)
    assert [f["ownedByDifferentAccount"] for f in versions.json()["functions"]] == [True]
    # the owner's own view is unchanged
    mine = (await client.get(f"{V}/functions/{version_path(fn)}", headers=a.headers)).json()
    assert "ownedByDifferentAccount" not in mine["function"]
    assert mine["function"]["secrets"] == ["api-key"]

    # b never changes it: every other route is the 404 of an unknown function
    never = await refused_to(client, b, fn, dep)
    assert never == {}, never
    # c sees nothing of it
    assert await listed(client, c) == [] and await ids(client, c) == []
    assert_problem(await client.get(f"{V}/functions/{version_path(fn)}", headers=c.headers), 404)
    assert_problem(await client.get(f"{V}/functions/{fn['id']}/versions", headers=c.headers), 404)
    never = await refused_to(client, c, fn, dep)
    assert never == {}, never
    # and the other way round: a sees nothing of b's function
    assert own_b["versionId"] not in await listed(client, a)
    assert_problem(await client.get(f"{V}/functions/{version_path(own_b)}", headers=a.headers), 404)
    assert await refused_to(client, a, own_b, None) == {}
    # everything of a's is still there
    assert (
        await client.get(f"{V}/deployments/{dep['deploymentId']}", headers=a.headers)
    ).status_code == 200
    assert (await client.get(f"{AZ}/{fn['id']}", headers=a.headers)).json()["functions"][0][
        "authorizedParties"
    ] == [{"ncaId": b.name}]


async def refused_to(
    client: httpx.AsyncClient, who: Account, fn: dict[str, Any], dep: dict[str, Any] | None
) -> dict[str, int]:
    """Every route that changes a function, its deployment or its sharing, as `who`: the
    statuses that were not 404."""
    version = f"{V}/functions/{version_path(fn)}"
    deployment = f"{V}/deployments/functions/{version_path(fn)}"
    spec = {"gpu": "L40", "minInstances": 0, "maxInstances": 1}
    party = {"authorizedParty": {"ncaId": "c"}}
    parties = {"authorizedParties": [{"ncaId": "c"}]}
    calls: list[tuple[str, str, Any]] = [
        ("POST", f"{V}/functions/{fn['id']}/versions", CONTAINER_FN),
        ("PUT", version, {"description": "mine now"}),
        ("PUT", f"{V}/metadata/functions/{version_path(fn)}", {"tags": ["x"]}),
        ("DELETE", version, None),
        ("POST", deployment, {"deploymentSpecifications": [spec]}),
        ("GET", deployment, None),
        ("PUT", deployment, {"deploymentSpecifications": [spec]}),
        ("DELETE", deployment, None),
    ]
    if dep is not None:
        gpu_spec = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        calls += [
            ("GET", f"{V}/deployments/{dep['deploymentId']}", None),
            ("GET", f"{V}/deployments/{dep['deploymentId']}/events", None),
            (
                "PATCH",
                f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{gpu_spec}",
                {"maxInstances": 1},
            ),
        ]
    for base in (f"{AZ}/{fn['id']}", f"{AZ}/{version_path(fn)}"):
        calls += [
            ("POST", base, parties),
            ("GET", base, None),
            ("PATCH", f"{base}/add", party),
            ("PATCH", f"{base}/remove", party),
            ("DELETE", base, None),
        ]
    out: dict[str, int] = {}
    for method, url, body in calls:
        resp = await client.request(method, url, json=body, headers=who.headers)
        if resp.status_code != 404:
            out[f"{method} {url}"] = resp.status_code
    return out


async def test_a_revoked_share_is_at_once_unreadable(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a, b, _ = accounts
    fn = await create(client, a)
    await share(client, a, fn["id"], b.name)
    url = f"{V}/functions/{version_path(fn)}"
    for _ in range(2):  # the second read may come from the read cache
        assert (await client.get(url, headers=b.headers)).status_code == 200
        assert await listed(client, b) == [fn["versionId"]]
    await client.delete(f"{AZ}/{fn['id']}", headers=a.headers)
    assert_problem(await client.get(url, headers=b.headers), 404)
    assert await listed(client, b) == []


# --- bad requests -----------------------------------------------------------------------------


async def test_sharing_needs_the_authorize_clients_scope(client: httpx.AsyncClient) -> None:
    owner = bearer(await new_key(client, ["register_function", "list_functions"], unique("a")))
    fn = (await client.post(f"{V}/functions", json=CONTAINER_FN, headers=owner)).json()["function"]
    body = {"authorizedParties": [{"ncaId": "b"}]}
    resp = await client.post(f"{AZ}/{fn['id']}", json=body, headers=owner)
    problem = assert_problem(resp, 403)
    assert "authorize_clients" in str(problem["detail"])


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({}, [("authorizedParties", "is required: a non-empty list of {ncaId}")]),
        ({"authorizedParties": []}, [("authorizedParties", "must be a non-empty list of {ncaId}")]),
        (
            {"authorizedParties": [{"ncaId": "b"}, {"ncaId": "b"}, {"clientId": "x"}]},
            [
                ("authorizedParties[2].ncaId", "is required"),
            ],
        ),
        (
            {"authorizedParties": [{"ncaId": "b"}, {"ncaId": "b"}]},
            [("authorizedParties", "lists account(s) b more than once")],
        ),
        (
            {
                "authorizedParties": [
                    {"ncaId": "b", "clientId": "cli"},
                    {"ncaId": "c", "clientId": "cli"},
                ]
            },
            [("authorizedParties", "gives client id(s) cli to more than one account")],
        ),
        (
            {
                "authorizedParties": [
                    {"ncaId": "*"},
                    {"ncaId": " "},
                    {"ncaId": "d", "clientId": " "},
                ]
            },
            [
                (
                    "authorizedParties[0].ncaId",
                    "'*' (every account) cannot be authorized: a function cannot be made public "
                    "here",
                ),
                ("authorizedParties[1].ncaId", "must not be blank"),
                ("authorizedParties[2].clientId", "must not be only whitespace"),
            ],
        ),
        (
            {"authorizedParties": [{"ncaId": OWNER}, {"ncaId": "x" * 129}]},
            [("authorizedParties[1].ncaId", "must be at most 128 characters, got 129")],
        ),
        (
            {"authorizedParties": [{"ncaId": OWNER}]},
            [
                (
                    "authorizedParties[0].ncaId",
                    f"'{OWNER}' owns the function; only other accounts are authorized",
                )
            ],
        ),
        (
            {"authorizedParties": [{"ncaId": f"n{i}"} for i in range(101)]},
            [("authorizedParties", "must have at most 100 items, got 101")],
        ),
        (
            {"authorizedParties": "b"},
            [("authorizedParties", "must be a non-empty list of {ncaId}")],
        ),
    ],
)
async def test_a_bad_share_is_a_400_listing_every_violation(
    client: httpx.AsyncClient,
    accounts: tuple[Account, Account, Account],
    body: dict[str, Any],
    errors: list[tuple[str, str]],
) -> None:
    a = accounts[0]
    fn = await create(client, a)
    # the owner's name is the test's own
    body = json.loads(json.dumps(body).replace(OWNER, a.name))
    errors = [(field, message.replace(OWNER, a.name)) for field, message in errors]
    for path in (fn["id"], version_path(fn)):
        problem = assert_problem(
            await client.post(f"{AZ}/{path}", json=body, headers=a.headers), 400
        )
        assert [(e["field"], e["message"]) for e in problem["errors"]] == errors
    assert (await client.get(f"{AZ}/{fn['id']}", headers=a.headers)).json()["functions"][0][
        "authorizedParties"
    ] == []


async def test_a_bad_patch_is_a_400(
    client: httpx.AsyncClient, accounts: tuple[Account, Account, Account]
) -> None:
    a = accounts[0]
    fn = await create(client, a)
    await share(client, a, fn["id"], "b")
    cases: list[tuple[Any, list[tuple[str, str]]]] = [
        ({}, [("authorizedParty", "is required")]),
        ({"authorizedParty": {}}, [("authorizedParty.ncaId", "is required")]),
        (
            {"authorizedParty": "b"},
            [("authorizedParty", "must be an object with ncaId, got a string")],
        ),
        (
            {"authorizedParty": {"ncaId": "*"}},
            [
                (
                    "authorizedParty.ncaId",
                    "'*' (every account) cannot be authorized: a function cannot be made public "
                    "here",
                )
            ],
        ),
        (
            {"AuthorizedParty": {"NcaId": a.name}},
            [
                (
                    "authorizedParty.ncaId",
                    f"'{a.name}' owns the function; only other accounts are authorized",
                )
            ],
        ),
        ([], [("body", "must be a JSON object, got a list")]),
    ]
    for body, errors in cases:
        for op in ("add", "remove"):
            resp = await client.patch(f"{AZ}/{fn['id']}/{op}", json=body, headers=a.headers)
            problem = assert_problem(resp, 400)
            assert [(e["field"], e["message"]) for e in problem["errors"]] == errors
    bad_id = await client.post(f"{AZ}/not-a-uuid/versions/nope", json={}, headers=a.headers)
    assert [e["field"] for e in assert_problem(bad_id, 400)["errors"]] == [
        "functionId",
        "functionVersionId",
    ]
    unknown = await client.get(f"{AZ}/{uuid.uuid4()}", headers=a.headers)
    assert_problem(unknown, 404)


async def test_an_unknown_visibility_is_a_400(client: httpx.AsyncClient) -> None:
    for path in ("/functions", "/functions/ids"):
        problem = assert_problem(
            await client.get(f"{V}{path}", params={"visibility": "secret"}), 400
        )
        assert problem["errors"] == [
            {
                "field": "visibility",
                "message": "must be one or more of private, authorized, public (comma-separated), "
                "got 'secret'",
            }
        ]

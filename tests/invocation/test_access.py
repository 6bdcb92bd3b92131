"""Invoking a shared function (NVCF's authorized parties): the account a function or a version
is shared with (acct-b) invokes it through every entry, polls its own requests and reads the
queues, under the owner's rate limit for it; a third account (acct-c) gets the 404 of an
unknown function, and so does acct-b once the share is revoked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import AppClient, ClientFactory, SettingsFactory
from tests.support.e2e import V, eventually
from tests.support.invocation import (
    FAST,
    deployed,
    invocation_app,
    pexec_url,
    write_catalog,
)
from tests.support.upstream import UpstreamServer

SUFFIX = "invocation.localhost"
AZ = f"{V}/authorizations/functions"
SCOPES = ["invoke_function", "queue_details", "list_functions"]


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    # a long route cache: a revoked share is refused at once only if this replica forgets it
    return await invocation_app(
        client_factory, tmp_path, invoke_host_suffix=SUFFIX, invoke_route_cache_seconds=60
    )


async def share(client: AppClient, path: str, *accounts: str) -> None:
    body = {"authorizedParties": [{"ncaId": a} for a in accounts]}
    resp = await client.post(f"{AZ}/{path}", json=body)
    assert resp.status_code == 200, resp.text


async def entries(client: AppClient, fn: dict[str, Any], who: dict[str, str]) -> dict[str, Any]:
    """One request through each invocation entry, as `who`, keyed by the entry."""
    fid, vid = fn["id"], fn["versionId"]
    account = who["X-Account"]
    auth = {"Authorization": who["Authorization"]}
    return {
        "pexec": await client.post(pexec_url(fn), json={"n": 1}, headers=auth),
        "pexec-function": await client.post(pexec_url(fn, version=False), json=2, headers=auth),
        "exec": await client.post(
            f"{V}/exec/functions/{fid}/versions/{vid}", json={"requestBody": 3}, headers=auth
        ),
        "header": await client.post(
            "/echo", json=4, headers={**auth, "function-id": fid, "function-version-id": vid}
        ),
        "host": await client.post("/echo", json=5, headers={**auth, "Host": f"{fid}.{SUFFIX}"}),
        "org": await client.post(
            f"/v2/orgs/{account}/nvcf/pexec/functions/{fid}", json=6, headers=auth
        ),
    }


async def caller(client: AppClient, account: str) -> dict[str, str]:
    return {**bearer(await new_key(client, SCOPES, account)), "X-Account": account}


def worker_saw(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    return dict(body.get("response", body))


async def test_a_shared_account_invokes_through_every_entry_and_others_get_404(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    b, c = await caller(client, "acct-b"), await caller(client, "acct-c")
    # Before it is shared, acct-b gets what acct-c gets: the 404 of an unknown function.
    for name, resp in (await entries(client, fn, b)).items():
        assert resp.status_code == 404, (name, resp.text)
        assert_problem(resp, 404)
    await share(client, fn["id"], "acct-b")
    for name, resp in (await entries(client, fn, b)).items():
        assert resp.status_code == 200, (name, resp.text)
        sent = worker_saw(resp)["headers"]
        # the worker is told who invoked: the caller's account, not the owner's
        assert sent["NVCF-NCAID"] == "acct-b", name
        assert sent["NVCF-FUNCTION-ID"] == fn["id"], name
    for name, resp in (await entries(client, fn, c)).items():
        problem = assert_problem(resp, 404)
        assert "not found" in str(problem["detail"]), name
    # the owner's own invocations still name the owner
    resp = await client.post(pexec_url(fn), json={})
    assert resp.json()["headers"]["NVCF-NCAID"] == fn["ncaId"]


async def test_a_shared_account_polls_its_own_requests_and_reads_the_queues(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    b, c = await caller(client, "acct-b"), await caller(client, "acct-c")
    await share(client, fn["id"], "acct-b")
    slow = {"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "2000"}
    resp = await client.post(
        pexec_url(fn), json={"who": "b"}, headers={"Authorization": b["Authorization"], **slow}
    )
    assert resp.status_code == 202, resp.text
    mine = resp.headers["nvcf-reqid"]
    resp = await client.post(pexec_url(fn), json={"who": "owner"}, headers=slow)
    assert resp.status_code == 202, resp.text
    owners = resp.headers["nvcf-reqid"]
    auth_b = {"Authorization": b["Authorization"]}
    status = await client.get(f"{V}/pexec/status/{mine}", headers=auth_b)
    assert status.status_code == 200, status.text
    assert status.json()["echo"] == {"who": "b"}
    wrapped = await client.get(f"{V}/exec/status/{mine}", headers=auth_b)
    assert wrapped.status_code == 200 and wrapped.json()["response"]["echo"] == {"who": "b"}
    # another account's request stays unknown, both ways
    assert_problem(await client.get(f"{V}/pexec/status/{owners}", headers=auth_b), 404)
    assert_problem(await client.get(f"{V}/exec/status/{owners}", headers=auth_b), 404)
    assert_problem(await client.get(f"{V}/pexec/status/{mine}"), 404)
    c_auth = {"Authorization": c["Authorization"]}
    assert_problem(await client.get(f"{V}/pexec/status/{mine}", headers=c_auth), 404)
    # the queue routes
    resp = await client.get(f"{V}/queues/functions/{fn['id']}", headers=auth_b)
    assert resp.status_code == 200, resp.text
    assert [q["functionVersionId"] for q in resp.json()["queues"]] == [fn["versionId"]]
    resp = await client.get(
        f"{V}/queues/functions/{fn['id']}/versions/{fn['versionId']}", headers=auth_b
    )
    assert resp.status_code == 200, resp.text
    assert_problem(await client.get(f"{V}/queues/functions/{fn['id']}", headers=c_auth), 404)


async def test_the_owners_per_account_rate_applies_to_the_shared_account(
    client: AppClient,
) -> None:
    fn = await deployed(client, rateLimit={"rateLimit": "100-M", "perNcaIdRate": {"acct-b": "1-M"}})
    b = await caller(client, "acct-b")
    await share(client, fn["id"], "acct-b")
    auth_b = {"Authorization": b["Authorization"]}
    assert (await client.post(pexec_url(fn), json={}, headers=auth_b)).status_code == 200
    refused = await client.post(pexec_url(fn), json={}, headers=auth_b)
    problem = assert_problem(refused, 429)
    assert "1-M" in str(problem["detail"]) and "acct-b" in str(problem["detail"])
    assert int(refused.headers["retry-after"]) >= 1
    # through the other entries as well: one counter per account and version
    resp = await client.post("/echo", json={}, headers={**auth_b, "function-id": fn["id"]})
    assert_problem(resp, 429)
    # the owner is counted against the global rate, apart
    for _ in range(3):
        assert (await client.post(pexec_url(fn), json={})).status_code == 200


async def test_revoking_a_share_refuses_new_invocations_at_once(client: AppClient) -> None:
    fn = await deployed(client)
    b = await caller(client, "acct-b")
    auth_b = {"Authorization": b["Authorization"]}
    await share(client, fn["id"], "acct-b", "acct-c")
    # cached now for this caller (the route cache lasts a minute here)
    assert (await client.post(pexec_url(fn), json={}, headers=auth_b)).status_code == 200
    body = {"authorizedParty": {"ncaId": "acct-b"}}
    resp = await client.patch(f"{AZ}/{fn['id']}/remove", json=body)
    assert resp.status_code == 200, resp.text
    for name, resp in (await entries(client, fn, b)).items():
        assert resp.status_code == 404, (name, resp.text)
        assert_problem(resp, 404)
    # a version shared on its own is invocable (with or without its id) until cleared
    await share(client, f"{fn['id']}/versions/{fn['versionId']}", "acct-b")
    assert (await client.post(pexec_url(fn), json={}, headers=auth_b)).status_code == 200
    resp = await client.post(pexec_url(fn, version=False), json={}, headers=auth_b)
    assert resp.status_code == 200, resp.text
    resp = await client.delete(f"{AZ}/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 200, resp.text
    assert_problem(await client.post(pexec_url(fn), json={}, headers=auth_b), 404)
    assert_problem(await client.post(pexec_url(fn, version=False), json={}, headers=auth_b), 404)
    # replacing the function's accounts takes it from those left out
    await share(client, fn["id"], "acct-b")
    assert (await client.post(pexec_url(fn), json={}, headers=auth_b)).status_code == 200
    await share(client, fn["id"], "acct-c")
    assert_problem(await client.post(pexec_url(fn), json={}, headers=auth_b), 404)


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


async def test_another_replica_refuses_a_revoked_share_once_its_route_cache_expires(
    client_factory: ClientFactory,
    make_settings: SettingsFactory,
    tmp_path: Path,
    upstream: UpstreamServer,
) -> None:
    first = await invocation_app(client_factory, tmp_path, upstream=upstream.url)
    fn = await deployed(first)
    await share(first, fn["id"], "acct-b")
    auth_b = bearer(await new_key(first, SCOPES, "acct-b"))
    second = await client_factory(
        make_settings(
            data_dir=tmp_path / "replica-2",
            clusters_file=write_catalog(tmp_path, upstream=upstream.url),
            reconciler_enabled=False,
            invoke_route_cache_seconds=0.5,
            **FAST,
        )
    )
    resp = await second.post(pexec_url(fn), json={"on": 2}, headers=auth_b)
    assert resp.status_code == 200, resp.text
    assert resp.json()["headers"]["NVCF-NCAID"] == "acct-b"
    resp = await first.delete(f"{AZ}/{fn['id']}")
    assert resp.status_code == 200, resp.text

    async def refused() -> bool:
        resp = await second.post(pexec_url(fn), json={}, headers=auth_b)
        return resp.status_code == 404

    await eventually(refused)
    # the owner invokes on either replica as before
    assert (await second.post(pexec_url(fn), json={})).status_code == 200

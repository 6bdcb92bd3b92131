"""Invocation end to end over HTTP on the embedded default (simulated clusters, in-process
workers): pexec, its status poll, the exec form, refusals and access.

The tests on `client` share one app per database (a catalog with room for all their
deployments); each invokes only the function it deployed itself."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from tests.support.api import assert_problem, bearer, create_fn, new_key
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
from tests.support.wire import get, raw_exchange, running_server

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    catalog = write_catalog(tmp_path_factory.mktemp("catalog"), gpus=64)
    return {"clusters_file": catalog, **FAST}


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


async def test_pexec_answers_with_the_workers_echo_and_both_headers(client: AppClient) -> None:
    fn = await deployed(client)
    [instance] = fn["deployment"]["instances"]
    resp = await client.post(
        pexec_url(fn), json={"prompt": "hi"}, headers={"NVCF-POLL-SECONDS": "30"}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["nvcf-status"] == "fulfilled"
    request_id = resp.headers["nvcf-reqid"]
    uuid.UUID(request_id)
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body["echo"] == {"prompt": "hi"}
    assert body["path"] == "/echo"
    assert body["instanceId"] == instance["instanceId"]
    sent = body["headers"]
    assert sent["NVCF-REQID"] == request_id
    assert sent["NVCF-FUNCTION-ID"] == fn["id"]
    assert sent["NVCF-FUNCTION-VERSION-ID"] == fn["versionId"]
    assert sent["NVCF-NCAID"] == fn["ncaId"]
    assert sent["NVCF-FUNCTION-NAME"] == fn["name"]
    assert sent["NVCF-BACKEND"] == "inv"
    assert sent["NVCF-INSTANCETYPE"] == "NCP.GPU.H100_1x"
    assert "NVCF-POLL-SECONDS" not in sent and "authorization" not in {k.lower() for k in sent}
    # Without a version id, the function's invocable version answers.
    resp = await client.post(pexec_url(fn, version=False), content=b"plain")
    assert resp.status_code == 200 and resp.json()["echo"] == "plain"


async def test_worker_status_and_headers_come_back(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.post(pexec_url(fn), json={}, headers={"X-Sim-Status": "503"})
    assert resp.status_code == 503
    assert resp.headers["nvcf-status"] == "errored"
    assert resp.json()["echo"] == {}
    resp = await client.post(pexec_url(fn), json={}, headers={"X-Sim-Status": "201"})
    assert (resp.status_code, resp.headers["nvcf-status"]) == (201, "fulfilled")


async def test_slow_worker_answers_202_then_the_status_poll_answers(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.post(
        pexec_url(fn),
        json={"slow": True},
        headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "3000"},
    )
    assert resp.status_code == 202, resp.text
    assert resp.headers["nvcf-status"] == "pending-evaluation"
    request_id = resp.headers["nvcf-reqid"]
    assert resp.json() == {"reqId": request_id, "status": "pending-evaluation"}
    status = await client.get(f"{V}/pexec/status/{request_id}")
    assert status.status_code == 200, status.text
    assert status.headers["nvcf-reqid"] == request_id
    assert status.headers["nvcf-status"] == "fulfilled"
    assert status.json()["echo"] == {"slow": True}
    # A result is kept for polling (until it expires).
    again = await client.get(f"{V}/pexec/status/{request_id}")
    assert again.status_code == 200 and again.json() == status.json()


async def test_a_pending_request_polled_briefly_is_still_202(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.post(
        pexec_url(fn), json={}, headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "5000"}
    )
    assert resp.status_code == 202
    request_id = resp.headers["nvcf-reqid"]
    status = await client.get(f"{V}/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "1"})
    assert status.status_code == 202
    assert status.headers["nvcf-status"] == "in-progress"


async def test_exec_form_wraps_request_and_answer(client: AppClient) -> None:
    fn = await deployed(client)
    url = f"{V}/exec/functions/{fn['id']}/versions/{fn['versionId']}"
    resp = await client.post(url, json={"requestBody": {"q": [1, 2]}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "fulfilled" and body["percentComplete"] == 100
    assert body["reqId"] == resp.headers["nvcf-reqid"]
    assert body["response"]["echo"] == {"q": [1, 2]}
    assert body["response"]["path"] == "/echo"
    # Slow: the wrapped 202, then the wrapped status.
    resp = await client.post(
        f"{V}/exec/functions/{fn['id']}",
        json={"requestHeader": {"pollDurationSeconds": 1}, "requestBody": "later"},
        headers={"X-Sim-Delay-Ms": "3000"},
    )
    assert resp.status_code == 202, resp.text
    pending = resp.json()
    assert pending["status"] == "pending-evaluation"
    status = await client.get(f"{V}/exec/status/{pending['reqId']}")
    assert status.status_code == 200, status.text
    assert status.json()["status"] == "fulfilled"
    assert status.json()["response"]["echo"] == "later"
    # The worker's error status is the wrapped answer's.
    resp = await client.post(url, json={"requestBody": {}}, headers={"X-Sim-Status": "418"})
    assert resp.status_code == 418
    assert (resp.json()["status"], resp.json()["errorCode"]) == ("errored", 418)


async def test_exec_body_problems_are_400(client: AppClient) -> None:
    fn = await deployed(client)
    url = f"{V}/exec/functions/{fn['id']}"
    for body in ({}, {"requestBody": 1, "requestHeader": {"pollDurationSeconds": 4000}}):
        resp = await client.post(url, json=body)
        problem = assert_problem(resp, 400)
        assert resp.headers["nvcf-status"] == "errored"
        assert problem["errors"]


async def test_poll_seconds_are_checked(client: AppClient) -> None:
    fn = await deployed(client)
    # also what str.isdigit() or int() accept: ², a sign, an underscore, 4,301 digits
    for value in (b"3601", b"soon", b"-1", b"\xb2", b"+5", b"1_0", b"9" * 4301):
        resp = await client.post(pexec_url(fn), json={}, headers={b"NVCF-POLL-SECONDS": value})
        problem = assert_problem(resp, 400)
        assert "NVCF-POLL-SECONDS" in str(problem["detail"])
        assert resp.headers["nvcf-status"] == "errored"
        uuid.UUID(resp.headers["nvcf-reqid"])


@own_app
async def test_deploying_version_is_refused_naming_its_status(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    # the reconciler is stopped: the version stays DEPLOYING
    client = await invocation_app(client_factory, tmp_path)
    fn = await create_fn(client)
    problem = assert_problem(await client.post(pexec_url(fn), json={}), 400)
    assert "INACTIVE" in str(problem["detail"])
    await client.app.state.reconciler.stop()
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [spec()]})
    assert resp.status_code == 200
    resp = await client.post(pexec_url(fn), json={})
    problem = assert_problem(resp, 400)
    assert "DEPLOYING" in str(problem["detail"])
    assert resp.headers["nvcf-status"] == "errored"
    problem = assert_problem(await client.post(pexec_url(fn, version=False), json={}), 400)
    assert "DEPLOYING" in str(problem["detail"])


async def test_unknown_and_other_accounts_functions_are_404(client: AppClient) -> None:
    fn = await deployed(client)
    other = await new_key(client, ["invoke_function", "queue_details"], account="other-account")
    resp = await client.post(pexec_url(fn), json={}, headers=bearer(other))
    assert_problem(resp, 404)
    assert resp.headers["nvcf-status"] == "errored"
    assert_problem(await client.post(f"{V}/pexec/functions/{uuid.uuid4()}", json={}), 404)
    # A request id of another account is unknown too.
    resp = await client.post(
        pexec_url(fn), json={}, headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "2000"}
    )
    assert resp.status_code == 202
    request_id = resp.headers["nvcf-reqid"]
    assert_problem(await client.get(f"{V}/pexec/status/{request_id}", headers=bearer(other)), 404)
    assert_problem(await client.get(f"{V}/pexec/status/{uuid.uuid4()}"), 404)
    assert_problem(await client.get(f"{V}/pexec/status/not-a-uuid"), 400)


async def test_invoking_needs_the_invoke_scope(client: AppClient) -> None:
    fn = await deployed(client)
    key = await new_key(client, ["list_functions"])
    resp = await client.post(pexec_url(fn), json={}, headers=bearer(key))
    problem = assert_problem(resp, 403)
    assert "invoke_function" in str(problem["detail"])
    assert resp.headers["nvcf-status"] == "errored"
    resp = await client.post(pexec_url(fn), json={}, headers={"Authorization": "Bearer nvapi-x"})
    assert_problem(resp, 401)


async def test_org_prefixed_routes_invoke_too(client: AppClient) -> None:
    fn = await deployed(client)
    url = f"/v2/orgs/{fn['ncaId']}/nvcf/pexec/functions/{fn['id']}"
    resp = await client.post(url, json={"a": 1})
    assert resp.status_code == 200 and resp.json()["echo"] == {"a": 1}
    assert_problem(await client.post(f"/v2/orgs/elsewhere/nvcf/pexec/functions/{fn['id']}"), 403)


async def test_an_encoded_slash_in_the_org_is_no_alias(client: AppClient) -> None:
    # `B%2Fnvcf` is one segment (org "B/nvcf") followed by `pexec`: no org alias, so no route
    # (the invocation entry reads the alias as the org check does), never the caller's own.
    fn = await deployed(client)
    for org in ("elsewhere", fn["ncaId"]):
        resp = await client.post(f"/v2/orgs/{org}%2Fnvcf/pexec/functions/{fn['id']}", json={})
        assert_problem(resp, 404)
        assert "nvcf-status" not in resp.headers


async def test_a_method_a_route_does_not_serve_is_a_405_naming_the_one_it_does(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    for method, url, allowed in (
        ("GET", pexec_url(fn), "POST"),
        ("PUT", f"{V}/exec/functions/{fn['id']}", "POST"),
        ("POST", f"{V}/pexec/status/{uuid.uuid4()}", "GET"),
        ("DELETE", f"{V}/queues/{uuid.uuid4()}/position", "GET"),
    ):
        resp = await client.request(method, url)
        problem = assert_problem(resp, 405)
        assert resp.headers["allow"] == allowed
        assert method in str(problem["detail"])


async def test_a_trailing_slash_names_the_same_route(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.post(pexec_url(fn) + "/", json={"a": 1})
    assert resp.status_code == 200 and resp.json()["echo"] == {"a": 1}
    resp = await client.post(f"{V}/exec/functions/{fn['id']}//", json={"requestBody": 2})
    assert resp.status_code == 200 and resp.json()["response"]["echo"] == 2
    # an empty id is no id: no route
    assert_problem(await client.post(f"{V}/pexec/functions//"), 404)


async def test_event_stream_comes_through(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.post(
        pexec_url(fn),
        json={"stream": True},
        headers={"Accept": "text/event-stream", "X-Sim-Events": "3"},
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    events = [json.loads(line[6:]) for line in resp.text.split("\n\n") if line]
    assert [e["index"] for e in events] == [0, 1, 2]
    assert events[0]["echo"] == {"stream": True}


@own_app
async def test_large_bodies_are_bounded(client_factory: ClientFactory, tmp_path: Path) -> None:
    client = await invocation_app(client_factory, tmp_path, invoke_max_body_bytes=2048)
    fn = await deployed(client)
    resp = await client.post(pexec_url(fn), content=b"x" * 4096)
    assert_problem(resp, 413)


@own_app
async def test_invocation_bodies_may_exceed_the_api_limit(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    big = await invocation_app(
        client_factory, tmp_path, max_body_bytes=1024, invoke_max_body_bytes=8192
    )
    assert_problem(await big.post(f"{V}/functions", content=b"{" + b" " * 2048 + b"}"), 413)
    fn = await deployed(big)
    resp = await big.post(pexec_url(fn), content=b"y" * 4096)
    assert resp.status_code == 200 and resp.json()["echo"] == "y" * 4096


async def test_undeployed_version_becomes_refused(client: AppClient) -> None:
    fn = await deployed(client)
    assert (await client.post(pexec_url(fn), json={})).status_code == 200
    assert (await client.delete(dep_url(fn))).status_code == 200
    await until_status(client, fn, "INACTIVE")
    await asyncio.sleep(0)
    client.app.state.invocation.routes.forget(uuid.UUID(fn["versionId"]))
    assert_problem(await client.post(pexec_url(fn), json={}), 400)


@pytest.mark.parametrize("route", ["pexec", "exec"])
async def test_a_status_poll_of_an_id_with_control_bytes_is_a_valid_400(
    tmp_path: Path, route: str
) -> None:
    """Unauthenticated, on the wire: the id is no id, and it never breaks `NVCF-REQID` (the
    server wrote no answer at all, and closed the connection)."""
    ids = ["%0a", "%00", "%0D%0ASet-Cookie:%20x", "%7F", "%C2%85", "%E2%80%A8"]
    requests = [get(f"/v2/nvcf/{route}/status/{rid}") for rid in ids]

    def exchange() -> list[tuple[int, dict[str, str], bytes]]:
        with running_server(tmp_path) as port:
            return raw_exchange(port, *requests, get("/health"))

    *answers, health = await asyncio.to_thread(exchange)
    for rid, (status, headers, body) in zip(ids, answers, strict=True):
        assert status == 400, (rid, body)
        assert headers["content-type"] == "application/problem+json"
        assert headers["nvcf-reqid"] == quote(unquote(rid), safe="")  # percent-encoded
        assert "set-cookie" not in headers
        assert headers["nvcf-status"] == "errored"
        assert "requestId" in json.loads(body)["detail"]
    assert health[0] == 200  # and the connection still serves the next request


async def test_d24_exec_bodies_the_one_parser_refuses_are_400(client: AppClient) -> None:
    fn = await deployed(client)
    url = f"{V}/exec/functions/{fn['id']}"
    headers = {"content-type": "application/json"}
    deep = b'{"requestBody": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    for raw, field in (
        (deep, "body"),
        (b'{"requestBody": {"x": NaN}}', "body"),
        (b'{"requestBody": "\\udc00"}', "requestBody"),
        (b'{"requestBody": 1, "requestHeader": {"p": -Infinity}}', "body"),
    ):
        resp = await client.post(url, content=raw, headers=headers)
        problem = assert_problem(resp, 400)
        assert resp.headers["nvcf-status"] == "errored"
        assert [e["field"] for e in problem["errors"]] == [field], problem

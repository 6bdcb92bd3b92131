"""Transparent mode: a request addressed to a function by its Host (as nvcf-cli sends it) or
by routing headers goes, path and query unchanged, to the function's worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from service.invocation.transparent import addressed
from tests.support.api import assert_problem
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V
from tests.support.invocation import deployed, invocation_app

F = "5f0c9a4e-4d1b-4c55-9f57-2a1e3c2b7a10"
W = "0a4b1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
SUFFIX = "invocation.localhost"


def h(**headers: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]


def test_addressing_by_host_and_headers() -> None:
    assert addressed(h(host=f"{F}.invocation.localhost:8080"), None) == (F, None, False)
    assert addressed(h(host=f"{F}.{W}.invocation.example.com"), None) == (F, W, True)
    assert addressed(h(host=f"{F.upper()}.x"), None) == (F, None, False)
    assert addressed(h(host=f"{F}.invocation.localhost"), "invocation.localhost") == (
        F,
        None,
        False,
    )
    # Not transparent: no UUID first, nothing after it, another suffix, an IPv6 literal.
    for host in ("api.example.com", F, f"{F}.other.host", "[::1]:8080", "127.0.0.1:8080"):
        assert addressed(h(host=host), "invocation.localhost") is None
    assert addressed(h(host="localhost", function_id=F, function_version_id=W), None) == (
        F,
        W,
        False,
    )
    assert addressed(h(host="localhost", function_id="nope"), None) is None


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(client_factory, tmp_path, invoke_host_suffix="invocation.localhost")


async def test_host_addressed_request_reaches_the_worker_at_its_own_path(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    resp = await client.post(
        "/echo?n=1",
        json={"via": "host"},
        headers={"Host": f"{fn['id']}.invocation.localhost", "NVCF-POLL-SECONDS": "5"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["nvcf-status"] == "fulfilled"
    body = resp.json()
    assert body["echo"] == {"via": "host"}
    assert body["path"] == "/echo?n=1"
    assert body["headers"]["NVCF-REQID"] == resp.headers["nvcf-reqid"]
    # Any method and path go to the worker as they are.
    resp = await client.get("/v1/models", headers={"Host": f"{fn['id']}.invocation.localhost:8080"})
    assert resp.status_code == 200 and resp.json()["path"] == "/v1/models"
    # So does an API path: the Host decides, not the path.
    resp = await client.get(f"{V}/functions", headers={"Host": f"{fn['id']}.invocation.localhost"})
    assert resp.json()["path"] == f"{V}/functions"
    # A host with another suffix is an ordinary API request.
    resp = await client.get(f"{V}/functions", headers={"Host": f"{fn['id']}.elsewhere"})
    assert resp.status_code == 200 and "functions" in resp.json()


async def test_both_orders_of_function_and_version_in_the_host(client: AppClient) -> None:
    fn = await deployed(client)
    for host in (f"{fn['id']}.{fn['versionId']}", f"{fn['versionId']}.{fn['id']}"):
        resp = await client.post("/echo", json={}, headers={"Host": f"{host}.invocation.localhost"})
        assert resp.status_code == 200, (host, resp.text)
        assert resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == fn["versionId"]


async def test_routing_headers_address_the_function(client: AppClient) -> None:
    fn = await deployed(client)
    resp = await client.put(
        "/generate",
        content=b"raw",
        headers={"function-id": fn["id"], "function-version-id": fn["versionId"]},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == "raw" and resp.json()["path"] == "/generate"


async def test_a_repeated_addressing_header_is_refused_whatever_its_values(
    client: AppClient,
) -> None:
    fn = await deployed(client)
    host = f"{fn['id']}.invocation.localhost"
    cases = [
        ("host", [("Host", host), ("Host", "localhost")]),
        ("host", [("Host", "localhost"), ("Host", host)]),
        ("host", [("Host", "llm.invocation.localhost"), ("Host", "llm.invocation.localhost")]),
        ("function-id", [("function-id", fn["id"]), ("function-id", str(uuid.uuid4()))]),
        ("function-id", [("function-id", fn["id"]), ("Function-ID", fn["id"])]),
        (
            "function-version-id",
            [("function-id", fn["id"])] + [("function-version-id", fn["versionId"])] * 2,
        ),
    ]
    for name, headers in cases:
        resp = await client.post("/echo", json={}, headers=headers)
        problem = assert_problem(resp, 400)
        assert problem["errors"] == [{"field": name, "message": "given more than once"}], problem
    # An API route too: nothing is routed on a repeated Host.
    resp = await client.get(f"{V}/functions", headers=[("Host", "a"), ("Host", "b")])
    assert_problem(resp, 400)


async def test_transparent_refusals_are_problems_with_the_invocation_headers(
    client: AppClient,
) -> None:
    resp = await client.post("/echo", json={}, headers={"function-id": str(uuid.uuid4())})
    assert_problem(resp, 404)
    assert resp.headers["nvcf-status"] == "errored"
    resp = await client.post(
        "/echo",
        json={},
        headers={"function-id": str(uuid.uuid4()), "Authorization": "Bearer nvapi-wrong"},
    )
    assert_problem(resp, 401)


class _StackSpy:
    """Stands for the framework's middleware stack and records the paths that reach it."""

    def __init__(self, stack: ASGIApp) -> None:
        self.stack = stack
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await self.stack(scope, receive, send)


async def test_the_entry_answers_every_invocation_ahead_of_the_middleware_stack(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(
        client_factory, tmp_path, invoke_host_suffix="invocation.localhost"
    )
    fn = await deployed(client)
    assert client.app.middleware_stack is not None  # built by the requests of `deployed`
    spy = _StackSpy(client.app.middleware_stack)
    client.app.middleware_stack = spy
    pexec = f"{V}/pexec/functions/{fn['id']}/versions/{fn['versionId']}"
    answers = [
        await client.post(pexec, json={"n": 1}),
        await client.post("/echo", json={"n": 2}, headers={"function-id": fn["id"]}),
        await client.post("/echo", json={"n": 3}, headers={"Host": f"{fn['id']}.{SUFFIX}"}),
    ]
    for n, resp in enumerate(answers, 1):
        assert resp.status_code == 200, resp.text
        assert resp.json()["echo"] == {"n": n}
        assert resp.headers["nvcf-status"] == "fulfilled"
        assert resp.headers["x-request-id"] and resp.headers["nvcf-reqid"]
    # refusals are the same problems either way
    resp = await client.post(pexec, json={}, headers={"Authorization": "Bearer nvapi-wrong"})
    assert_problem(resp, 401)
    assert resp.headers["nvcf-status"] == "errored" and resp.headers["x-request-id"]
    resp = await client.post(f"{V}/pexec/functions/not-a-uuid", json={})
    assert_problem(resp, 400)
    # an org alias is the entry's too; other routes take the ordinary way
    alias = f"/v2/orgs/someone-else/nvcf/pexec/functions/{fn['id']}"
    assert_problem(await client.post(alias, json={}), 403)
    assert (await client.get(f"{V}/functions")).status_code == 200
    assert spy.paths == [f"{V}/functions"]
    # metrics name the route the same way, whichever way the request went
    metrics = (await client.get("/metrics")).text
    route = "/v2/nvcf/pexec/functions/{functionId}/versions/{functionVersionId}"
    assert f'method="POST",route="{route}",status="200"' in metrics
    assert 'route="<transparent invocation>",status="200"' in metrics


async def test_the_claim_sets_the_body_limit_of_transparent_and_aliased_invocations(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(
        client_factory,
        tmp_path,
        invoke_host_suffix=SUFFIX,
        max_body_bytes=1024,
        invoke_max_body_bytes=8192,
    )
    fn = await deployed(client)
    host = {"Host": f"{fn['id']}.{SUFFIX}"}
    resp = await client.post("/echo", content=b"y" * 4096, headers=host)
    assert resp.status_code == 200 and resp.json()["echo"] == "y" * 4096
    assert_problem(await client.post("/echo", content=b"y" * 16384, headers=host), 413)
    alias = f"/v2/orgs/{fn['ncaId']}/nvcf/pexec/functions/{fn['id']}"
    resp = await client.post(alias, content=b"z" * 4096)
    assert resp.status_code == 200 and resp.json()["echo"] == "z" * 4096
    # an API route keeps the API's limit
    assert_problem(await client.post(f"{V}/functions", content=b"{" + b" " * 2048 + b"}"), 413)

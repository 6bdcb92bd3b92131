"""Cross-cutting HTTP behaviour: problem+json errors, request ids, limits, probes, metrics."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.api import CONTAINER_FN, assert_problem
from tests.support.app import AppClient, ClientFactory

# One app per database for the module's tests on `client` (none of them changes what another
# reads); the tests reading the app's counters or swapping its engine build their own.
pytestmark = pytest.mark.asyncio(loop_scope="module")
own_app = pytest.mark.asyncio(loop_scope="function")

V = "/v2/nvcf"


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


async def test_unknown_route_is_problem_404(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get("/v2/nvcf/nothing-here"), 404)
    assert body["detail"] == "no route matches GET /v2/nvcf/nothing-here"


async def test_wrong_method_is_problem_405(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.patch(f"{V}/functions", json={}), 405)
    assert "PATCH" in str(body["detail"])


async def test_non_json_body_is_415(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        f"{V}/functions",
        content=b"name=x",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    body = assert_problem(resp, 415)
    assert "application/json" in str(body["detail"])
    resp = await client.post(f"{V}/functions", content=b"{}")
    assert_problem(resp, 415)


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        f"{V}/functions", content=b'{"name": ', headers={"content-type": "application/json"}
    )
    body = assert_problem(resp, 400)
    assert body["errors"][0]["field"] == "body"


async def test_body_over_1_mib_is_413(client: httpx.AsyncClient) -> None:
    big = {**CONTAINER_FN, "description": "x" * (1024 * 1024)}
    body = assert_problem(await client.post(f"{V}/functions", json=big), 413)
    assert "1048576" in str(body["detail"])
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_chunked_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * 65536

    resp = await client.post(
        f"{V}/functions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(resp, 413)


async def test_every_response_has_a_request_id(client: httpx.AsyncClient) -> None:
    ok = await client.get(f"{V}/functions")
    uuid.UUID(ok.headers["x-request-id"])
    given = str(uuid.uuid4())
    echoed = await client.get("/health", headers={"X-Request-Id": given})
    assert echoed.headers["x-request-id"] == given
    garbage = await client.get("/health", headers={"X-Request-Id": "<script>"})
    assert garbage.headers["x-request-id"] != "<script>"


async def test_probes_need_no_auth(client: httpx.AsyncClient) -> None:
    anon = {"Authorization": ""}
    assert (await client.get("/health", headers=anon)).json() == {"status": "ok"}
    assert (await client.get("/health/ready", headers=anon)).json() == {"status": "ready"}
    assert (await client.get("/openapi.json", headers=anon)).status_code == 200
    docs = await client.get("/docs", headers=anon)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


@own_app
async def test_ready_reports_an_unreachable_database(client_factory: ClientFactory) -> None:
    client = await client_factory()
    app = client.app
    from service.core.db import make_engine

    # The probe is pointed at a database nobody listens on; the app's own engine stays as it
    # is (its background loops hold connections of it) and is disposed at shutdown as usual.
    good, bad = app.state.engine, make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    app.state.engine = bad
    try:
        resp = await client.get("/health/ready")
    finally:
        app.state.engine = good
        await bad.dispose()
    assert_problem(resp, 503)


@own_app
async def test_metrics_count_requests_by_route_template(client_factory: ClientFactory) -> None:
    client = await client_factory()
    await client.get(f"{V}/functions")
    await client.get(f"{V}/functions/{uuid.uuid4()}/versions")
    text = (await client.get("/metrics")).text
    assert (
        'nvcf_http_requests_total{method="GET",route="/v2/nvcf/functions",status="200"} 1.0' in text
    )
    assert 'route="/v2/nvcf/functions/{functionId}/versions",status="404"' in text
    assert "nvcf_http_request_duration_seconds_bucket" in text


async def test_one_log_line_per_request_without_secrets(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    secret = "do-not-log-this-secret-value"
    resp = await client.post(
        f"{V}/functions", json={**CONTAINER_FN, "secrets": [{"name": "s", "value": secret}]}
    )
    assert resp.status_code == 200
    access = [r for r in caplog.records if r.name == "nvcf.access"]
    assert len(access) == 1
    line = access[0].getMessage()
    assert "POST /v2/nvcf/functions 200" in line and resp.headers["x-request-id"] in line
    assert secret not in caplog.text
    assert "nvapi-" not in caplog.text


async def test_request_validation_is_400_not_422(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get(f"{V}/functions", params={"limit": "many"}), 400)
    assert body["errors"][0]["field"] == "limit"

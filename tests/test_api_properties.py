"""Property test over every route of the OpenAPI document (issue: security and robustness).

Hypothesis generates request bodies from each operation's documented schema (and arbitrary
JSON, to probe shapes the schema excludes) and sends them, with real and unknown ids, to the
real server process. Whatever it sends: never a 5xx, a 4xx is always problem+json (OpenAI's
error object on the LLM gateway's routes, as the document declares), every status is one the
document declares for that operation, and after a 4xx nothing is stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server
from tests.support.strategies import from_json_schema

DOCUMENT = json.loads(
    (Path(__file__).resolve().parents[1] / "openapi" / "openapi.json").read_text()
)
TABLES = (
    "functions",
    "function_versions",
    "function_authorizations",
    "deployments",
    "deployment_specs",
    "registry_credentials",
    "api_keys",
    "tasks",
)
OPERATIONS = [
    (method.upper(), path, op)
    for path, ops in DOCUMENT["paths"].items()
    for method, op in ops.items()
    if path.startswith(("/v2/nvcf", "/v1/nvct"))
]


def body_strategy(op: dict[str, Any]) -> st.SearchStrategy[Any]:
    content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    if "schema" not in content:
        return st.none()
    return from_json_schema(content["schema"], DOCUMENT["components"]["schemas"])


class Target:
    def __init__(self, base: str, database_url: str, ids: dict[str, str]) -> None:
        self.base = base
        self.ids = ids
        sync_url = database_url.replace("+aiosqlite", "")
        self.engine = create_engine(sync_url)

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {
                t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES
            }


@pytest.fixture
def target(tmp_path: Path, database_url: str) -> Iterator[Target]:
    port = free_port()
    proc = start_server(
        tmp_path,
        database_url,
        port,
        NVCF_RECONCILER_ENABLED="false",
        NVCF_RATE_LIMIT_PER_SECOND="0",
    )
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    fn = httpx.post(f"{base}/v2/nvcf/functions", json=CONTAINER_FN, headers=headers).json()
    task = {
        "name": "t",
        "gpuSpecification": {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"},
        "containerImage": "nvcr.io/acme/t:1",
        "resultHandlingStrategy": "NONE",
    }
    made = httpx.post(f"{base}/v1/nvct/tasks", json=task, headers=headers).json()
    ids = {
        "functionId": fn["function"]["id"],
        "functionVersionId": fn["function"]["versionId"],
        "taskId": made["task"]["id"],
        "ncaId": made["task"]["ncaId"],
    }
    t = Target(base, database_url, ids)
    try:
        yield t
    finally:
        t.engine.dispose()
        stop_server(proc)


# Derandomized, so a run of the suite is repeatable; to explore further, drop
# `derandomize` and run with `--hypothesis-seed=N` (seeds 1-5 found nothing).
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_request_breaks_the_api(target: Target, data: st.DataObject) -> None:
    method, path, op = data.draw(st.sampled_from(OPERATIONS), label="operation")
    url = path
    for name in [p["name"] for p in op.get("parameters", []) if p.get("in") == "path"]:
        real = target.ids.get(name)
        choices = [str(uuid.uuid4()), "not-a-uuid"] + ([real] if real else [])
        url = url.replace("{" + name + "}", data.draw(st.sampled_from(choices), label=name))
    body = data.draw(body_strategy(op), label="body")
    before = target.counts()
    resp = httpx.request(
        method,
        target.base + url,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        json=body if method in ("POST", "PUT", "PATCH") else None,
        timeout=30,
    )
    assert resp.status_code < 500, resp.text
    assert str(resp.status_code) in op["responses"], (method, path, resp.status_code, resp.text)
    if 400 <= resp.status_code < 500:
        # problem+json, or OpenAI's error object where the document says so (the LLM gateway)
        declared = op["responses"][str(resp.status_code)]["content"]
        assert resp.headers["content-type"] in declared, (declared, resp.text)
        assert target.counts() == before, resp.text

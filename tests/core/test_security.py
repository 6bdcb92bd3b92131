"""Hostile input answered with a 4xx problem, never a 500, and nothing stored after a refusal.

Each test runs on SQLite and PostgreSQL: PostgreSQL refuses NUL in text and strings longer
than their column, SQLite stores them, so the same request can fail differently on each.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import AppClient
from tests.core.test_http import assert_problem
from tests.support.api import CONTAINER_FN

V = "/v2/nvcf"
JSON = {"content-type": "application/json"}


def fields(body: dict[str, Any]) -> set[str]:
    return {e["field"] for e in body.get("errors", [])}


async def function_count(client: AppClient) -> int:
    resp = await client.get(f"{V}/functions")
    assert resp.status_code == 200, resp.text
    return len(resp.json()["functions"])


def raw(body: str) -> bytes:
    """A JSON text as sent: `\\ud800` stays an escape (json.dumps of a str would too)."""
    return body.encode()


# --- 7. error amplification ---------------------------------------------------------------


async def test_many_violations_are_capped(client: AppClient) -> None:
    body = json.dumps({**CONTAINER_FN, "tags": ["!"] * 100_000}).encode()
    assert len(body) < 1024 * 1024
    resp = await client.post(f"{V}/functions", content=body, headers=JSON)
    problem = assert_problem(resp, 400)
    assert len(resp.content) < len(body)
    assert len(resp.content) < 64 * 1024
    errors = problem["errors"]
    assert isinstance(errors, list) and len(errors) == 100
    omitted = problem["errorsOmitted"]
    assert isinstance(omitted, int) and omitted >= 100_000 - 100
    assert f"{omitted} more" in str(problem["detail"])
    assert await function_count(client) == 0


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

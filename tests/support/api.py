"""Helpers for API tests: bodies, keys made through the admin API, problem-details checks."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

CONTAINER_FN: dict[str, Any] = {
    "name": "echo",
    "inferenceUrl": "/echo",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/acme/echo:1.0",
}


async def new_key(
    client: httpx.AsyncClient,
    scopes: list[str],
    account: str | None = None,
    expires_in: str | None = None,
) -> str:
    body: dict[str, Any] = {"scopes": scopes}
    if account is not None:
        body["ncaId"] = account
    if expires_in is not None:
        body["expiresIn"] = expires_in
    resp = await client.post("/v2/nvcf/api-keys", json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["apiKey"]["key"])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def create_fn(client: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    body = {**CONTAINER_FN, **changes}
    resp = await client.post("/v2/nvcf/functions", json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["function"])


def assert_problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["status"] == status
    assert body["requestId"] == resp.headers["x-request-id"]
    uuid.UUID(str(body["requestId"]))
    assert str(body["type"]).startswith("urn:nvcf:problem-details:")
    return dict(body)

"""The REST dependencies (service/auth/deps.py): how a route's caller is checked is the
route's declaration, never something a client's query can change."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import CONTAINER_FN

V = "/v2/nvcf"


async def test_a_create_takes_no_invocation_query_parameter(client: httpx.AsyncClient) -> None:
    """`invocation` (whether an invocation token is a credential) is the route's, not a query
    parameter: a create with `?invocation=...` is answered as one without it, and the API
    document offers no such parameter."""
    resp = await client.post(f"{V}/functions?invocation=maybe", json=CONTAINER_FN)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = (await client.get("/openapi.json")).json()
    offered = {
        (method, path)
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
        for parameter in operation.get("parameters", [])
        if parameter["name"] == "invocation"
    }
    assert offered == set()

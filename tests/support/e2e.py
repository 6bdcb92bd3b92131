"""Helpers for end-to-end tests through the HTTP API with the reconciler running in the app:
a catalog file of simulated clusters, polling with a deadline, and the function status and
deployment as a user reads them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.app import AppClient

V = "/v2/nvcf"


def write_catalog(tmp_path: Path, *, h100_nodes: int = 1) -> Path:
    """A one-cluster catalog (`e2e` / `e2e-a`), JSON being valid YAML."""
    data = {
        "clusterGroups": [
            {
                "name": "e2e",
                "clusters": [
                    {
                        "name": "e2e-a",
                        "adapter": "simulated",
                        "provider": "NCP",
                        "region": "us-east-1",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": h100_nodes}],
                        "simulation": {
                            "scheduleSeconds": 0.02,
                            "pullSeconds": 0.02,
                            "readySeconds": 0.05,
                        },
                    }
                ],
            }
        ]
    }
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps(data))
    return path


async def eventually(check: Callable[[], Awaitable[Any]], *, seconds: float = 30.0) -> Any:
    """Poll until `check()` returns something truthy; fail after the deadline."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached within {seconds}s")
        await asyncio.sleep(0.05)


def dep_url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def status(client: httpx.AsyncClient, fn: dict[str, Any]) -> str:
    """The function version's status as GET returns it."""
    resp = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["function"]["status"])


async def deployment(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    resp = await client.get(dep_url(fn))
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["deployment"])


async def until_status(
    client: httpx.AsyncClient, fn: dict[str, Any], wanted: str, *, seconds: float = 30.0
) -> None:
    async def check() -> bool:
        return await status(client, fn) == wanted

    await eventually(check, seconds=seconds)

"""Graceful undeploy over HTTP on the simulated cluster: `?graceful=true` turns the version
INACTIVE at once (new requests refused) but the request in flight is answered before the
instance goes; without it the instance is torn down at once and that request fails."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from httpx import Response

from service.deployments.models import Instance
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import dep_url, eventually, status
from tests.support.invocation import deployed, invocation_app, pexec_url


@pytest.fixture
async def client(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(client_factory, tmp_path, invoke_route_cache_seconds=0.05)


async def in_flight(client: AppClient, fn: dict[str, Any]) -> bool:
    plane = client.app.state.invocation
    return bool(plane.dispatcher.in_flight(uuid.UUID(fn["versionId"])))


async def instance_gone(client: AppClient, instance_id: str) -> bool:
    async with client.app.state.sessionmaker() as session:
        return await session.get(Instance, uuid.UUID(instance_id)) is None


async def slow_request(
    client: AppClient, fn: dict[str, Any], delay_ms: int = 1500
) -> asyncio.Task[Response]:
    task = asyncio.create_task(
        client.post(
            pexec_url(fn),
            json={"slow": True},
            headers={"X-Sim-Delay-Ms": str(delay_ms), "NVCF-POLL-SECONDS": "30"},
        )
    )
    await eventually(lambda: in_flight(client, fn))
    return task


async def test_graceful_undeploy_answers_the_request_in_flight(client: AppClient) -> None:
    fn = await deployed(client)
    [inst] = fn["deployment"]["instances"]
    request = await slow_request(client, fn)

    resp = await client.delete(dep_url(fn), params={"graceful": "true"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["function"]["status"] == "INACTIVE"
    refused = await client.post(pexec_url(fn), json={})
    assert refused.status_code == 400 and "INACTIVE" in refused.json()["detail"]
    assert not await instance_gone(client, inst["instanceId"])  # still draining

    answer = await request
    assert answer.status_code == 200, answer.text
    assert answer.json()["echo"] == {"slow": True}
    await eventually(lambda: instance_gone(client, inst["instanceId"]))
    assert await status(client, fn) == "INACTIVE"


async def test_immediate_undeploy_does_not_wait_for_the_request(client: AppClient) -> None:
    fn = await deployed(client)
    [inst] = fn["deployment"]["instances"]
    # the worker would take 25 s: however slow the machine, the teardown comes first
    request = await slow_request(client, fn, delay_ms=25_000)

    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text
    await eventually(lambda: instance_gone(client, inst["instanceId"]))
    # torn down while the request was still running: its connection reset (a request left
    # to finish would have been answered 200)
    answer = await request
    assert answer.status_code == 502, answer.text
    # cut mid-answer, or (torn down before the request reached the worker) refused
    assert "torn down" in answer.text or "no simulated worker runs" in answer.text, answer.text

"""Instance logs end to end over HTTP (a real server stack in this event loop, the reconciler
and a simulated cluster running): reading and following an instance's log (the lines of
requests made while following), the deployment-wide form, the bounds and refusals, another
account's 404, secret values masked, and a crash loop's last lines after teardown."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, update

from service.core.server import ConnectionLimits
from service.deployments.models import DeploymentSpec
from tests.support.api import assert_problem, bearer, create_fn, new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.e2e import V, dep_url, deployment, eventually, until_status, write_catalog
from tests.support.server import in_loop_server

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 1.0,
}
SECRET = "s3cr3t-token-9f8e7d"


async def app(client_factory: ClientFactory, tmp_path: Path, **overrides: Any) -> AppClient:
    return await client_factory(clusters_file=write_catalog(tmp_path), **{**FAST, **overrides})


@contextlib.asynccontextmanager
async def serving(client: AppClient) -> AsyncIterator[httpx.AsyncClient]:
    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=100
    )
    async with in_loop_server(client.app, limits) as server:
        base = f"http://127.0.0.1:{server.config.port}"
        async with httpx.AsyncClient(base_url=base, headers=bearer(ADMIN_KEY)) as http:
            yield http


async def deployed(client: AppClient, **fn_changes: Any) -> tuple[dict[str, Any], str, str]:
    fn = await create_fn(client, **fn_changes)
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "ACTIVE")
    dep = await deployment(client, fn)
    return fn, dep["deploymentId"], dep["instances"][0]["instanceId"]


async def invoke(client: httpx.AsyncClient, fn: dict[str, Any], **headers: str) -> None:
    resp = await client.post(
        f"{V}/pexec/functions/{fn['id']}", json={"q": 1}, headers=headers, timeout=30
    )
    assert resp.status_code == 200, resp.text


async def test_follow_sees_the_requests_made_while_following_with_secrets_masked(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path)
    fn, dep_id, inst = await deployed(client, secrets=[{"name": "API_TOKEN", "value": SECRET}])
    url = f"{V}/deployments/{dep_id}/instances/{inst}/logs"
    async with serving(client) as http:
        resp = await http.get(url, params={"timestamps": "true"})
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/plain")
        first = resp.text.splitlines()[0]
        assert first.startswith("[") and "/inference] 20" in first  # [pod/container] time
        assert "Starting inference" in first

        async with http.stream(
            "GET", url, params={"follow": "true", "tailLines": "0"}, timeout=30
        ) as following:
            assert following.status_code == 200
            lines = following.aiter_lines()
            await invoke(http, fn, **{"X-Sim-Log": f"connecting with token={SECRET}"})
            printed = await anext(lines)
            served = await anext(lines)
        assert printed.endswith("connecting with token=****")
        assert SECRET not in printed
        assert '"POST /' in served and " 200 " in served

        # the deployment-wide form prefixes each line with its instance
        resp = await http.get(f"{V}/deployments/{dep_id}/logs", params={"tailLines": "2"})
        assert resp.status_code == 200
        assert resp.text.splitlines()[-1].startswith(f"[{inst}] [")
        assert SECRET not in resp.text

        # one container, no pod/container prefix
        resp = await http.get(url, params={"container": "inference", "tailLines": "1"})
        assert resp.text.startswith('INFO     "POST /')


async def test_a_follow_ends_when_the_instance_ends(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path)
    fn, dep_id, inst = await deployed(client)
    url = f"{V}/deployments/{dep_id}/instances/{inst}/logs"
    async with serving(client) as http:
        async with http.stream("GET", url, params={"follow": "true"}, timeout=30) as following:
            lines = following.aiter_lines()
            assert "Starting" in await anext(lines)
            resp = await client.delete(dep_url(fn))
            assert resp.status_code == 200
            rest = [line async for line in lines]  # ends once the instance is torn down
        assert all("Traceback" not in line for line in rest)


async def test_bounds_refusals_scope_and_other_accounts(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, logs_max_follows_per_account=1, logs_max_bytes=300)
    _fn, dep_id, inst = await deployed(client)
    url = f"{V}/deployments/{dep_id}/instances/{inst}/logs"
    async with serving(client) as http:
        resp = await http.get(url, params={"tailLines": "10001", "sinceSeconds": "0"})
        problem = assert_problem(resp, 400)
        fields = {e["field"] for e in problem["errors"]}
        assert {"sinceSeconds"} <= fields or "tailLines" in json.dumps(problem)

        resp = await http.get(url, params={"container": "nope"})
        problem = assert_problem(resp, 400)
        assert problem["errors"] == [
            {
                "field": "container",
                "message": 'container "nope" is not valid for the pods of this instance',
            }
        ]
        assert_problem(await http.get(url, params={"container": "Bad_Name"}), 400)

        follow_one = {"follow": "true", "tailLines": "1"}  # within the byte bound
        async with http.stream("GET", url, params=follow_one, timeout=30) as one:
            assert one.status_code == 200
            reading = one.aiter_lines()  # kept: a dropped iterator closes the connection
            await anext(reading)
            second = await http.get(url, params={"follow": "true"})
            assert_problem(second, 429)
            assert "Retry-After" in second.headers
            # reading without following is not limited
            assert (await http.get(url, params={"tailLines": "1"})).status_code == 200

        async def released() -> bool:
            # the caller left: its place is given back (once the server sees it gone)
            async with http.stream("GET", url, params={"follow": "true"}, timeout=30) as again:
                return again.status_code == 200

        assert await eventually(released)

        # an answer carries at most NVCF_LOGS_MAX_BYTES (then a note ends it)
        whole = await http.get(url)
        assert whole.status_code == 200
        assert len(whole.content) <= 300 + 64
        assert whole.text.endswith("-- log cut at 300 bytes (NVCF_LOGS_MAX_BYTES) --\n")

        other = await new_key(client, ["deploy_function"], account="other-account")
        resp = await http.get(url, headers=bearer(other))
        assert_problem(resp, 404)
        resp = await http.get(f"{V}/deployments/{dep_id}/logs", headers=bearer(other))
        assert_problem(resp, 404)
        reader = await new_key(client, ["list_functions"])
        assert_problem(await http.get(url, headers=bearer(reader)), 403)
        unknown = "00000000-0000-4000-8000-000000000000"
        assert_problem(await http.get(f"{V}/deployments/{dep_id}/instances/{unknown}/logs"), 404)
        assert_problem(await http.get(f"{V}/deployments/{dep_id}/instances/x/logs"), 400)


async def test_a_crash_loops_last_lines_outlive_the_instance(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(
        client_factory, tmp_path, reconciler_enabled=False, health_restart_loop_timeout=0.5
    )
    fn = await create_fn(client, secrets=[{"name": "API_TOKEN", "value": SECRET}])
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    async with client.app.state.sessionmaker() as session, session.begin():
        spec = (await session.execute(select(DeploymentSpec))).scalar_one()
        objects = json.loads(json.dumps(spec.objects))
        for obj in objects:
            template = obj.get("spec", {}).get("template")
            if template is not None:
                meta = template.setdefault("metadata", {})
                meta.setdefault("annotations", {})["sim.nvcf.io/fault"] = "CrashLoopBackOff"
        await session.execute(
            update(DeploymentSpec).where(DeploymentSpec.id == spec.id).values(objects=objects)
        )
    client.app.state.reconciler.start()
    await until_status(client, fn, "ERROR", seconds=60)
    dep = await deployment(client, fn)
    [health, *_] = dep["healthInfo"]
    assert any(line.endswith("Traceback (most recent call last):") for line in health["lastLogs"])
    failed = [
        e["instanceId"]
        for e in (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()[
            "events"
        ]
        if e.get("instanceId") and e.get("phase") == "Failed"
    ]
    assert failed
    resp = await client.get(f"{V}/deployments/{dep['deploymentId']}/instances/{failed[0]}/logs")
    assert resp.status_code == 200
    assert "RuntimeError: CUDA error: out of memory" in resp.text
    assert SECRET not in resp.text

    # undeployed: the deployment's history still shows them
    assert (await client.delete(dep_url(fn))).status_code == 200

    async def removed() -> Any:
        resp = await client.get(f"{dep_url(fn)}/history")
        return resp.json()["deployments"] if resp.status_code == 200 else None

    [gone] = await eventually(removed)
    assert any("Traceback" in line for line in gone["healthInfo"][0]["lastLogs"])
    resp = await client.get(f"{V}/deployments/{gone['deploymentId']}/instances/{failed[0]}/logs")
    assert "RuntimeError: CUDA error: out of memory" in resp.text
    await asyncio.sleep(0)

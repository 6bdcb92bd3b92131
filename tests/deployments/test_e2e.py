"""End to end through the HTTP API with the reconciler running in the app: a catalog file of
simulated clusters with small delays, shrunk health timeouts, polling with a deadline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.deployments.models import DeploymentSpec, Instance
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import (
    V,
    dep_url,
    deployment,
    eventually,
    status,
    until_status,
    write_catalog,
)

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 1.0,
}


async def app(client_factory: ClientFactory, tmp_path: Path, **overrides: Any) -> AppClient:
    return await client_factory(clusters_file=write_catalog(tmp_path), **{**FAST, **overrides})


def sim(client: AppClient) -> SimulatedAdapter:
    adapter = client.app.state.adapters.get("e2e-a")
    assert isinstance(adapter, SimulatedAdapter)
    return adapter


async def objects_of(client: AppClient, instance_id: str) -> list[dict[str, Any]]:
    spec = InstanceSpec(instance_id, "f", "v", "NCP.GPU.H100_1x", "H100", 1)
    return await sim(client).objects(spec)


async def test_inactive_deploying_active_then_undeploy(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path)
    fn = await create_fn(client)
    assert await status(client, fn) == "INACTIVE"
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["deployment"]["functionStatus"] == "DEPLOYING"
    await until_status(client, fn, "ACTIVE")
    dep = await deployment(client, fn)
    [inst] = dep["instances"]
    assert (inst["phase"], inst["cluster"]) == ("Running", "e2e-a")
    assert await objects_of(client, inst["instanceId"])
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    kinds = [e["kind"] for e in events]
    assert "instance" in kinds and "status" in kinds

    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "INACTIVE")

    async def torn_down() -> bool:
        return not await objects_of(client, inst["instanceId"])

    await eventually(torn_down)

    async def records_gone() -> bool:
        async with client.app.state.sessionmaker() as session:
            return not (await session.execute(select(Instance.id))).first()

    await eventually(records_gone)


async def test_min_zero_is_active_at_once(client_factory: ClientFactory, tmp_path: Path) -> None:
    client = await app(client_factory, tmp_path)
    fn = await create_fn(client)
    resp = await client.post(
        dep_url(fn), json={"deploymentSpecifications": [{**H100, "minInstances": 0}]}
    )
    assert resp.status_code == 200, resp.text
    assert await status(client, fn) == "ACTIVE"
    await asyncio.sleep(0.3)  # a few passes: nothing to create, still ACTIVE
    assert await status(client, fn) == "ACTIVE"
    assert (await deployment(client, fn))["instances"] == []


async def test_image_pull_fault_ends_in_error_with_health_info(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    # Container functions offer no way to set pod annotations: deploy with the reconciler
    # stopped, inject the fault into the stored objects, then let it run.
    client = await app(client_factory, tmp_path, reconciler_enabled=False)
    fn = await create_fn(client)
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    async with client.app.state.sessionmaker() as session, session.begin():
        spec = (await session.execute(select(DeploymentSpec))).scalar_one()
        objects = json.loads(json.dumps(spec.objects))
        for obj in objects:
            template = obj.get("spec", {}).get("template")
            if template is not None:
                meta = template.setdefault("metadata", {})
                meta.setdefault("annotations", {})["sim.nvcf.io/fault"] = "ImagePullBackOff"
        await session.execute(
            update(DeploymentSpec).where(DeploymentSpec.id == spec.id).values(objects=objects)
        )
    client.app.state.reconciler.start()
    await until_status(client, fn, "ERROR")
    dep = await deployment(client, fn)
    assert any(i["reason"] == "ImagePullIssues" for i in dep["instances"]) or any(
        "ImagePull" in h["error"] or "pull" in h["error"] for h in dep.get("healthInfo") or []
    ), dep
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert any(e.get("reason") == "ImagePullIssues" for e in events)
    async with client.app.state.sessionmaker() as session:
        ids = [str(i) for i in (await session.execute(select(Instance.id))).scalars()]
    assert ids
    for instance_id in ids:
        assert await objects_of(client, instance_id) == []


async def test_no_capacity_is_stuck_scheduling(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path)
    big = await create_fn(client, name="big")
    spec8 = {**H100, "instanceType": "NCP.GPU.H100_8x"}
    resp = await client.post(dep_url(big), json={"deploymentSpecifications": [spec8]})
    assert resp.status_code == 200, resp.text
    await until_status(client, big, "ACTIVE")
    small = await create_fn(client, name="small")
    resp = await client.post(dep_url(small), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    await until_status(client, small, "ERROR")
    events = (
        await client.get(
            f"{V}/deployments/{(await deployment(client, small))['deploymentId']}/events"
        )
    ).json()["events"]
    assert any(e.get("reason") == "PodStuckScheduling" for e in events)
    assert await status(client, big) == "ACTIVE"


async def _deploy_with_fault(
    client: AppClient, fn: dict[str, Any], annotations: dict[str, str], minimum: int
) -> None:
    """Deploy with the reconciler stopped, put fault annotations on the stored pod template
    (container functions offer no way to set them), then let the reconciler run."""
    body = {"deploymentSpecifications": [{**H100, "minInstances": minimum, "maxInstances": 2}]}
    resp = await client.post(dep_url(fn), json=body)
    assert resp.status_code == 200, resp.text
    async with client.app.state.sessionmaker() as session, session.begin():
        spec = (await session.execute(select(DeploymentSpec))).scalar_one()
        objects = json.loads(json.dumps(spec.objects))
        for obj in objects:
            template = obj.get("spec", {}).get("template")
            if template is not None:
                template.setdefault("metadata", {}).setdefault("annotations", {}).update(
                    annotations
                )
        await session.execute(
            update(DeploymentSpec).where(DeploymentSpec.id == spec.id).values(objects=objects)
        )
    client.app.state.reconciler.start()


async def test_deploying_replaces_a_failure_then_active(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, reconciler_enabled=False)
    fn = await create_fn(client)
    fault = {"sim.nvcf.io/fault": "ImagePullBackOff", "sim.nvcf.io/fault-instances": "1"}
    await _deploy_with_fault(client, fn, fault, 2)
    await until_status(client, fn, "ACTIVE")
    dep = await deployment(client, fn)
    running = [i for i in dep["instances"] if i["phase"] == "Running"]
    assert len(running) == 2, dep["instances"]
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    failed = {
        e["instanceId"] for e in events if e["kind"] == "instance" and e.get("phase") == "Failed"
    }
    assert len(failed) == 1 and not failed & {i["instanceId"] for i in running}
    assert any(e.get("reason") == "ImagePullIssues" for e in events)
    statuses = [e["message"] for e in events if e["kind"] == "status"]
    assert not any("ERROR" in m for m in statuses), statuses


async def test_deploying_errors_when_every_attempt_fails(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, reconciler_enabled=False)
    fn = await create_fn(client)
    await _deploy_with_fault(client, fn, {"sim.nvcf.io/fault": "ImagePullBackOff"}, 2)
    await until_status(client, fn, "ERROR")
    dep = await deployment(client, fn)
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    [error] = [e for e in events if e["kind"] == "status" and "→ ERROR" in e["message"]]
    assert error["reason"] == "ImagePullIssues"
    assert "instances tried failed" in error["message"]
    tried = [e for e in events if e["kind"] == "instance" and e.get("reason") == "Created"]
    assert 2 <= len(tried) <= 2 * 3  # minInstances × NVCF_RECONCILE_DEPLOY_ATTEMPTS (3)


async def test_deploying_attempts_are_a_setting(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(
        client_factory, tmp_path, reconciler_enabled=False, reconcile_deploy_attempts=1
    )
    fn = await create_fn(client)
    fault = {"sim.nvcf.io/fault": "ImagePullBackOff", "sim.nvcf.io/fault-instances": "1"}
    await _deploy_with_fault(client, fn, fault, 2)
    await until_status(client, fn, "ERROR")
    dep = await deployment(client, fn)
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    created = [e for e in events if e["kind"] == "instance" and e.get("reason") == "Created"]
    assert len(created) == 2  # the failure was not replaced
    [error] = [e for e in events if e["kind"] == "status" and "→ ERROR" in e["message"]]
    assert "out of attempts (1 per instance of the minimum)" in error["message"]

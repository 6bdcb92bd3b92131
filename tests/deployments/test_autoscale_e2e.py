"""The autoscaler over HTTP on the embedded default, with short windows set through settings:
load raises the instance count within maxInstances and idle lowers it; minInstances 0 goes to
zero and a new request brings an instance back and is answered; a custom configuration changes
the thresholds; missing load reports never scale to zero. Waits are bounded polls of what a
user sees (the deployment, its events), never timings."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from service.core.db import utcnow
from service.deployments import transitions
from service.deployments.autoscaler.loop import Autoscaler, AutoscalerConfig
from service.deployments.models import Deployment, LoadReporter, ReportedLoad
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, deployment, eventually, status
from tests.support.invocation import deployed, invocation_app, pexec_url, sample, spec

#: readings every 0.1 s judged over 0.3 s; scale up at once, down after 0.2 s below
QUICK = {
    "autoscale_interval": 0.1,
    "autoscale_window_seconds": 0.3,
    "autoscale_up_stickiness_seconds": 0,
    "autoscale_down_stickiness_seconds": 0.2,
    "autoscale_load_report_seconds": 0.05,
    "autoscale_load_stale_seconds": 0.5,
}


async def app(client_factory: ClientFactory, tmp_path: Path, **overrides: Any) -> AppClient:
    return await invocation_app(client_factory, tmp_path, **{**QUICK, **overrides})


def running(dep: dict[str, Any]) -> int:
    return sum(1 for i in dep["instances"] if i["phase"] == "Running")


def target(dep: dict[str, Any]) -> int:
    return int(dep["deploymentSpecifications"][0]["targetInstances"])


async def events(client: AppClient, fn: dict[str, Any]) -> list[dict[str, Any]]:
    dep_id = fn["deployment"]["deploymentId"]
    resp = await client.get(f"{V}/deployments/{dep_id}/events", params={"limit": 500})
    assert resp.status_code == 200
    return list(resp.json()["events"])


async def scaling(client: AppClient, fn: dict[str, Any]) -> list[str]:
    return [
        e["message"]
        for e in await events(client, fn)
        if e["kind"] == "scaling" and e["message"].startswith("autoscaler:")
    ]


@contextlib.asynccontextmanager
async def load(
    client: AppClient, fn: dict[str, Any], clients: int, delay_ms: int
) -> AsyncIterator[list[int]]:
    """`clients` callers invoking the function over and over (each request takes `delay_ms`
    on the worker); the statuses they got."""
    statuses: list[int] = []

    async def caller() -> None:
        while True:
            resp = await client.post(
                pexec_url(fn),
                json={"n": 1},
                headers={"X-Sim-Delay-Ms": str(delay_ms), "NVCF-POLL-SECONDS": "30"},
            )
            statuses.append(resp.status_code)

    tasks = [asyncio.create_task(caller()) for _ in range(clients)]
    try:
        yield statuses
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_load_raises_the_count_within_max_and_idle_lowers_it(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path)
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    seen: list[int] = []

    async def at(count: int) -> bool:
        dep = await deployment(client, fn)
        seen.append(len([i for i in dep["instances"]]))
        return running(dep) == count and target(dep) == count

    async with load(client, fn, clients=6, delay_ms=200) as statuses:
        await eventually(lambda: at(3))
        # the load stays: the count stays at maxInstances
        readings = client.app.state.autoscaler.readings
        await eventually(lambda: _after(client, readings + 10))
        assert target(await deployment(client, fn)) == 3
    assert statuses and set(statuses) == {200}
    assert max(seen) <= 3
    await eventually(lambda: at(1))
    messages = await scaling(client, fn)
    assert messages[0].startswith("autoscaler: 1 → 2 instances (scale up; utilisation ")
    assert "queue depth" in messages[0]
    assert any(m.startswith("autoscaler: 3 → 2 instances (scale down;") for m in messages)
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_autoscale_decisions_total", direction="up") >= 2
    assert sample(metrics, "nvcf_autoscale_decisions_total", direction="down") >= 2
    assert sample(metrics, "nvcf_autoscale_target_instances", version_id=fn["versionId"]) == 1


async def test_min_zero_reaches_zero_and_a_request_brings_one_back(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, autoscale_idle_seconds=0.5)
    fn = await deployed(client, specs=[spec(minInstances=0, maxInstances=2)])
    # a version with minInstances 0 is ACTIVE with no instance, and invocable
    assert fn["deployment"]["instances"] == []
    resp = await client.post(pexec_url(fn), json={"hi": 1}, headers={"NVCF-POLL-SECONDS": "30"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == {"hi": 1}
    timeline = await events(client, fn)
    cold = [e for e in timeline if e.get("reason") == "ScaledFromZero"]
    assert cold and "0 → 1 instances (scale from zero" in cold[0]["message"]
    after = timeline[timeline.index(cold[0]) :]
    assert any(e["kind"] == "instance" and e.get("phase") == "Running" for e in after)

    async def zero() -> bool:
        dep = await deployment(client, fn)
        return target(dep) == 0 and running(dep) == 0

    await eventually(zero)
    assert any(e.get("reason") == "ScaledToZero" for e in await events(client, fn))
    assert await status(client, fn) == "ACTIVE"
    # and back again
    resp = await client.post(pexec_url(fn), json={"hi": 2}, headers={"NVCF-POLL-SECONDS": "30"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == {"hi": 2}
    assert [e.get("reason") for e in await events(client, fn)].count("ScaledFromZero") == 2


async def test_a_custom_configuration_changes_the_thresholds(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Two callers on one instance of concurrency 4 are at most 50 %: the platform policy
    holds (70 %), a custom scale-up threshold of 25 % doubles the count."""
    client = await app(client_factory, tmp_path)
    fn = await deployed(
        client, specs=[spec(minInstances=1, maxInstances=4, maxRequestConcurrency=4)]
    )
    dep = fn["deployment"]
    gsid = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    url = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{gsid}"
    async with load(client, fn, clients=2, delay_ms=500):
        readings = client.app.state.autoscaler.readings
        await eventually(lambda: _after(client, readings + 15))
        assert target(await deployment(client, fn)) == 1
        config = {
            "scaleUpDetails": {"factor": 2.0, "threshold": 25},
            "scaleDownDetails": {"factor": 0.5, "threshold": 10},
        }
        resp = await client.patch(url, json={"autoscalingConfiguration": config})
        assert resp.status_code == 200, resp.text

        async def doubled() -> bool:
            return target(await deployment(client, fn)) == 2

        await eventually(doubled)
    messages = await scaling(client, fn)
    assert "policy CUSTOM_CONFIGURATION" in messages[0]


async def test_missing_load_reports_never_scale_to_zero(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await app(client_factory, tmp_path, autoscale_idle_seconds=0.3)
    fn = await deployed(client, specs=[spec(minInstances=0, maxInstances=1)])
    resp = await client.post(pexec_url(fn), json={}, headers={"NVCF-POLL-SECONDS": "30"})
    assert resp.status_code == 200
    plane = client.app.state.invocation
    assert plane is not None
    await plane.load_publisher.stop()  # the invocation plane stops reporting its load
    readings = client.app.state.autoscaler.readings
    await eventually(lambda: _after(client, readings + 30))
    dep = await deployment(client, fn)
    assert target(dep) == 1 and running(dep) == 1
    assert not any(e.get("reason") == "ScaledToZero" for e in await events(client, fn))
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_autoscale_readings_total", signal="missing") > 0
    plane.load_publisher.start()  # reports again: idle is measured from their return

    async def zero() -> bool:
        return target(await deployment(client, fn)) == 0

    await eventually(zero)


async def _after(client: AppClient, readings: int) -> bool:
    return bool(client.app.state.autoscaler.readings >= readings)


async def test_two_replicas_reading_at_once_take_one_decision(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Two autoscalers on one database read the same waiting request at the same moment:
    the row lock and the compare-and-set of their memory let exactly one of them decide."""
    client = await app(client_factory, tmp_path, autoscale_enabled=False, invoke_enabled=False)
    fn = await deployed(client, specs=[spec(minInstances=0, maxInstances=2)])
    maker = client.app.state.sessionmaker
    now = utcnow()
    async with maker() as session, session.begin():
        session.add(LoadReporter(owner="other", reported_at=now))
        session.add(
            ReportedLoad(
                owner="other",
                version_id=uuid.UUID(fn["versionId"]),
                in_flight=0.0,
                waiting=1,
                last_request_at=now,
                sampled_at=now,
            )
        )
    settings = client.app.state.settings
    config = AutoscalerConfig.from_settings(settings)
    replicas = [Autoscaler(maker, config) for _ in range(2)]
    reports = await asyncio.gather(*(a.run_once() for a in replicas))
    assert sum(len(r.decisions) for r in reports) == 1
    reasons = [e.get("reason") for e in await events(client, fn)]
    assert reasons.count("ScaledFromZero") == 1
    assert target(await deployment(client, fn)) == 1


async def test_min_and_max_changes_clamp_the_autoscalers_target(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """The target is kept within [minInstances, maxInstances]: a lower maxInstances retires
    the surplus at once, a higher minInstances starts instances at once."""
    client = await app(client_factory, tmp_path, autoscale_enabled=False)
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=4)])
    dep = fn["deployment"]
    gsid = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    url = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{gsid}"
    async with client.app.state.sessionmaker() as session, session.begin():
        row = await session.get(Deployment, uuid.UUID(dep["deploymentId"]))
        assert row is not None
        transitions.set_targets(
            session, row, {uuid.UUID(gsid): 3}, utcnow(), reason="ScaledUp", message="test"
        )
    client.app.state.reconciler.wake()

    async def count(n: int) -> bool:
        d = await deployment(client, fn)
        return running(d) == n and len(d["instances"]) == n and target(d) == n

    await eventually(lambda: count(3))
    resp = await client.patch(url, json={"maxInstances": 2})
    assert resp.json()["gpuSpecification"]["targetInstances"] == 2
    await eventually(lambda: count(2))
    resp = await client.patch(url, json={"minInstances": 4, "maxInstances": 4})
    assert resp.json()["gpuSpecification"]["targetInstances"] == 4
    await eventually(lambda: count(4))

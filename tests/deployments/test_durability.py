"""Durability of the reconciler: a crash or restart in the middle of deploying resumes from the
database without duplicating or losing instances, and two reconcilers sharing one PostgreSQL
database never drive the same instance."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import BackendAdapter, Capacity, InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.backends.worker import WorkerEndpoint, WorkerPort
from service.clusters.adapters import AdapterRegistry
from service.deployments.models import Deployment, Instance
from service.deployments.reconcile import claim_owner
from service.functions.models import FunctionVersion
from service.health.observed import ObservedState
from tests.support.api import create_fn
from tests.support.app import ClientFactory
from tests.support.e2e import V, write_catalog
from tests.support.reconcile import Harness, namespaces, workload

N = 20


async def _all_active(h: Harness, deps: list[Deployment]) -> bool:
    async with h.maker() as session:
        statuses = (
            await session.execute(
                select(FunctionVersion.status).where(
                    FunctionVersion.id.in_([d.version_id for d in deps])
                )
            )
        ).scalars()
        return all(s == "ACTIVE" for s in statuses)


async def _present_rows(h: Harness) -> list[Instance]:
    async with h.maker() as session:
        return list(
            (await session.execute(select(Instance).where(Instance.desired == "present"))).scalars()
        )


async def test_crash_mid_deploy_resumes_without_duplicates(harness: Harness) -> None:
    deps = [await harness.deploy([workload()]) for _ in range(N)]
    first = harness.new_reconciler(lease_seconds=30)
    await first.run_once()  # rows created and applied; nothing Running yet
    harness.clock.advance(1)
    await first.run_once()
    # "Crash": the first reconciler vanishes without releasing its leases, and the simulated
    # cluster's memory goes with the process.
    fresh = AdapterRegistry.from_catalog(harness.catalog, clock=harness.clock)
    second = harness.new_reconciler(fresh, lease_seconds=30)
    await second.run_once()
    assert all(i.lease_owner == first.owner for i in await _present_rows(harness))

    async def converged() -> bool:
        return await _all_active(harness, deps)

    await harness.drive(converged, step=2.0, reconciler=second)
    rows = await _present_rows(harness)
    assert len(rows) == N and len({r.deployment_id for r in rows}) == N
    adapter = fresh.get("sim-a")
    assert isinstance(adapter, SimulatedAdapter)
    assert len(await namespaces(adapter, rows)) == N
    async with harness.maker() as session:
        total = await session.scalar(select(func.count()).select_from(Instance))
    assert total == N


class Tagged:
    """Shares one simulated cluster between reconcilers, recording who drives which instance."""

    def __init__(self, inner: SimulatedAdapter, tag: str, log: dict[str, set[str]]) -> None:
        self.name = inner.name
        self.inner = inner
        self.tag = tag
        self.log = log

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        self.log[instance.instance_id].add(self.tag)
        await asyncio.sleep(0)  # let the other reconciler interleave
        await self.inner.apply(instance, objects)

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        self.log[instance.instance_id].add(self.tag)
        await self.inner.update_objects(instance, objects)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        self.log[instance.instance_id].add(self.tag)
        await asyncio.sleep(0)
        return await self.inner.observe(instance)

    async def delete(self, instance: InstanceSpec) -> bool:
        self.log[instance.instance_id].add(self.tag)
        return await self.inner.delete(instance)

    async def endpoint(self, instance: InstanceSpec, port: WorkerPort) -> WorkerEndpoint:
        return await self.inner.endpoint(instance, port)

    def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        return self.inner.logs(instance, request)

    async def capacity(self) -> Capacity:
        return await self.inner.capacity()

    async def aclose(self) -> None:
        return None


async def test_two_reconcilers_never_drive_the_same_instance(
    harness: Harness, database_url: str
) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("several replicas need PostgreSQL (SQLite has a single writer)")
    driven: dict[str, set[str]] = defaultdict(set)
    shared = harness.sim()
    a_adapter: BackendAdapter = Tagged(shared, "a", driven)
    b_adapter: BackendAdapter = Tagged(shared, "b", driven)
    a = harness.new_reconciler(AdapterRegistry({"sim-a": a_adapter}), concurrency=4)
    b = harness.new_reconciler(AdapterRegistry({"sim-a": b_adapter}), concurrency=4)
    deps = [await harness.deploy([workload()]) for _ in range(N)]
    for _ in range(100):
        reports = await asyncio.gather(a.run_once(), b.run_once())
        assert all(r.errors == 0 for r in reports)
        if await _all_active(harness, deps):
            break
        harness.clock.advance(1)
    else:
        raise AssertionError("the two reconcilers did not converge")
    rows = await _present_rows(harness)
    assert len(rows) == N and len({r.deployment_id for r in rows}) == N
    assert {str(r.id) for r in rows} == set(driven)
    assert all(len(tags) == 1 for tags in driven.values()), driven
    assert len(await namespaces(shared, rows)) == N
    # Both took part: each claims what the other has not locked.
    assert {t for tags in driven.values() for t in tags} == {"a", "b"}


async def test_app_restart_mid_deploy_converges(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    catalog = write_catalog(tmp_path, h100_nodes=3)
    settings = {
        "clusters_file": catalog,
        "reconcile_interval": 0.05,
        "reconcile_resync_seconds": 0.2,
    }
    client = await client_factory(**settings)
    fns = [await create_fn(client, name=f"fn-{i}") for i in range(N)]
    spec = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
    for fn in fns:
        resp = await client.post(
            f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}",
            json={"deploymentSpecifications": [spec]},
        )
        assert resp.status_code == 200, resp.text
    # Stop in the middle: the reconciler has started on some deployments, not finished all.
    await asyncio.sleep(0.1)
    await client.app.state.reconciler.stop()
    maker = client.app.state.sessionmaker
    async with maker() as session:
        before = await session.scalar(select(func.count()).select_from(Instance))
    assert before is not None and before <= N

    restarted = await client_factory(**settings)
    for _ in range(600):
        statuses = [
            (await restarted.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")).json()[
                "function"
            ]["status"]
            for fn in fns
        ]
        if all(s == "ACTIVE" for s in statuses):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"not all ACTIVE after restart: {statuses}")
    async with restarted.app.state.sessionmaker() as session:
        rows = list((await session.execute(select(Instance))).scalars())
    assert len(rows) == N and len({r.deployment_id for r in rows}) == N
    assert all(r.desired == "present" and r.phase == "Running" for r in rows)
    adapter = restarted.app.state.adapters.get("e2e-a")
    assert isinstance(adapter, SimulatedAdapter)
    assert len(await namespaces(adapter, rows)) == N
    assert {uuid.UUID(fn["versionId"]) for fn in fns} == {
        d for d in await _deployed_versions(restarted.app.state.sessionmaker)
    }


async def _deployed_versions(maker: Any) -> set[uuid.UUID]:
    async with maker() as session:
        return set((await session.execute(select(Deployment.version_id))).scalars())


async def test_a_restarted_server_takes_back_its_own_leases_at_once(
    harness: Harness, tmp_path: Path
) -> None:
    """The lease identity lives in the data dir: after a crash, the next process with that
    data dir drives its predecessor's instances without waiting for the leases to expire,
    while a process with another data dir (another replica) still has to wait."""
    deps = [await harness.deploy([workload()]) for _ in range(3)]
    data_dir = tmp_path / "data"
    first_owner = claim_owner(data_dir)
    first = harness.new_reconciler(lease_seconds=600, owner=first_owner)
    await first.run_once()
    assert all(i.lease_owner == first.owner for i in await _present_rows(harness))
    # "Crash": no lease is released, the simulated cluster's memory is gone, and the kernel
    # drops the process's lock on the owner file.
    first_owner.close()
    fresh = AdapterRegistry.from_catalog(harness.catalog, clock=harness.clock)
    other_owner, restarted_owner = claim_owner(tmp_path / "x"), None
    try:
        other = harness.new_reconciler(fresh, lease_seconds=600, owner=other_owner)
        await other.run_once()
        assert all(i.lease_owner == first.owner for i in await _present_rows(harness))

        restarted_owner = claim_owner(data_dir)
        restarted = harness.new_reconciler(fresh, lease_seconds=600, owner=restarted_owner)
        assert restarted.owner == first.owner

        async def converged() -> bool:
            return await _all_active(harness, deps)

        # far less than the 600 s leases: only possible because the leases are its own
        await harness.drive(converged, step=1.0, passes=30, reconciler=restarted)
        rows = await _present_rows(harness)
        assert len(rows) == 3 and all(r.lease_owner == first.owner for r in rows)
    finally:
        other_owner.close()
        if restarted_owner is not None:
            restarted_owner.close()


def test_a_live_process_keeps_its_owner_id_to_itself(tmp_path: Path) -> None:
    held = claim_owner(tmp_path)
    second = claim_owner(tmp_path)
    assert held.persistent and not second.persistent and second.value != held.value
    held.close()
    third = claim_owner(tmp_path)
    assert third.persistent and third.value == held.value
    third.close()

"""The deployment use cases against concurrent writers of the same deployment or version: a
change that read the deployment before another request committed its own acts on the
deployment as it is now (the version is locked before the deployment is read), so the
account's instances count stays what its live deployments add up to; a deploy waits for a
delete of its version holding it, and finds no version."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select

from service.auth.service import Principal
from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.clusters.adapters import AdapterRegistry
from service.core.db import make_sessionmaker
from service.core.errors import NotFound
from service.core.events import Events
from service.core.quotas import Quotas
from service.core.settings import Settings
from service.deployments import repository, service, usage
from service.deployments.models import Deployment
from service.deployments.reconcile.store import ReconcileStore
from service.deployments.service import Deploying
from service.functions import service as functions_service
from service.functions.models import FunctionVersion
from tests.support.races import Writers, writers
from tests.support.reconcile import (
    ACCOUNT,
    Harness,
    add_version,
    workload,
)

PRINCIPAL = Principal(ACCOUNT, frozenset(), "api-key", "test")
H100 = {
    "gpu": "H100",
    "instanceType": "NCP.GPU.H100_1x",
    "backend": "test-group",
    "minInstances": 1,
    "maxInstances": 1,
}


class Race:
    def __init__(self, w: Writers, h: Harness) -> None:
        self.w, self.h = w, h
        settings = Settings(_env_file=None)
        pipeline: Any = None  # container functions render no chart
        self.deps = Deploying(
            h.catalog, pipeline, Quotas.from_settings(settings), Events(), lambda: None
        )

    async def deployed(self, max_instances: int) -> Deployment:
        """A live deployment of `max_instances`, counted in the account's instances."""
        dep = await self.h.deploy([workload()], min_instances=max_instances)
        async with self.h.maker() as session, session.begin():
            await usage.adjust(session, ACCOUNT, max_instances)
        return dep

    async def deployments_of(self, version_id: uuid.UUID) -> list[Deployment]:
        async with self.h.maker() as session:
            stmt = select(Deployment).where(Deployment.version_id == version_id)
            return list((await session.execute(stmt)).scalars())

    async def counted(self) -> int:
        """The instances the account's quota sees deployed."""
        async with self.h.maker() as session:
            return await usage.deployed_instances(session, ACCOUNT)


@pytest.fixture
async def race(database_url: str) -> AsyncIterator[Race]:
    async with writers(database_url) as w:
        yield Race(w, Harness.on(make_sessionmaker(w.engine)))


async def test_a_rescale_that_read_the_deployment_before_its_delete_committed_changes_nothing(
    race: Race,
) -> None:
    dep = await race.deployed(1)
    fid, vid = dep.function_id, dep.version_id
    async with race.h.maker() as deleting:
        await service.delete(deleting, race.deps, PRINCIPAL, fid, vid, graceful=False)

        async def rescale() -> None:
            async with race.h.maker() as session:
                body = {"deploymentSpecifications": [{"maxInstances": 3}]}
                await service.rescale(session, race.deps, PRINCIPAL, fid, vid, body)
                await session.commit()

        rescaling = asyncio.create_task(rescale())
        await race.w.until_waiting()
        await deleting.commit()
    # the owner sees the deployment gone, and the quota counts no instance of it
    with pytest.raises(NotFound):
        await rescaling
    assert await race.counted() == 0


async def test_a_deploy_arriving_while_its_version_is_deleted_finds_no_version(
    race: Race,
) -> None:
    async with race.h.maker() as session, session.begin():
        fid, vid = await add_version(session, image="nvcr.io/acme/echo:1.0")
    async with race.h.maker() as deleting:
        await functions_service.delete_version(deleting, ACCOUNT, fid, vid, events=Events())

        async def deploy() -> None:
            async with race.h.maker() as session:
                body = {"deploymentSpecifications": [H100]}
                await service.deploy(session, race.deps, PRINCIPAL, fid, vid, body)

        deploying = asyncio.create_task(deploy())
        await race.w.until_waiting()
        await deleting.commit()
    with pytest.raises(NotFound):
        await deploying
    assert await race.deployments_of(vid) == []


async def test_a_delete_and_a_reconciler_pass_over_its_deployment_both_complete(
    race: Race,
) -> None:
    # a version whose status the pass changes: it writes the version, under the deployment
    dep = await race.h.deploy([workload()], status="ACTIVE")
    fid, vid = dep.function_id, dep.version_id
    reconciler = race.h.new_reconciler()
    async with race.h.maker() as deleting:
        # the delete's first step: its version, locked
        await repository.lock_version(deleting, ACCOUNT, fid, vid)
        passing = asyncio.create_task(reconciler.run_once())
        await race.w.until_waiting()
        await service.delete(deleting, race.deps, PRINCIPAL, fid, vid, graceful=False)
        await deleting.commit()
    report = await passing
    assert report.errors == 0
    async with race.h.maker() as session:
        assert await repository.live_deployment(session, vid) is None


class Held:
    """The simulated cluster, its first `apply` held until `go` is set: a pass is between the
    transaction that claimed its deployments and the one that writes what it learnt."""

    def __init__(self, inner: SimulatedAdapter) -> None:
        self.name, self.inner = inner.name, inner
        self.applying, self.go = asyncio.Event(), asyncio.Event()

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        self.applying.set()
        await self.go.wait()
        await self.inner.apply(instance, objects)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_spec_change_and_a_reconciler_pass_over_its_deployment_both_complete(
    race: Race,
) -> None:
    dep = await race.h.deploy([workload()], status="ACTIVE")
    async with race.h.maker() as session:
        (spec,) = (await session.get_one(Deployment, dep.id)).specs
    did, sid = str(dep.id), str(spec.id)
    held = Held(race.h.sim())
    reconciler = race.h.new_reconciler(AdapterRegistry({"sim-a": held}))
    passing = asyncio.create_task(reconciler.run_once())
    await held.applying.wait()
    async with race.h.maker() as patching:
        # the change's first step: its deployment and specification, locked
        await repository.live_spec(patching, PRINCIPAL, did, sid)
        held.go.set()
        await race.w.until_waiting()
        await service.patch_spec(patching, race.deps, PRINCIPAL, did, sid, {"maxInstances": 2})
        await patching.commit()
    report = await passing
    assert report.errors == 0
    async with race.h.maker() as session:
        assert (await session.get_one(Deployment, dep.id)).specs[0].max_instances == 2


async def test_a_pass_never_creates_an_instance_for_a_deployment_deleted_after_its_read(
    race: Race, monkeypatch: pytest.MonkeyPatch
) -> None:
    dep = await race.deployed(1)
    reconciler = race.h.new_reconciler()
    # hold the pass between its read of the deployments and its first write
    store, claimed, go = reconciler.store, asyncio.Event(), asyncio.Event()
    read_versions = store.versions

    async def versions(session: Any, deployments: Any) -> Any:
        claimed.set()
        await go.wait()
        return await read_versions(session, deployments)

    monkeypatch.setattr(store, "versions", versions)
    passing = asyncio.create_task(reconciler.run_once())
    await claimed.wait()

    async def delete() -> None:
        async with race.h.maker() as session, session.begin():
            await service.delete(
                session, race.deps, PRINCIPAL, dep.function_id, dep.version_id, graceful=False
            )

    deleting = asyncio.create_task(delete())
    await race.w.until(lambda: _waiting_or_done(race.w, deleting))
    go.set()
    await deleting
    assert (await passing).errors == 0
    # on the timeline, no instance is created after the deployment was deleted
    timeline = [
        "created" if " created for " in e.message else e.kind
        for e in await race.h.events(dep)
        if e.kind in ("instance", "teardown")
    ]
    assert "created" not in timeline[timeline.index("teardown") :], timeline


async def _waiting_or_done(w: Writers, task: asyncio.Task[None]) -> bool:
    return task.done() or await w.waiting() >= 1


async def test_a_suspension_and_a_reconciler_pass_over_its_versions_both_complete(
    race: Race,
) -> None:
    # serving deployments of the account, the suspension visiting a version before one of
    # a smaller id (the reconciler locks versions in id order)
    pair: tuple[uuid.UUID, uuid.UUID] | None = None
    for _ in range(20):  # ids are random: a few deployments, almost always two
        await race.h.deploy([workload()], status="ACTIVE")
        async with race.h.maker() as session:
            # in the order the suspension reads them
            stmt = select(Deployment).where(Deployment.account_id == ACCOUNT)
            rows = [d.version_id for d in (await session.execute(stmt)).scalars()]
        pair = next(((a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if b < a), None)
        if pair is not None:
            break
    assert pair is not None
    before, after = pair
    store = ReconcileStore(race.h.maker, "test", 30)
    async with race.h.maker() as finishing:
        # the reconciler's T3 over two of the deployments has locked the first of their versions
        await store.lock_versions(finishing, [after])

        async def suspend() -> int:
            async with race.h.maker() as session, session.begin():
                return await service.hold_deployments(session, ACCOUNT, True, "suspended")

        suspending = asyncio.create_task(suspend())
        await race.w.until_waiting()
        await store.lock_versions(finishing, [before])
        await finishing.commit()
    assert await suspending == len(rows)
    async with race.h.maker() as session:
        statuses = (await session.execute(select(FunctionVersion.status))).scalars().all()
    assert set(statuses) == {"DEGRADED"}

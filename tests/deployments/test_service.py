"""The deployment use cases against concurrent writers of the same deployment: a change that
read the deployment before another request committed its own acts on the deployment as it is
now (the version is locked before the deployment is read), so the account's instances count
stays what its live deployments add up to."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.auth.service import Principal
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.errors import NotFound
from service.core.events import Events
from service.core.quotas import Quotas
from service.core.settings import Settings
from service.deployments import service, usage
from service.deployments.models import Deployment
from service.deployments.service import Deploying
from tests.support.races import Writers, writers
from tests.support.reconcile import ACCOUNT, FakeClock, Harness, catalog_data, workload

PRINCIPAL = Principal(ACCOUNT, frozenset(), "api-key", "test")


class Race:
    def __init__(self, w: Writers, h: Harness) -> None:
        self.w, self.h = w, h
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
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

    async def counted(self) -> int:
        """The instances the account's quota sees deployed."""
        async with self.h.maker() as session:
            return await usage.deployed_instances(session, ACCOUNT)


@pytest.fixture
async def race(database_url: str) -> AsyncIterator[Race]:
    async with writers(database_url) as w:
        from service.core.db import make_sessionmaker

        catalog = Catalog.from_data(catalog_data())
        clock = FakeClock()
        registry = AdapterRegistry.from_catalog(catalog, clock=clock)
        h = Harness(make_sessionmaker(w.engine), catalog, clock, registry, None)  # type: ignore[arg-type]
        yield Race(w, h)


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

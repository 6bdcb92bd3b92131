"""Deleting a function version against a deploy of it committing meanwhile: the delete waits
for the deploy and tears down the deployment it made, so no live deployment outlives its
version (its instances would run on, and be billed, for a version that no longer exists)."""

from __future__ import annotations

import asyncio
import uuid

from service.core.db import make_sessionmaker
from service.core.events import Events
from service.deployments import repository as deployments_repository
from service.deployments.models import Deployment
from service.deployments.subscribers import subscribe
from service.functions import service
from service.functions.models import FunctionVersion
from tests.support.races import writers
from tests.support.reconcile import ACCOUNT, add_version


async def test_a_version_deleted_while_a_deploy_of_it_commits_takes_its_deployment_down(
    database_url: str,
) -> None:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        events = Events()
        subscribe(events, wake=lambda: None, adds_collector=lambda _: False)
        async with maker() as session, session.begin():
            fid, vid = await add_version(session)
        async with maker() as deploying:
            # the deploy holds the version and has stored its deployment, not yet committed
            await deployments_repository.lock_version(deploying, ACCOUNT, fid, vid)
            did = uuid.uuid4()
            deploying.add(
                Deployment(
                    id=did,
                    account_id=ACCOUNT,
                    function_id=fid,
                    version_id=vid,
                    function_name="fn",
                    desired="deployed",
                    feature_flags={},
                    generation=1,
                )
            )
            await deploying.flush()

            async def delete() -> None:
                async with maker() as session, session.begin():
                    await service.delete_version(session, ACCOUNT, fid, vid, events=events)

            deleting = asyncio.create_task(delete())
            await w.until_waiting()
            await deploying.commit()
        await deleting
        async with maker() as session:
            assert await session.get(FunctionVersion, vid) is None
            assert await deployments_repository.live_deployment(session, vid) is None
            deployment = await session.get(Deployment, did)
            assert deployment is not None and deployment.desired == "deleting"

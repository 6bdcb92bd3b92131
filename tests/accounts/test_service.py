"""A suspension's effect on the account's deployments (service/accounts/service.py): held at
zero instances while suspended, the deployment kept; back to its count on resume."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import select

from service.deployments.models import Deployment, Instance, InstanceDesired
from service.functions.models import FunctionVersion
from service.health.machine import Phase
from tests.support.api import CONTAINER_FN, new_key
from tests.support.app import AppClient, ClientFactory, without_reconciler
from tests.support.assets import as_account
from tests.support.e2e import V, eventually, status, until_status, write_catalog

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {"reconcile_interval": 0.05, "reconcile_resync_seconds": 0.1}
ACCOUNT = "team-d"


async def running_is(client: AppClient, wanted: int) -> bool:
    """Whether `wanted` instances run (and are wanted)."""
    async with client.app.state.sessionmaker() as session:
        rows = (await session.execute(select(Instance))).scalars().all()
    n = sum(1 for r in rows if r.phase == Phase.RUNNING and r.desired == InstanceDesired.PRESENT)
    return n == wanted


async def test_suspension_holds_the_deployments_at_zero_and_resume_restores_them(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(clusters_file=write_catalog(tmp_path), **FAST)
    key = await new_key(
        client, ["register_function", "deploy_function", "list_functions"], account=ACCOUNT
    )
    async with as_account(client, key) as tenant:
        fn = (await tenant.post(f"{V}/functions", json=CONTAINER_FN)).json()["function"]
        url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        resp = await tenant.post(url, json={"deploymentSpecifications": [H100]})
        assert resp.status_code == 200, resp.text
    await eventually(lambda: running_is(client, 1))

    resp = await client.put(f"{V}/accounts/{ACCOUNT}/suspension", json={"reason": "audit"})
    assert resp.status_code == 200, resp.text
    await eventually(lambda: running_is(client, 0))
    async with client.app.state.sessionmaker() as session:
        kept = (await session.execute(select(Deployment))).scalars().all()
    assert [d.account_id for d in kept] == [ACCOUNT]  # the deployment stays

    assert (await client.delete(f"{V}/accounts/{ACCOUNT}/suspension")).status_code == 200
    await eventually(lambda: running_is(client, 1))


async def test_a_held_version_reads_degraded_at_once_and_active_only_once_it_runs(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """The suspension itself says DEGRADED: the version never reads ACTIVE while its held
    instances are retired or replaced (a resume right after a suspension read the stale ACTIVE,
    then DEGRADED, then ACTIVE again)."""
    client = await client_factory(clusters_file=write_catalog(tmp_path), **FAST)
    key = await new_key(
        client, ["register_function", "deploy_function", "list_functions"], account=ACCOUNT
    )
    async with as_account(client, key) as tenant:
        fn = (await tenant.post(f"{V}/functions", json=CONTAINER_FN)).json()["function"]
        url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        resp = await tenant.post(url, json={"deploymentSpecifications": [H100]})
        assert resp.status_code == 200, resp.text
        timeline = f"{V}/deployments/{resp.json()['deployment']['deploymentId']}/events"
        await until_status(tenant, fn, "ACTIVE")
        await without_reconciler(client)  # what the suspension writes, before any pass

        resp = await client.put(f"{V}/accounts/{ACCOUNT}/suspension", json={"reason": "audit"})
        assert resp.status_code == 200, resp.text
        async with client.app.state.sessionmaker() as session:
            version = await session.get(FunctionVersion, uuid.UUID(fn["versionId"]))
            assert version is not None and version.status == "DEGRADED"
        assert (await client.delete(f"{V}/accounts/{ACCOUNT}/suspension")).status_code == 200
        assert await status(tenant, fn) == "DEGRADED"  # until an instance is seen running
        events = [e["message"] for e in (await tenant.get(timeline)).json()["events"]]
        assert "function version status ACTIVE → DEGRADED (account suspended: audit)" in events

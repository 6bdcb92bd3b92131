"""The deployment object read while the reconciler commits (views.py): each of its reads sees
the latest commit, so a version's ERROR must never be shown without the failed instance
that caused it and that instance's kept last lines (what `nvcf deploy --wait` prints)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import utcnow
from service.deployments import views
from service.deployments.models import Instance, InstanceDesired, KeptLog
from service.deployments.repository import instances_of
from service.functions.models import FunctionVersion
from service.health import Phase
from tests.support.api import create_fn
from tests.support.app import ClientFactory
from tests.support.e2e import dep_url, deployment, until_status, write_catalog

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {"reconcile_interval": 0.05, "reconcile_resync_seconds": 0.1}
TRACE = "Traceback (most recent call last):"


async def test_an_error_committed_between_the_views_reads_comes_with_its_kept_lines(
    client_factory: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await client_factory(clusters_file=write_catalog(tmp_path), **FAST)
    fn = await create_fn(client)
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    await until_status(client, fn, "ACTIVE")
    await client.app.state.reconciler.stop()  # the test commits the failure itself
    [running] = (await deployment(client, fn))["instances"]
    instance_id = uuid.UUID(running["instanceId"])

    async def fail() -> None:
        """What the reconciler commits at once: the instance failed, its kept lines, ERROR."""
        async with client.app.state.sessionmaker() as session, session.begin():
            row = await session.get(Instance, instance_id)
            assert row is not None
            row.phase, row.desired = Phase.FAILED.value, InstanceDesired.ABSENT
            row.reason, row.message = "ContainersInRestartLoop", "restarted 3 times"
            version = await session.get(FunctionVersion, uuid.UUID(fn["versionId"]))
            assert version is not None
            version.status = "ERROR"
            session.add(
                KeptLog(
                    instance_id=row.id,
                    deployment_id=row.deployment_id,
                    account_id=row.account_id,
                    captured_at=utcnow(),
                    containers=[{"pod": "p", "container": "c", "previous": True, "lines": [TRACE]}],
                )
            )

    read_instances = instances_of

    async def committed_meanwhile(session: AsyncSession, ids: Any) -> Any:
        found = await read_instances(session, ids)
        await fail()  # between this read of the view and the next ones
        return found

    monkeypatch.setattr(views, "instances_of", committed_meanwhile)
    seen = await deployment(client, fn)
    monkeypatch.undo()
    assert seen["functionStatus"] in ("ACTIVE", "ERROR")
    if seen["functionStatus"] == "ERROR":
        assert any(TRACE in line for h in seen["healthInfo"] for line in h.get("lastLogs") or [])

    after = await deployment(client, fn)
    assert after["functionStatus"] == "ERROR"
    [health] = after["healthInfo"]
    assert health["lastLogs"] == [f"[p/c previous] {TRACE}"]
